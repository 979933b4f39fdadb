// hvtrace show CAPTURE [--boot N] [--json | --format text|json] [-o OUT]
// hvtrace show CAPTURE --format perfetto -o FILE [--boot N] [--timeline]
//   CAPTURE: ID or VM/ID (read through hvtraced, capture_fetch.h), or a
//   capture directory (read with this user's own rights)
// hvtrace show --region FILE --formats KEY_OR_DIR [--cpus N] [--boot N] ...
//
// Prints a capture's events with `hvtrace report` (the same text as
// `trace-cmd report` on the capture's trace.dat files), one boot after the
// other, oldest first, each under a header naming VM, trigger and boot.
// --region decodes a raw boot-range file directly through the capture
// pipeline (temporary trace.dat files, removed afterwards); so does a capture
// that holds only region.bin (its kernel's formats were not cached yet).
//
// Exit status as `hvtrace report`: 0 read (problems go to stderr), 1 nothing
// could be read or the output failed, 2 usage.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "boot_file_name.h"
#include "boot_range_decode.h"
#include "capture_fetch.h"
#include "capture_pipeline.h"
#include "capture_store.h"
#include "command.h"
#include "command_table.h"
#include "config.h"
#include "control_client.h"
#include "formats_cache.h"
#include "formats_replies.h"
#include "hvtrace/output.h"
#include "region_issues.h"
#include "requests.h"
#include "show_crash.h"
#include "show_perfetto.h"
#include "show_timeline.h"

namespace hvtrace::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kMaxManifestBytes = 16u << 20;
// A region is what the host reserved; this only stops a wrong file name
// from filling memory.
constexpr uint64_t kMaxRegionBytes = 4ull << 30;

bool Tty() { return ::isatty(STDERR_FILENO) == 1; }

void ClearProgress() {
  if (Tty()) std::fprintf(stderr, "\r\033[K");
}

Result<std::string> ReadSmallFile(const fs::path& path, uint64_t cap) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Error{"cannot open " + path.string() + ": " + std::strerror(errno)};
  std::string text;
  char buf[65536];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      if (n < 0) return Error{"reading " + path.string() + ": " + std::strerror(err)};
      return text;
    }
    if (text.size() + static_cast<size_t>(n) > cap) {
      ::close(fd);
      return Error{path.string() + " is larger than " + std::to_string(cap) + " bytes"};
    }
    text.append(buf, static_cast<size_t>(n));
  }
}

// "region-gen-<n>.trace.dat" (an attach-mode region, region_capture.h) -> 2n;
// "region-gen-<n>-tsc.trace.dat" (its direct-write rings whose TSC stamps
// could not be converted) -> 2n + 1, so it is shown right after.
std::optional<uint64_t> GenerationOfFile(const std::string& name) {
  constexpr std::string_view kPrefix = "region-gen-";
  constexpr std::string_view kTsc = "-tsc.trace.dat";
  if (!name.starts_with(kPrefix)) return std::nullopt;
  std::string rest = name.substr(kPrefix.size());
  const bool tsc = rest.ends_with(kTsc);
  if (tsc) rest = rest.substr(0, rest.size() - kTsc.size()) + ".trace.dat";
  const auto gen = hostd::BootOfFileName("boot-" + rest);
  if (!gen) return std::nullopt;
  return uint64_t{*gen} * 2 + (tsc ? 1 : 0);
}

// The boot files of a directory, by boot number, then the attach region's
// files by boot generation (numbered after the boots). File names come from
// the directory, never from the manifest.
std::vector<std::pair<uint32_t, fs::path>> BootFiles(const fs::path& dir) {
  std::vector<std::pair<uint32_t, fs::path>> files;
  std::vector<std::pair<uint64_t, fs::path>> region;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (auto boot = hostd::BootOfFileName(name)) files.push_back({*boot, it->path()});
    if (auto gen = GenerationOfFile(name)) region.push_back({*gen, it->path()});
  }
  std::sort(files.begin(), files.end());
  std::sort(region.begin(), region.end());
  const uint32_t next = files.empty() ? 0 : files.back().first + 1;
  for (uint32_t i = 0; i < region.size(); ++i) files.push_back({next + i, region[i].second});
  return files;
}

