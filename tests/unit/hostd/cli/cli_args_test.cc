// The hvtrace command table parsed from argv vectors, no daemon: the request
// each command would send, the usage errors for bad input (naming command
// and flag, exit 2), help, --version and the exit-status table.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "boot_request.h"
#include "command_table.h"
#include "daemon_call.h"

namespace hvtrace::cli {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

class CliArgs : public ::testing::Test {
 protected:
  // Parses `hvtrace ARGS...` with a fresh table.
  CommandTable::Parsed Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "hvtrace");
    out_.str("");
    err_.str("");
    table_ = std::make_unique<CommandTable>();
    return table_->Parse(args, out_, err_);
  }
  // The request `hvtrace ARGS...` would send hvtraced.
  DaemonRequest RequestOf(const std::vector<std::string>& args) {
    CommandTable::Parsed p = Parse(args);
    if (p.command == nullptr) {
      ADD_FAILURE() << "parse failed (exit " << p.exit_code << "): " << err_.str();
      return {};
    }
    std::optional<DaemonRequest> r = p.command->Request();
    if (!r) {
      ADD_FAILURE() << "command sends no request";
      return {};
    }
    return *r;
  }
  // Parses and expects a usage error; returns its message.
  std::string UsageError(const std::vector<std::string>& args) {
    CommandTable::Parsed p = Parse(args);
    EXPECT_EQ(p.command, nullptr);
    EXPECT_EQ(p.exit_code, kExitUsage) << err_.str();
    return err_.str();
  }
  std::string HelpOf(const std::vector<std::string>& path) {
    std::ostringstream out;
    CommandTable table;
    EXPECT_TRUE(table.Help(path, out));
    return out.str();
  }

  std::unique_ptr<CommandTable> table_;
  std::ostringstream out_, err_;
};

TEST_F(CliArgs, Version) {
  CommandTable::Parsed p = Parse({"--version"});
  EXPECT_EQ(p.command, nullptr);
  EXPECT_EQ(p.exit_code, kExitOk);
  EXPECT_THAT(out_.str(), StartsWith("hvtrace "));
  EXPECT_GT(out_.str().size(), std::string("hvtrace \n").size());
}

TEST_F(CliArgs, NoCommandPrintsTheListAsAUsageError) {
  CommandTable::Parsed p = Parse({});
  EXPECT_EQ(p.exit_code, kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("attach"));
  EXPECT_THAT(err_.str(), HasSubstr("Exit status"));
}

TEST_F(CliArgs, HelpListsVisibleCommandsAndTheExitStatusTable) {
  const std::string help = HelpOf({});
  for (const char* command : {"report", "show", "ping", "list", "status", "captures", "boot",
                              "qemu-args", "adopt", "capture", "attach", "detach", "stream", "stop",
                              "daemon-shutdown", "domain-xml", "setup", "formats", "help"}) {
    EXPECT_THAT(help, HasSubstr(std::string("  ") + command + " ")) << command;
  }
  EXPECT_THAT(help, Not(HasSubstr("libvirt-attach")));
  EXPECT_THAT(help, HasSubstr(ExitStatusHelp()));
  EXPECT_THAT(help, HasSubstr("--version"));
}

TEST_F(CliArgs, HelpPerCommand) {
  const std::string attach = HelpOf({"attach"});
  EXPECT_THAT(attach, HasSubstr("Usage: hvtrace attach"));
  for (const char* flag :
       {"--size", "--events", "--pump", "--wait", "--qmp", "--socket", "--json"}) {
    EXPECT_THAT(attach, HasSubstr(flag)) << flag;
  }
  EXPECT_THAT(attach, Not(HasSubstr("--wait-ms")));  // Hidden old spelling.
  EXPECT_THAT(HelpOf({"formats"}), HasSubstr("harvest"));
  EXPECT_THAT(HelpOf({"formats", "harvest"}), HasSubstr("Usage: hvtrace formats harvest"));
  CommandTable table;
  std::ostringstream ignored;
  EXPECT_FALSE(table.Help({"nope"}, ignored));
}

