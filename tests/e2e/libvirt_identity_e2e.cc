// Which process is a libvirt domain's QEMU, tried as a local user would
// attack it (issue #11, item 3): before the real domain starts, an ordinary
// user (uid 65534) runs a process whose command line says `-name
// guest=NAME` and names a FIFO as its node-1 memory file. hvtraced used to
// take the first such /proc entry: it opened the FIFO as root (the worker
// blocked for good) and would have chowned an attach region to that user.
// Now the domain's QEMU is the pid libvirtd recorded in its own pid file,
// so the fake is ignored and the real domain is adopted and its panic
// captured, with early-boot events decoded.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "hvtraced_harness.h"
#include "libvirtd_fixture.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

// A process of uid 65534 whose command line claims to be domain |name|'s
// QEMU, with |mem_path| as its ram-node1; killed (its whole process group)
// when the object goes.
class FakeQemu {
 public:
  FakeQemu(const std::string& name, const std::string& mem_path) {
    const std::string object =
        R"({"qom-type":"memory-backend-file","id":"ram-node1","mem-path":")" + mem_path +
        R"(","share":true,"size":1124073472})";
    std::vector<std::string> argv = {
        "setpriv", "--reuid=65534",     "--regid=65534", "--clear-groups", "--",      "sh",
        "-c",      "sleep 600; exit 0", "-name",         "guest=" + name,  "-object", object};
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
  }
  ~FakeQemu() {
    if (pid_ > 0) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  // Its command line: setpriv's until it has exec'd sh.
  std::string Cmdline() const {
    std::string text = ReadWhole("/proc/" + std::to_string(pid_) + "/cmdline");
    for (char& c : text) c = c == '\0' ? ' ' : c;
    return text;
  }

 private:
  pid_t pid_ = -1;
};

TEST(LibvirtIdentityE2e, AFakeProcessNamedLikeTheDomainIsIgnored) {
  if (std::string why = LibvirtdUnavailableReason(); !why.empty()) {
    GTEST_SKIP() << "private libvirtd cannot run here: " << why;
  }
  Result<GuestImage> image = FindGuestImage("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;
  ASSERT_TRUE(RunArgv({BinPath("hvtrace"), "formats", "harvest", "--kernel", image->kernel,
                       "--initrd", image->initrd})
                  .ok());
  Result<std::unique_ptr<PrivateLibvirtd>> libvirtd = PrivateLibvirtd::Start("fakeq");
  ASSERT_TRUE(libvirtd.ok()) << libvirtd.error().message;
  PrivateLibvirtd& lv = **libvirtd;
  HvtracedProcess hvt({.tag = "fakeq", .libvirt_uri = lv.uri()});
  Status started = hvt.Start();
  ASSERT_TRUE(started.ok()) << started.error().message;

  TestDomain domain(lv, "fakeq");
  // The attacker's pieces, made as uid 65534: a FIFO for root to open, and
  // a process that says it is the domain's QEMU, started first so that a
  // scan of /proc in pid order meets it before the real one.
  const std::string fifo = "/tmp/hvt-fakeq-" + std::to_string(::getpid()) + ".fifo";
  ASSERT_EQ(RunArgvStatus({"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
                           "mkfifo", fifo})
                .status,
            0);
  struct RemoveFifo {
    std::string path;
    ~RemoveFifo() { ::unlink(path.c_str()); }
  } remove_fifo{fifo};
  FakeQemu fake(domain.name(), fifo);
  ASSERT_GT(fake.pid(), 0);
  // setpriv's own argv already names the guest: wait for the sh it execs
  // (as uid 65534), not for the name.
  for (int i = 0; i < 250 && fake.Cmdline().rfind("sh -c ", 0) != 0; ++i)
    std::this_thread::sleep_for(20ms);
  ASSERT_THAT(fake.Cmdline(), HasSubstr("-name guest=" + domain.name()));
  struct stat fake_st {};
  ASSERT_EQ(::stat(("/proc/" + std::to_string(fake.pid())).c_str(), &fake_st), 0);
  EXPECT_EQ(fake_st.st_uid, 65534u);

  Result<std::string> xml = RunArgv(
      {BinPath("hvtrace"), "domain-xml", "--name", domain.name(), "--kernel", image->kernel,
       "--initrd", image->initrd, "--memory", "512M", "--range", "16M", "--on-crash", "preserve",
       "--console-socket", domain.console_socket(), "--console-log", domain.console_log()});
  ASSERT_TRUE(xml.ok()) << xml.error().message;
  TestDomainOptions options;
  options.raw_xml = *xml;
  options.via_virsh = true;
  Status created = domain.Create(*image, options);
  ASSERT_TRUE(created.ok()) << created.error().message;
  const std::string pid_file = lv.dir() + "/run/qemu/" + domain.name() + ".pid";
  const pid_t real_pid = std::atoi(ReadWhole(pid_file).c_str());
  std::printf("[identity] fake QEMU pid %d (uid 65534, mem-path %s), libvirt's QEMU pid %d (%s)\n",
              fake.pid(), fifo.c_str(), real_pid, pid_file.c_str());
  ASSERT_GT(real_pid, 0);
  ASSERT_NE(real_pid, fake.pid());

  const auto t0 = std::chrono::steady_clock::now();
  Result<json> adopted = hvt.HvtraceJson({"adopt", domain.name()});
  const double adopt_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(adopted.ok()) << adopted.error().message << "\n" << hvt.LogTail();
  EXPECT_EQ((*adopted)["region"]["kind"], "boot-range");
  const std::string region = (*adopted)["region"]["path"];
  EXPECT_THAT(region, HasSubstr(lv.dir() + "/ram/"));
  EXPECT_THAT(region, Not(HasSubstr(fifo)));
  std::printf("[identity] adopt with the fake running: %.0f ms, region %s\n", adopt_ms,
              region.c_str());
  EXPECT_THAT(fake.Cmdline(), HasSubstr("guest=" + domain.name()));  // Still there, ignored.

  Result<hostd::GuestConsole::CommandResult> marked = domain.console().Run(
      "echo hvt-identity-marker > /sys/kernel/tracing/instances/boot_map/trace_marker",
      kCommandTimeout);
  ASSERT_TRUE(marked.ok() && marked->status == 0);
  ASSERT_TRUE(domain.console().Send("echo c > /proc/sysrq-trigger\n").ok());
  Result<json> captures = hvt.WaitForCaptures(domain.name(), 1, 90s);
  ASSERT_TRUE(captures.ok()) << captures.error().message << "\n" << domain.Diagnostics();
  const std::string path = (*captures)["captures"][0]["path"];
  json manifest = json::parse(ReadWhole(path + "/manifest.json"), nullptr, false);
  ASSERT_TRUE(manifest.is_object()) << path;
  EXPECT_EQ(manifest["trigger"], "panic");
  EXPECT_EQ(manifest["extra"]["formats"]["decoded"], true) << manifest["extra"].dump(2);
  RunResult show = RunArgvStatus({BinPath("hvtrace"), "show", path});
  ASSERT_EQ(show.status, 0) << show.output.substr(0, 4000);
  EXPECT_THAT(show.output, HasSubstr("initcall_start"));
  EXPECT_THAT(show.output, HasSubstr("hvt-identity-marker"));
  std::printf("[identity] panic capture of the real domain: %s events\n",
              manifest["totals"]["events"].dump().c_str());
  EXPECT_THAT(hvt.LogTail(), Not(HasSubstr(fifo)));
}

}  // namespace
}  // namespace hvtrace::e2e