std::string JsonString(const json& doc, const char* key) {
  if (doc.is_object() && doc.contains(key) && doc[key].is_string())
    return doc[key].get<std::string>();
  return "?";
}

// Facts about one boot from the manifest, when it has them.
json ManifestBoot(const json& manifest, uint32_t boot) {
  if (!manifest.is_object() || !manifest.contains("extra") || !manifest["extra"].is_object())
    return {};
  const json& extra = manifest["extra"];
  if (!extra.contains("boots") || !extra["boots"].is_array()) return {};
  for (const json& b : extra["boots"]) {
    if (b.is_object() && b.contains("boot") && b["boot"].is_number_unsigned() &&
        b["boot"].get<uint64_t>() == boot) {
      return b;
    }
  }
  return {};
}

Status WriteAllFd(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error{std::string("writing output: ") + std::strerror(errno)};
    done += static_cast<size_t>(n);
  }
  return {};
}

struct ShowArgs {
  std::string capture;
  std::string socket;  // hvtraced's, for a capture named by ID or VM/ID.
  std::string region;
  std::string formats;
  std::string output;
  int cpus = 0;
  std::optional<uint32_t> boot;
  OutputFormat format = OutputFormat::kText;
  bool trace_cmd_names = false;  // One name per pid, as `trace-cmd report`.
  bool timeline = false;         // Host and guest merged (show_timeline.h).
  bool perfetto = false;         // A Perfetto trace (show_perfetto.h).
  bool log = false;              // The kernel log alone (show_crash.h).
};

// Prints every selected boot file of |dir| under its header, after the
// crash summary (show_crash.h); with --log, the kernel log instead.
int ShowBoots(const ShowArgs& args, const fs::path& dir, const json& manifest, int fd) {
  if (args.log) return ShowKernelLogs(dir, args.boot, fd);
  const auto files = BootFiles(dir);
  if (files.empty()) {
    std::fprintf(stderr,
                 "hvtrace show: %s holds no boot-<n>.trace.dat or region-gen-<n>.trace.dat\n",
                 dir.c_str());
    return 1;
  }
  const std::string vm = JsonString(manifest, "vm");
  const std::string trigger = JsonString(manifest, "trigger");
  const std::string id = manifest.is_object() && manifest.contains("id")
                             ? JsonString(manifest, "id")
                             : dir.filename().string();
  // With --boot, the summary only above the boot that crashed.
  const bool crash_shown =
      !args.boot ||
      (manifest.is_object() && manifest.contains("crash") && manifest["crash"].is_object() &&
       manifest["crash"].contains("boot") && manifest["crash"]["boot"] == *args.boot);
  if (Status s =
          WriteAllFd(fd, !crash_shown                         ? std::string()
                         : args.format == OutputFormat::kText ? CrashSummaryText(manifest)
                                                              : CrashSummaryJsonLine(manifest));
      !s.ok()) {
    std::fprintf(stderr, "hvtrace show: %s\n", s.error().message.c_str());
    return 1;
  }
  bool shown = false;
  uint64_t events = 0;
  size_t problems = 0;
  for (const auto& [boot, path] : files) {
    if (args.boot && *args.boot != boot) continue;
    shown = true;
    const json mb = ManifestBoot(manifest, boot);
    std::string header;
    if (args.format == OutputFormat::kText) {
      header = "# capture " + id + ": vm " + vm + ", trigger " + trigger + "\n# boot " +
               std::to_string(boot) + " of " + std::to_string(files.size()) + " (" +
               path.filename().string() + ")";
      if (mb.is_object() && mb.contains("events") && mb["events"].is_number_unsigned() &&
          mb.contains("first_timestamp_ns") && mb["first_timestamp_ns"].is_number_unsigned() &&
          mb.contains("last_timestamp_ns") && mb["last_timestamp_ns"].is_number_unsigned()) {
        header += ": " + std::to_string(mb["events"].get<uint64_t>()) + " events, " +
                  SecondsText(mb["first_timestamp_ns"].get<uint64_t>()) + " .. " +
                  SecondsText(mb["last_timestamp_ns"].get<uint64_t>()) + " s";
      }
      header += "\n";
    } else {
      json h = {{"capture", id},         {"vm", vm},
                {"trigger", trigger},    {"boot", boot},
                {"boots", files.size()}, {"file", path.filename().string()}};
      if (mb.is_object()) h["summary"] = mb;
      header = h.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    }
    if (Status s = WriteAllFd(fd, header); !s.ok()) {
      std::fprintf(stderr, "hvtrace show: %s\n", s.error().message.c_str());
      return 1;
    }
    if (Tty()) {
      std::error_code ec;
      const auto size = fs::file_size(path, ec);
      std::fprintf(stderr, "\rhvtrace show: decoding %s (%.1f MiB)...", path.filename().c_str(),
                   ec ? 0.0 : static_cast<double>(size) / (1 << 20));
      std::fflush(stderr);
    }
    ReportOptions options;
    options.format = args.format;
    options.time_names = !args.trace_cmd_names;
    Result<ReportStats> stats = WriteReport(path.string(), options, fd);
    ClearProgress();
    if (!stats.ok()) {
      std::fprintf(stderr, "hvtrace show: %s\n", stats.error().message.c_str());
      return 1;
    }
    for (const std::string& issue : stats->issues)
      std::fprintf(stderr, "hvtrace show: %s\n", issue.c_str());
    events += stats->events;
    problems += stats->issues.size();
  }
  if (!shown) {
    std::fprintf(stderr, "hvtrace show: %s has no boot %u (boots 0..%zu)\n", dir.c_str(),
                 *args.boot, files.size() - 1);
    return 1;
  }
  if (problems != 0 && events == 0) return 1;
  return 0;
}