TEST_F(CliArgs, HelpCommandAndDashDashHelp) {
  CommandTable::Parsed p = Parse({"help", "detach"});
  ASSERT_NE(p.command, nullptr) << err_.str();
  testing::internal::CaptureStdout();
  EXPECT_EQ(p.command->Run(), kExitOk);
  EXPECT_THAT(testing::internal::GetCapturedStdout(), HasSubstr("Usage: hvtrace detach"));

  p = Parse({"show", "--help"});
  EXPECT_EQ(p.command, nullptr);
  EXPECT_EQ(p.exit_code, kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("Usage: hvtrace show"));
  EXPECT_THAT(out_.str(), HasSubstr("--region"));

  p = Parse({"formats", "list", "-h"});
  EXPECT_EQ(p.exit_code, kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("--cache"));

  EXPECT_THAT(UsageError({"help", "nope"}), HasSubstr("no command 'nope'"));
}

TEST_F(CliArgs, UnknownCommandAndFlagNameTheCommand) {
  EXPECT_THAT(UsageError({"bogus"}), HasSubstr("hvtrace: unknown command 'bogus'"));
  EXPECT_THAT(UsageError({"status", "vm", "--bogus"}),
              StartsWith("hvtrace status: unknown flag '--bogus'"));
  EXPECT_THAT(UsageError({"formats", "harvest", "--kernel", "k", "--initrd", "i", "--nope"}),
              StartsWith("hvtrace formats harvest: unknown flag '--nope'"));
  EXPECT_THAT(UsageError({"status", "vm", "extra"}),
              StartsWith("hvtrace status: unexpected argument(s): 'extra'"));
  EXPECT_THAT(UsageError({"status"}), StartsWith("hvtrace status: NAME is required"));
  EXPECT_THAT(UsageError({"status", "bad/name"}), StartsWith("hvtrace status: NAME:"));
  EXPECT_THAT(UsageError({"--bogus"}), StartsWith("hvtrace: "));
}

TEST_F(CliArgs, DaemonQueries) {
  DaemonRequest r = RequestOf({"ping"});
  EXPECT_EQ(r.cmd, "ping");
  EXPECT_EQ(r.args, json::object());
  EXPECT_EQ(RequestOf({"list", "--json"}).cmd, "list");
  r = RequestOf({"status", "web1", "--socket", "/tmp/s.sock", "--json"});
  EXPECT_EQ(r.cmd, "status");
  EXPECT_EQ(r.args, (json{{"name", "web1"}}));
  EXPECT_EQ(RequestOf({"captures", "--socket=/tmp/s", "web1"}).args, (json{{"name", "web1"}}));
  EXPECT_EQ(RequestOf({"daemon-shutdown"}).cmd, "shutdown");
  r = RequestOf({"capture", "web1"});
  EXPECT_EQ(r.cmd, "capture");
  EXPECT_EQ(r.args, (json{{"name", "web1"}}));
  EXPECT_EQ(RequestOf({"stop", "web1", "--json"}).cmd, "stop");
}

TEST_F(CliArgs, Boot) {
  DaemonRequest r = RequestOf({"boot", "web1", "--kernel", "/k/vmlinuz", "--initrd=/k/initrd.img",
                               "--cpus", "4", "--memory", "1G", "--trace-size", "16", "--events",
                               "sched", "--accel", "tcg", "--append", "quiet", "--no-harvest"});
  EXPECT_EQ(r.cmd, "boot");
  // What the daemon parses (one mapping, requests_test.cc checks it).
  auto boot = hostd::ParseMessage<hostd::BootRequest>(r.args);
  ASSERT_TRUE(boot.ok()) << boot.error().message;
  EXPECT_EQ(boot->name, "web1");
  EXPECT_EQ(boot->kernel, "/k/vmlinuz");
  EXPECT_EQ(boot->initrd, "/k/initrd.img");
  EXPECT_EQ(boot->cpus, 4);
  EXPECT_EQ(boot->memory_mib, 1024u);
  EXPECT_EQ(boot->trace_size_mib, 16u);
  EXPECT_EQ(boot->events, "sched");
  EXPECT_EQ(boot->accel, "tcg");
  EXPECT_EQ(boot->append, "quiet");
  // A value that is the default is left to the daemon's struct.
  EXPECT_FALSE(r.args.contains("trace_size_mib"));
  EXPECT_EQ(r.timeout, std::chrono::seconds(60));

  // Bare numbers keep their MiB; suffixes and --flag=value work too.
  EXPECT_EQ(RequestOf({"boot", "w", "--kernel", "/k", "--memory", "2048"}).args["memory_mib"],
            2048);
  EXPECT_EQ(RequestOf({"boot", "w", "--kernel", "/k", "--memory=2048M"}).args["memory_mib"], 2048);
  EXPECT_EQ(RequestOf({"boot", "w", "--kernel", "/k", "--trace-size=32MiB"}).args["trace_size_mib"],
            32);
  // The daemon resolves paths in its own directory: the CLI sends absolute ones.
  EXPECT_EQ(RequestOf({"boot", "w", "--kernel", "vmlinuz"}).args["kernel"],
            (std::filesystem::current_path() / "vmlinuz").string());
}