// The formats directory of the hvtraced answering on |socket_flag|'s socket
// (formats-list), or empty when none answers. Quiet: show works offline.
fs::path DaemonFormatsDir(const std::string& socket_flag) {
  auto client = hostd::ControlClient::Connect(hostd::ResolveClientSocket(socket_flag),
                                              std::chrono::seconds(2));
  if (!client.ok()) return {};
  auto reply =
      client->Call(hostd::FormatsListRequest::kCommand,
                   hostd::MessageToJson(hostd::FormatsListRequest{}), std::chrono::seconds(10));
  if (!reply.ok() || !reply->ok) return {};
  auto listing = hostd::ParseMessage<hostd::FormatsListReply>(reply->result, "reply");
  return listing.ok() ? fs::path(listing->cache) : fs::path();
}

// A directory, or a kernel key looked up in the local cache (the rule in
// formats_cache.h), then in the cache of the hvtraced that answers (the one
// `hvtrace formats harvest` fills then) when this user may read it.
Result<hostd::KernelFormats> LoadFormats(const std::string& key_or_dir,
                                         const std::string& socket_flag) {
  std::error_code ec;
  const fs::path p(key_or_dir);
  if (fs::is_directory(p, ec)) {
    const fs::path canonical = fs::weakly_canonical(p, ec);
    if (fs::exists(canonical / "events.json", ec) &&
        hostd::IsValidKernelKey(canonical.filename().string())) {
      hostd::FormatCache cache(canonical.parent_path().parent_path());
      return cache.Load(canonical.filename().string());
    }
    return hostd::KernelFormatsFromDirectory(p);
  }
  if (!hostd::IsValidKernelKey(key_or_dir)) {
    return Error{"--formats '" + key_or_dir +
                 "' is neither a directory nor a kernel key (64 hex digits)"};
  }
  Result<fs::path> root = hostd::DefaultCacheRoot();
  if (root.ok()) {
    hostd::FormatCache cache(*root);
    if (auto found = cache.Lookup(key_or_dir); !found.ok() || found->has_value()) {
      return cache.Load(key_or_dir);
    }
  }
  if (const fs::path daemon_dir = DaemonFormatsDir(socket_flag); !daemon_dir.empty()) {
    hostd::FormatCache daemon_cache(daemon_dir.parent_path());
    Result<std::optional<json>> found = daemon_cache.Lookup(key_or_dir);
    if (!found.ok()) {
      return Error{"hvtraced's cache " + daemon_dir.string() + ": " + found.error().message};
    }
    if (found->has_value()) return daemon_cache.Load(key_or_dir);
    return Error{"kernel " + key_or_dir + " is in neither " +
                 (root.ok() ? root->string() + "/formats" : std::string("a local cache")) +
                 " nor hvtraced's cache " + daemon_dir.string()};
  }
  if (!root.ok()) return root.error();
  return hostd::FormatCache(*root).Load(key_or_dir);
}

// Decodes the raw region file |region| with |formats| into temporary
// trace.dat files (removed afterwards) and shows them under |manifest|'s
// names; |manifest|'s own boot list is replaced by the decode's.
int DecodeRegionAndShow(const ShowArgs& args, const fs::path& region,
                        std::shared_ptr<const hostd::KernelFormats> formats, json manifest,
                        int fd) {
  struct stat st;
  if (::stat(region.c_str(), &st) != 0) {
    std::fprintf(stderr, "hvtrace show: cannot stat region %s: %s\n", region.c_str(),
                 std::strerror(errno));
    return 1;
  }
  if (static_cast<uint64_t>(st.st_size) > kMaxRegionBytes) {
    std::fprintf(stderr, "hvtrace show: region %s is larger than %llu bytes\n", region.c_str(),
                 static_cast<unsigned long long>(kMaxRegionBytes));
    return 1;
  }
  Result<std::vector<std::byte>> copy =
      hostd::CopyRegionFile(region, 0, static_cast<uint64_t>(st.st_size));
  if (!copy.ok()) {
    std::fprintf(stderr, "hvtrace show: %s\n", copy.error().message.c_str());
    return 1;
  }
  const char* tmp_env = std::getenv("TMPDIR");
  std::string templ = std::string(tmp_env && *tmp_env ? tmp_env : "/tmp") + "/hvtrace-show-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) {
    std::fprintf(stderr, "hvtrace show: mkdtemp %s: %s\n", templ.c_str(), std::strerror(errno));
    return 1;
  }
  const fs::path tmp(templ);
  // The daemon's own decode (DecodeBootRange), with what this reader knows:
  // the formats given, no metadata channel, no cache to identify other
  // kernels by their console banner.
  hostd::BootRangeSources sources{.formats = std::move(formats), .cpus = args.cpus};
  if (Tty()) {
    sources.progress = [](const hvtrace::hostd::CaptureProgress& p) {
      std::fprintf(stderr, "\rhvtrace show: %.*s %llu/%llu", static_cast<int>(p.stage.size()),
                   p.stage.data(), static_cast<unsigned long long>(p.done),
                   static_cast<unsigned long long>(p.total));
      std::fflush(stderr);
    };
  }
  hostd::CaptureManifest decoded;
  hostd::DecodeBootRange(*copy, sources, tmp, decoded);
  ClearProgress();
  int rc = 1;
  const json& info = decoded.extra["formats"];
  if (!info.value("decoded", false)) {
    std::fprintf(
        stderr, "hvtrace show: %s: %s\n", region.c_str(),
        info.value("decode_error", decoded.validation.value("error", "not decoded")).c_str());
  } else {
    for (const std::string& line : RegionIssueLines(decoded.validation["issues"]))
      std::fprintf(stderr, "hvtrace show: %s: %s\n", region.c_str(), line.c_str());
    if (const uint64_t unknown = info.value("unknown_id_events", uint64_t{0}); unknown != 0) {
      std::fprintf(stderr,
                   "hvtrace show: %llu events have ids without a format (kept in the region)\n",
                   static_cast<unsigned long long>(unknown));
    }
    if (!manifest.is_object()) manifest = json::object();
    if (!manifest.contains("extra") || !manifest["extra"].is_object())
      manifest["extra"] = json::object();
    manifest["extra"]["boots"] = decoded.extra["boots"];
    if (!decoded.crash.is_null()) manifest["crash"] = decoded.crash;
    rc = args.perfetto ? ShowPerfetto({.dir = tmp,
                                       .manifest = manifest,
                                       .boots = BootFiles(tmp),
                                       .boot = args.boot,
                                       .timeline = false,
                                       .output = args.output})
                       : ShowBoots(args, tmp, manifest, fd);
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);
  return rc;
}