TEST_F(CliArgs, BootTraceBootAndDevices) {
  EXPECT_FALSE(RequestOf({"boot", "w", "--kernel", "/k"}).args.contains("trace_boot"));
  DaemonRequest r = RequestOf({"boot", "w", "--kernel", "/k", "--trace-boot", "--device",
                               "virtio-blk", "--device", "virtio-net", "--device=virtio-serial"});
  EXPECT_EQ(r.args["trace_boot"], true);
  EXPECT_EQ(r.args["devices"], (json{"virtio-blk", "virtio-net", "virtio-serial"}));
  EXPECT_THAT(UsageError({"boot", "w", "--kernel", "/k", "--device", "e1000"}),
              HasSubstr("device 'e1000' is not one of virtio-blk, virtio-net, virtio-serial"));
  EXPECT_THAT(UsageError({"boot", "w", "--kernel", "/k", "--device", "virtio-blk", "--device",
                          "virtio-blk"}),
              HasSubstr("given twice"));
}

TEST_F(CliArgs, BootBadInput) {
  EXPECT_THAT(UsageError({"boot", "w", "--kernel", "/k", "--cpus", "abc"}),
              StartsWith("hvtrace boot: --cpus: 'abc' is not a number"));
  EXPECT_THAT(UsageError({"boot", "w", "--kernel", "/k", "--cpus", "-1"}), HasSubstr("--cpus"));
  std::string e = UsageError({"boot", "w", "--kernel", "/k", "--memory", "10X"});
  EXPECT_THAT(e, StartsWith("hvtrace boot: --memory: "));
  EXPECT_THAT(e, HasSubstr("unknown unit"));
  EXPECT_THAT(UsageError({"boot", "w", "--kernel", "/k", "--memory", "1500K"}),
              HasSubstr("whole number of 1M"));
  EXPECT_THAT(UsageError({"boot", "w", "--kernel", "/k", "--cpus", "99"}),
              StartsWith("hvtrace boot: args.cpus = 99 is outside 1..64"));
  EXPECT_THAT(UsageError({"boot", "w", "--kernel", "/k", "--accel", "fast"}), HasSubstr("--accel"));
  EXPECT_THAT(UsageError({"boot", "w"}), HasSubstr("--kernel is required"));
  EXPECT_THAT(UsageError({"boot", "w", "--kernel"}), StartsWith("hvtrace boot: "));
  EXPECT_THAT(UsageError({"boot", "-w", "--kernel", "/k"}), StartsWith("hvtrace boot: "));
  EXPECT_THAT(UsageError({"qemu-args", "w", "--kernel", "/k", "--trace-size", "0"}),
              StartsWith("hvtrace qemu-args: args.trace_size_mib = 0"));
}