int ShowRegion(const ShowArgs& args, int fd) {
  Result<hostd::KernelFormats> formats = LoadFormats(args.formats, args.socket);
  if (!formats.ok()) {
    std::fprintf(stderr, "hvtrace show: %s\n", formats.error().message.c_str());
    return 1;
  }
  json manifest = {
      {"id", fs::path(args.region).filename().string()}, {"vm", "-"}, {"trigger", "region-file"}};
  return DecodeRegionAndShow(args, args.region,
                             std::make_shared<const hostd::KernelFormats>(std::move(*formats)),
                             std::move(manifest), fd);
}

// A capture without trace.dat files (its kernel's formats were not cached
// when it was taken): decodes its region.bin with --formats or the formats
// key its manifest names, from the cache.
int ShowUndecodedCapture(const ShowArgs& args, const fs::path& dir, const json& manifest, int fd) {
  std::string formats_arg = args.formats;
  if (formats_arg.empty()) {
    if (manifest.contains("kernel") && manifest["kernel"].is_object()) {
      formats_arg = JsonString(manifest["kernel"], "formats_key");
    }
    if (formats_arg.empty() || formats_arg == "?") {
      std::fprintf(stderr,
                   "hvtrace show: %s has no trace.dat and its manifest names no kernel; pass "
                   "--formats KEY_OR_DIR\n",
                   dir.c_str());
      return 1;
    }
  }
  Result<hostd::KernelFormats> formats = LoadFormats(formats_arg, args.socket);
  if (!formats.ok()) {
    std::fprintf(stderr,
                 "hvtrace show: %s holds only region.bin and its kernel's formats are not "
                 "available: %s\n  (run `hvtrace formats harvest --kernel K` for the kernel in "
                 "%s/manifest.json while hvtraced runs, or pass --formats)\n",
                 dir.c_str(), formats.error().message.c_str(), dir.c_str());
    return 1;
  }
  if (Tty()) std::fprintf(stderr, "hvtrace show: decoding %s/region.bin\n", dir.c_str());
  return DecodeRegionAndShow(args, dir / "region.bin",
                             std::make_shared<const hostd::KernelFormats>(std::move(*formats)),
                             manifest, fd);
}

class ShowCommand final : public Command {
 public:
  void Define(CLI::App& app) override {
    auto* capture =
        app.add_option("CAPTURE", args_.capture,
                       "a capture: ID or VM/ID (`hvtrace captures VM`), read through hvtraced "
                       "with the observer role; or a capture directory, read as this user")
            ->type_name("");
    app.add_option("--socket", args_.socket,
                   "hvtraced's control socket, for ID or VM/ID (default: $HVTRACE_SOCKET, the "
                   "config file's socket, /run/hvtrace/hvtraced.sock)")
        ->type_name("PATH");
    app.add_option("--region", args_.region,
                   "decode a raw boot-range file instead (needs --formats)")
        ->type_name("FILE")
        ->excludes(capture);
    app.add_option(
           "--formats", args_.formats,
           "the guest kernel's formats: a cache key (`hvtrace formats list`), a cache entry "
           "directory, or a directory with header_page, header_event and events/")
        ->type_name("KEY_OR_DIR");
    AddCountOption(
        app, "--boot", 0, 999999, [this](uint64_t n) { args_.boot = static_cast<uint32_t>(n); },
        "only boot N (0 = oldest)");
    AddCountOption(
        app, "--cpus", 0, 512, [this](uint64_t n) { args_.cpus = static_cast<int>(n); },
        "the guest's CPU count (--region; default: derived)");
    auto* format =
        app.add_option_function<std::string>(
               "-f,--format",
               [this](const std::string& v) {
                 json_ = v == "json";
                 args_.perfetto = v == "perfetto";
               },
               "output: text (as trace-cmd report prints it, the default), json (one object per "
               "line) or perfetto (a Perfetto trace for ui.perfetto.dev; needs -o FILE)")
            ->type_name("text|json|perfetto")
            ->check([](const std::string& v) {
              return v == "text" || v == "json" || v == "perfetto"
                         ? std::string()
                         : "'" + v + "' is not text, json or perfetto";
            });
    app.add_flag("--json", json_, "the same as --format json")->excludes(format);
    app.add_flag("--trace-cmd-names", args_.trace_cmd_names,
                 "one name per pid, exactly as `trace-cmd report` prints the boot files");
    app.add_flag("--timeline", args_.timeline,
                 "host (QEMU) and guest events of a --trace-boot capture merged on the host "
                 "clock, as `trace-cmd report -i host.dat -i boot-N.host-clock.dat` merges them");
    app.add_flag("--log", args_.log,
                 "print the capture's kernel log alone, as dmesg prints it (boot-N.kernel.log)");
    app.add_option("-o,--output", args_.output, "write to OUT instead of stdout")->type_name("OUT");
    app.footer(
        "Prints the events of a capture, every boot oldest first, as `trace-cmd report` prints "
        "its\n"
        "trace.dat files (text) or as JSON lines. Each boot starts with a header: '# ...' lines "
        "in\n"
        "text, a {\"capture\": ...} object (no \"event\" key) in JSON. A capture whose kernel "
        "log\n"
        "holds a panic, oops or WARNING opens with its crash summary: '# crash ...' lines, or a\n"
        "{\"crash\": ...} object first in JSON. --log prints the kernel log alone, like dmesg.\n"
        "A CAPTURE that is no existing path and reads ID or VM/ID is read through hvtraced:\n"
        "any member of hvtrace or hvtrace-admin may, the state dir's permissions aside. A\n"
        "directory is read with this user's own rights (offline, or a copied capture).\n"
        "--region decodes a raw boot-range file (the guest's persistent ring buffer, Linux 6.12\n"
        "layout) directly. A capture taken before its kernel's formats were cached holds only\n"
        "region.bin: show decodes it with the formats its manifest names (from the cache, see\n"
        "`hvtrace formats`) or with --formats. The boot buffer keeps no saved_cmdlines: each\n"
        "event's task is named as the trace's own sched/task events named it at that time\n"
        "(--trace-cmd-names: trace-cmd's one name per pid instead).\n"
        "--format perfetto -o FILE writes a Perfetto trace instead (open it at ui.perfetto.dev:\n"
        "Open trace file): every boot a sequence on its trace clock, with --timeline the host's\n"
        "QEMU events as a second machine on the host clock (docs/cli.md: the mapping).\n"
        "Exit status as `hvtrace report`: 0 read (problems go to stderr), 1 nothing could be read\n"
        "or the output failed, 2 usage.");
  }
  Status Check() const override {
    if (args_.capture.empty() && args_.region.empty())
      return Error{"give a CAPTURE (ID, VM/ID or a directory) or --region FILE"};
    if (!args_.region.empty() && args_.formats.empty())
      return Error{"--region needs --formats KEY_OR_DIR"};
    if (args_.timeline && (args_.capture.empty() || json_))
      return Error{"--timeline needs a CAPTURE and prints text or perfetto"};
    if (args_.perfetto && (args_.output.empty() || args_.output == "-"))
      return Error{"--format perfetto needs -o FILE"};
    if (args_.log && (args_.timeline || json_ || args_.perfetto))
      return Error{"--log prints text, alone"};
    return {};
  }
  int Run() override {
    args_.format = json_ ? OutputFormat::kJson : OutputFormat::kText;
    return Show(args_);
  }