TEST_F(CliArgs, Adopt) {
  DaemonRequest r = RequestOf(
      {"adopt", "vm1", "--qmp", "/run/vm1.qmp", "--boot-region", "/dev/shm/f@0x1000:16M"});
  EXPECT_EQ(r.cmd, "adopt");
  EXPECT_EQ(
      r.args,
      (json{{"name", "vm1"}, {"qmp", "/run/vm1.qmp"}, {"boot_region", "/dev/shm/f@0x1000:16M"}}));
  EXPECT_EQ(RequestOf({"adopt", "web1"}).args, (json{{"name", "web1"}}));
  EXPECT_EQ(RequestOf({"adopt", "web1", "--domain", "1b4e28ba-2fa1-11d2-883f-0016d3cca427"}).args,
            (json{{"name", "web1"}, {"domain", "1b4e28ba-2fa1-11d2-883f-0016d3cca427"}}));
  EXPECT_THAT(UsageError({"adopt", "vm1", "--qmp", "/q", "--domain", "d"}),
              StartsWith("hvtrace adopt: "));
  EXPECT_THAT(UsageError({"adopt", "vm1", "--boot-region", "f@0:16M"}), HasSubstr("--qmp"));
}

TEST_F(CliArgs, Attach) {
  DaemonRequest r = RequestOf({"attach", "vm1"});
  EXPECT_EQ(r.cmd, "attach");
  EXPECT_EQ(r.args, (json{{"name", "vm1"}}));  // hvtraced's defaults apply.
  EXPECT_EQ(r.timeout, std::chrono::seconds(60));

  r = RequestOf({"attach", "vm1", "--qmp", "/run/x.qmp", "--size", "4M", "--events",
                 "sched:*,irq:*", "--pump", "20ms", "--wait", "60s"});
  EXPECT_EQ(r.args, (json{{"name", "vm1"},
                          {"qmp", "/run/x.qmp"},
                          {"size_mib", 4},
                          {"events", "sched:*,irq:*"},
                          {"pump_interval_ms", 20},
                          {"wait_ms", 60000}}));
  EXPECT_EQ(r.timeout, std::chrono::seconds(90));
  // The old spellings: milliseconds.
  r = RequestOf({"attach", "vm1", "--pump-ms", "20", "--wait-ms=60000", "--size=1G"});
  EXPECT_EQ(r.args["pump_interval_ms"], 20);
  EXPECT_EQ(r.args["wait_ms"], 60000);
  EXPECT_EQ(r.args["size_mib"], 1024);
  // 16 MiB is the default: not sent.
  EXPECT_FALSE(RequestOf({"attach", "vm1", "--size", "16"}).args.contains("size_mib"));
  EXPECT_EQ(RequestOf({"attach", "vm1", "--wait", "5"}).args["wait_ms"], 5000);  // Bare: seconds.
  EXPECT_EQ(RequestOf({"attach", "vm1", "--wait-ms", "0"}).args["wait_ms"], 0);
  // The last of a repeated flag counts.
  EXPECT_EQ(RequestOf({"attach", "vm1", "--size", "4M", "--size", "8M"}).args["size_mib"], 8);

  EXPECT_THAT(UsageError({"attach", "vm1", "--size", "3X"}),
              StartsWith("hvtrace attach: --size: "));
  EXPECT_THAT(UsageError({"attach", "vm1", "--size", "512K"}), HasSubstr("whole number"));
  EXPECT_THAT(UsageError({"attach", "vm1", "--wait-ms", "-1"}),
              StartsWith("hvtrace attach: --wait-ms: "));
  EXPECT_THAT(UsageError({"attach", "vm1", "--pump", "0ms"}),
              StartsWith("hvtrace attach: --pump: "));
  EXPECT_THAT(UsageError({"attach", "vm1", "--wait", "1h"}), HasSubstr("outside"));
}

TEST_F(CliArgs, Setup) {
  DaemonRequest r =
      RequestOf({"setup", "web1", "--range", "32M", "--events", "sched", "--dry-run"});
  EXPECT_EQ(r.cmd, "setup");
  EXPECT_EQ(
      r.args,
      (json{{"domain", "web1"}, {"dry_run", true}, {"range", 32u << 20}, {"events", "sched"}}));
  EXPECT_EQ(RequestOf({"setup", "web1", "--undo"}).args,
            (json{{"domain", "web1"}, {"undo", true}}));
  EXPECT_THAT(UsageError({"setup"}), HasSubstr("DOMAIN"));
  EXPECT_THAT(UsageError({"setup", "web1", "--range", "1000"}), HasSubstr("--range"));
}