 private:
  static int Show(const ShowArgs& args);
  ShowArgs args_;
  bool json_ = false;
};

int ShowCommand::Show(const ShowArgs& args) {
  int fd = STDOUT_FILENO;
  // A Perfetto trace is written to FILE.tmp and renamed (show_perfetto.h).
  if (!args.perfetto && !args.output.empty() && args.output != "-") {
    fd = ::open(args.output.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      std::fprintf(stderr, "hvtrace show: cannot open %s: %s\n", args.output.c_str(),
                   std::strerror(errno));
      return 1;
    }
  }
  int rc;
  if (!args.region.empty()) {
    rc = ShowRegion(args, fd);
  } else {
    // Declared before |dir|: the copy outlives every use of it.
    FetchedCapture fetched;
    fs::path dir(args.capture);
    if (IsCaptureReference(args.capture)) {
      if (int fetch_rc = FetchCapture(args.capture, args.socket, &fetched); fetch_rc != kExitOk) {
        if (fd != STDOUT_FILENO) ::close(fd);
        return fetch_rc;
      }
      dir = fetched.dir();
    }
    json manifest = json::object();
    Result<std::string> text = ReadSmallFile(dir / "manifest.json", kMaxManifestBytes);
    if (!text.ok()) {
      std::fprintf(stderr, "hvtrace show: %s%s\n", text.error().message.c_str(),
                   text.error().message.find("Permission denied") != std::string::npos
                       ? CaptureReferenceHint(dir).c_str()
                       : "");
    } else {
      manifest = json::parse(*text, nullptr, /*allow_exceptions=*/false);
      if (manifest.is_discarded() || !manifest.is_object()) {
        std::fprintf(stderr, "hvtrace show: %s/manifest.json is not a JSON object\n", dir.c_str());
        manifest = json::object();
      }
    }
    std::error_code ec;
    if (args.perfetto &&
        (args.timeline || !BootFiles(dir).empty() || !fs::exists(dir / "region.bin", ec))) {
      rc = ShowPerfetto({.dir = dir,
                         .manifest = manifest,
                         .boots = BootFiles(dir),
                         .boot = args.boot,
                         .timeline = args.timeline,
                         .output = args.output});
    } else if (args.timeline) {
      rc = ShowTimeline(dir, manifest, fd);
    } else if (BootFiles(dir).empty() && fs::exists(dir / "region.bin", ec)) {
      rc = ShowUndecodedCapture(args, dir, manifest, fd);
    } else {
      rc = ShowBoots(args, dir, manifest, fd);
    }
    if (manifest.contains("validation") && manifest["validation"].is_object() &&
        manifest["validation"].contains("issues_total") &&
        manifest["validation"]["issues_total"].is_number_unsigned() &&
        manifest["validation"]["issues_total"].get<uint64_t>() != 0) {
      std::fprintf(
          stderr, "hvtrace show: the region had %llu validation issue(s); see %s's manifest.json\n",
          static_cast<unsigned long long>(manifest["validation"]["issues_total"].get<uint64_t>()),
          fetched.name().empty() ? dir.c_str() : fetched.name().c_str());
    }
  }
  if (fd != STDOUT_FILENO && ::close(fd) != 0 && rc == 0) {
    std::fprintf(stderr, "hvtrace show: writing %s: %s\n", args.output.c_str(),
                 std::strerror(errno));
    return 1;
  }
  return rc;
}

}  // namespace

void AddShowCommand(CommandTable& table) {
  table.Add("show", "print a capture's events per boot (or decode a raw region file with --region)",
            std::make_unique<ShowCommand>());
}

}  // namespace hvtrace::cli