TEST_F(CliArgs, DetachAndStream) {
  DaemonRequest r = RequestOf({"detach", "vm1"});
  EXPECT_EQ(r.cmd, "detach");
  EXPECT_EQ(r.args, (json{{"name", "vm1"}}));
  EXPECT_EQ(r.timeout, std::chrono::seconds(25));
  for (auto flags : std::vector<std::vector<std::string>>{{"--timeout", "5s"},
                                                          {"--timeout", "5"},
                                                          {"--timeout-ms", "5000"},
                                                          {"--timeout=5000ms"}}) {
    std::vector<std::string> args = {"detach", "vm1"};
    args.insert(args.end(), flags.begin(), flags.end());
    r = RequestOf(args);
    EXPECT_EQ(r.args["timeout_ms"], 5000) << flags[0];
    EXPECT_EQ(r.timeout, std::chrono::seconds(20)) << flags[0];
  }
  EXPECT_THAT(UsageError({"detach", "vm1", "--timeout-ms", "ten"}),
              StartsWith("hvtrace detach: --timeout-ms: "));

  r = RequestOf({"stream", "vm1"});
  EXPECT_EQ(r.cmd, "stream");
  EXPECT_EQ(r.args, (json{{"name", "vm1"}}));
  EXPECT_EQ(RequestOf({"stream", "vm1", "--json"}).args["format"], "json");
  EXPECT_EQ(RequestOf({"stream", "vm1", "--format", "json"}).args["format"], "json");
  EXPECT_EQ(RequestOf({"stream", "vm1", "--format=text", "--from-start"}).args,
            (json{{"name", "vm1"}, {"from", "start"}}));
  EXPECT_THAT(UsageError({"stream", "vm1", "--format", "xml"}),
              StartsWith("hvtrace stream: --format"));
  EXPECT_THAT(UsageError({"stream", "vm1", "--json", "--format", "text"}),
              StartsWith("hvtrace stream: "));
}

TEST_F(CliArgs, LibvirtAttachAndDetachAreHiddenNamesForTheDaemonsAttach) {
  DaemonRequest r =
      RequestOf({"libvirt-attach", "dom1", "--shm", "hvt-dom1", "--size", "4M", "--uri",
                 "qemu:///system", "--replace-stale", "--timeout-ms", "10000"});
  EXPECT_EQ(r.cmd, "attach");
  EXPECT_EQ(r.args, (json{{"name", "dom1"}, {"size_mib", 4}, {"wait_ms", 10000}}));
  r = RequestOf({"libvirt-detach", "dom1", "--shm", "hvt-dom1", "--timeout-ms", "3000"});
  EXPECT_EQ(r.cmd, "detach");
  EXPECT_EQ(r.args, (json{{"name", "dom1"}, {"timeout_ms", 3000}}));
  // The new commands do not take the old libvirt flags.
  EXPECT_THAT(UsageError({"attach", "dom1", "--shm", "x"}), HasSubstr("unknown flag '--shm'"));
}

TEST_F(CliArgs, LocalCommandsSendNothing) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"report", "f.dat", "--json", "-o", "out.txt", "--strict"},
           {"report", "f.dat", "--format=json", "--no-fast-paths"},
           {"show", "capture-dir", "--boot", "1", "--format", "text"},
           {"show", "--region", "region.bin", "--formats", "key", "--cpus", "2"},
           {"qemu-args", "vm1", "--kernel", "/k", "--run-dir", "/tmp/r", "--json"},
           {"domain-xml", "--params", "--memory", "512M", "--range", "16M"}}) {
    CommandTable::Parsed p = Parse(args);
    ASSERT_NE(p.command, nullptr) << args[0] << ": " << err_.str();
    EXPECT_FALSE(p.command->Request().has_value()) << args[0];
  }
}

// `formats` asks hvtraced when it answers (the one formats cache): the
// request names the kernel by absolute path (the CLI passes it opened) and
// never an initrd; the reply may wait for a queued harvest and a whole boot.
TEST_F(CliArgs, FormatsCommandsAskTheDaemon) {
  EXPECT_EQ(RequestOf({"formats", "list", "--json"}).cmd, "formats-list");
  DaemonRequest h = RequestOf({"formats", "harvest", "--kernel", "k", "--timeout", "30"});
  EXPECT_EQ(h.cmd, "formats-harvest");
  EXPECT_EQ(h.args["kernel"], (std::filesystem::current_path() / "k").string());
  EXPECT_EQ(h.args["timeout_ms"], 30000);
  EXPECT_FALSE(h.args.contains("initrd"));
  EXPECT_GE(h.timeout, milliseconds(2 * 30000));
  // --initrd is a local harvest's: it is not sent even when given.
  DaemonRequest with_initrd =
      RequestOf({"formats", "harvest", "--kernel", "/k", "--initrd", "i", "--socket", "/s"});
  EXPECT_FALSE(with_initrd.args.contains("initrd"));
  EXPECT_EQ(with_initrd.args["kernel"], "/k");
}

TEST_F(CliArgs, LocalCommandsBadInput) {
  EXPECT_THAT(UsageError({"report"}), StartsWith("hvtrace report: FILE is required"));
  EXPECT_THAT(UsageError({"report", "a.dat", "b.dat"}),
              StartsWith("hvtrace report: unexpected argument(s)"));
  EXPECT_THAT(UsageError({"report", "a.dat", "--format", "xml"}),
              StartsWith("hvtrace report: --format"));
  EXPECT_THAT(UsageError({"show"}),
              HasSubstr("give a CAPTURE (ID, VM/ID or a directory) or --region FILE"));
  EXPECT_THAT(UsageError({"show", "--region", "r.bin"}), HasSubstr("--region needs --formats"));
  EXPECT_THAT(UsageError({"show", "dir", "--region", "r.bin", "--formats", "k"}),
              StartsWith("hvtrace show: "));
  EXPECT_THAT(UsageError({"show", "dir", "--boot", "x"}),
              StartsWith("hvtrace show: --boot: 'x' is not a number"));
  EXPECT_THAT(UsageError({"formats"}),
              StartsWith("hvtrace formats: a subcommand is required: harvest, list"));
  EXPECT_THAT(UsageError({"formats", "harvest", "--initrd", "i"}),
              HasSubstr("--kernel is required"));
  EXPECT_THAT(
      UsageError({"formats", "harvest", "--kernel", "k", "--initrd", "i", "--timeout", "0"}),
      StartsWith("hvtrace formats harvest: --timeout: "));
  EXPECT_THAT(UsageError({"domain-xml", "--cpus", "two"}),
              StartsWith("hvtrace domain-xml: --cpus: "));
  EXPECT_THAT(UsageError({"domain-xml", "--params", "--numa"}), StartsWith("hvtrace domain-xml: "));
  EXPECT_THAT(UsageError({"domain-xml", "--name", "x"}), HasSubstr("--kernel is required"));
  EXPECT_THAT(UsageError({"domain-xml", "--range", "16Q"}),
              StartsWith("hvtrace domain-xml: --range: "));
}

TEST(CliExitCodes, FollowTheDaemonsErrorCodes) {
  EXPECT_EQ(ExitCodeForDaemonError("bad_request"), kExitUsage);
  EXPECT_EQ(ExitCodeForDaemonError("unknown_vm"), kExitUnknownVm);
  EXPECT_EQ(ExitCodeForDaemonError("busy"), kExitBusy);
  EXPECT_EQ(ExitCodeForDaemonError("permission_denied"), kExitDenied);
  for (const char* failed :
       {"vm_failed", "internal", "too_large", "unknown_command", "", "new_code"}) {
    EXPECT_EQ(ExitCodeForDaemonError(failed), kExitFailed) << failed;
  }
}

TEST(CliExitCodes, NoDaemonIsFive) {
  const std::string socket = ::testing::TempDir() + "/no-hvtraced-here.sock";
  testing::internal::CaptureStderr();
  json result;
  const int rc = CallDaemon(
      "status", socket, DaemonRequest{"status", {{"name", "vm1"}}, milliseconds(1000)}, &result);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, kExitNoDaemon);
  EXPECT_THAT(err, StartsWith("hvtrace status: "));
  EXPECT_THAT(err, HasSubstr(socket));
}

}  // namespace
}  // namespace hvtrace::cli
