// hvtrace formats harvest --kernel K [--initrd I] [--cache DIR] [--timeout 180s]
//                         [--keep-work-dir] [--json] [--socket PATH]
// hvtrace formats list [--cache DIR] [--json] [--socket PATH]
//
// One formats cache, the daemon's: when hvtraced answers on its socket these
// commands ask it (formats-list, formats-harvest: requests.h), and it
// harvests with its own initramfs into the cache it decodes with. Without a
// daemon they use the local cache (the rule in formats_cache.h) and say so
// in one line on stderr; --cache DIR always means that directory, locally.
//
// Exit status: 0 on success (a cache hit included), 1 when the harvest or the
// cache read failed (the message names the step, with the guest console's
// tail), 2 for a usage error, 7 when hvtraced refused this user.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "command.h"
#include "command_table.h"
#include "config.h"
#include "control_client.h"
#include "daemon_call.h"
#include "formats_cache.h"
#include "formats_harvest.h"
#include "formats_replies.h"
#include "requests.h"

namespace hvtrace::cli {
namespace {

using hostd::FormatCache;
using nlohmann::json;

constexpr char kCacheHelp[] =
    "a local cache root (entries in DIR/formats/<key>/), not hvtraced's. Default: hvtraced's "
    "cache when hvtraced answers, else $HVTRACE_CACHE_DIR, cache_dir in "
    "/etc/hvtrace/hvtraced.conf, $XDG_CACHE_HOME/hvtrace, ~/.cache/hvtrace";

// Whose cache a formats command uses.
enum class CacheOwner { kDaemon, kLocal, kFailed };

// The daemon's cache when hvtraced answers on |socket_flag|'s socket (and no
// --cache DIR was given); else the local one, in |*root|, with one line on
// stderr saying so. kFailed (|*rc| set) when hvtraced refused this user:
// falling back would fill a cache that daemon never reads.
CacheOwner ChooseCache(const std::string& command, const std::string& cache_flag,
                       const std::string& socket_flag, std::filesystem::path* root, int* rc) {
  if (!cache_flag.empty()) {
    *root = cache_flag;
    return CacheOwner::kLocal;
  }
  const std::filesystem::path socket = hostd::ResolveClientSocket(socket_flag);
  auto client = hostd::ControlClient::Connect(socket, std::chrono::seconds(2));
  if (client.ok()) return CacheOwner::kDaemon;
  if (client.error().message.starts_with("permission denied on ")) {
    std::fprintf(stderr, "hvtrace %s: %s (or pass --cache DIR for a cache of your own)\n",
                 command.c_str(), client.error().message.c_str());
    *rc = kExitDenied;
    return CacheOwner::kFailed;
  }
  Result<std::filesystem::path> def = hostd::DefaultCacheRoot();
  if (!def.ok()) {
    std::fprintf(stderr, "hvtrace %s: %s\n", command.c_str(), def.error().message.c_str());
    *rc = kExitFailed;
    return CacheOwner::kFailed;
  }
  *root = *def;
  std::fprintf(stderr, "hvtrace %s: no hvtraced answers on %s; using the local cache %s\n",
               command.c_str(), socket.c_str(), root->c_str());
  return CacheOwner::kLocal;
}

// A harvest's progress items (ProgressItem) as "hvtrace COMMAND: PREFIXline".
std::function<void(const json&)> ProgressPrinter(std::string command, std::string prefix) {
  return [command = std::move(command), prefix = std::move(prefix)](const json& item) {
    auto progress = hostd::ParseMessage<hostd::ProgressItem>(item, "item");
    if (!progress.ok()) {
      std::fprintf(stderr, "hvtrace %s: %s\n", command.c_str(), progress.error().message.c_str());
      return;
    }
    std::fprintf(stderr, "hvtrace %s: %s%s\n", command.c_str(), prefix.c_str(),
                 progress->progress.c_str());
  };
}

// Prints a harvest's entry to |out| (text, or JSON with |json_output|), the
// local harvest's or hvtraced's; problems go to stderr.
void PrintHarvest(const std::string& command, const hostd::FormatsHarvestReply& r, bool json_output,
                  FILE* out) {
  const json m = r.manifest.is_object() ? r.manifest : json::object();
  const std::string& path = r.path;
  const double seconds = r.seconds;
  if (json_output) {
    PrintJson(hostd::MessageToJson(r));
  } else {
    std::fprintf(out, "key       %s\n", r.key.c_str());
    std::fprintf(out, "release   %s\n", m.value("release", "").c_str());
    std::fprintf(out, "version   %s\n", m.value("proc_version", "").c_str());
    if (r.cache_hit) {
      std::fprintf(out, "status    cached (harvested %s), looked up in %.2f s\n",
                   m.value("harvested_utc", "").c_str(), seconds);
    } else {
      const json h = m.value("harvest", json::object());
      std::fprintf(
          out,
          "status    harvested in %.1f s (guest boot %.1f s, collect %.1f s, transfer %.2f s)\n",
          seconds, h.value("boot_seconds", 0.0), h.value("collect_seconds", 0.0),
          h.value("transfer_seconds", 0.0));
    }
    const size_t rejected = m.contains("rejected_formats") ? m["rejected_formats"].size() : 0;
    const size_t unparsed = m.contains("unparsed_formats") ? m["unparsed_formats"].size() : 0;
    std::fprintf(out, "events    %llu in %llu systems (%zu our parser refuses, %zu rejected)\n",
                 static_cast<unsigned long long>(m.value("events", uint64_t{0})),
                 static_cast<unsigned long long>(m.value("systems", uint64_t{0})), unparsed,
                 rejected);
    std::fprintf(out, "kallsyms  %llu symbols\n",
                 static_cast<unsigned long long>(m.value("kallsyms_symbols", uint64_t{0})));
    std::fprintf(out, "path      %s\n", path.c_str());
  }
  for (const char* list : {"rejected_formats", "unparsed_formats"}) {
    if (!m.contains(list) || !m[list].is_array()) continue;
    for (const auto& why : m[list]) {
      if (!why.is_string()) continue;
      std::fprintf(
          stderr, "hvtrace %s: %s %s\n", command.c_str(),
          list[0] == 'r' ? "rejected" : "kept but does not parse:", why.get<std::string>().c_str());
    }
  }
  if (m.value("kallsyms_nonzero_addresses", uint64_t{0}) == 0) {
    std::fprintf(stderr, "hvtrace %s: warning: kallsyms has no addresses (kptr_restrict)\n",
                 command.c_str());
  }
}

// Runs the harvest into a local cache and prints what it found to |out|
// (text, or JSON with |json_output|); progress and problems go to stderr.
int Harvest(const std::string& command, hostd::HarvestOptions options, bool json_output,
            FILE* out = stdout) {
  options.progress = [&command](std::string_view line) {
    std::fprintf(stderr, "hvtrace %s: %.*s\n", command.c_str(), static_cast<int>(line.size()),
                 line.data());
  };
  Result<hostd::HarvestResult> r = hostd::HarvestFormats(options);
  if (!r.ok()) {
    std::fprintf(stderr, "hvtrace %s: %s\n", command.c_str(), r.error().message.c_str());
    return kExitFailed;
  }
  PrintHarvest(command,
               hostd::HarvestReplyOf(*r, FormatCache(options.cache_root).formats_dir().string()),
               json_output, out);
  return kExitOk;
}

class HarvestCommand final : public Command {
 public:
  void Define(CLI::App& app) override {
    app.add_option("--kernel", options_.kernel, "the kernel image; its SHA-256 is the cache key")
        ->required()
        ->type_name("VMLINUZ");
    app.add_option("--initrd", options_.initrd,
                   "an initramfs following the hvtrace guest contract, for a local cache only "
                   "(default: the project's own harvest initramfs; hvtraced always uses its "
                   "harvest_initrd)")
        ->type_name("INITRD");
    app.add_option("--cache", cache_, kCacheHelp)->type_name("DIR");
    AddDurationOption(
        app, "--timeout", "", std::chrono::seconds(1), std::chrono::hours(1),
        [this](std::chrono::milliseconds d) { timeout_ = d; },
        "how long the guest may take to boot (default 180s; a bare number is seconds)");
    app.add_flag("--keep-work-dir", options_.keep_work_dir,
                 "keep the VM's console log, QEMU log and archive (local cache only)");
    app.add_flag("--json", json_, "print {key, path, cache_hit, seconds, manifest} as JSON");
    app.add_option("--socket", socket_,
                   "hvtraced's control socket (default: $HVTRACE_SOCKET, the config file's "
                   "socket, /run/hvtrace/hvtraced.sock)")
        ->type_name("PATH");
    app.footer(
        "Boots VMLINUZ briefly in a throwaway QEMU guest (TCG) with INITRD, copies out its "
        "tracefs\n"
        "event formats, header_page, header_event, printk_formats, /proc/kallsyms and "
        "/proc/version,\n"
        "checks them, and stores them in the format cache under the SHA-256 of VMLINUZ. A kernel\n"
        "already cached is not booted again. When hvtraced answers, it does the harvest (admin\n"
        "role) into its own cache, with its own initramfs, from VMLINUZ opened as you.");
  }
  // The request hvtraced gets when it answers (no --cache DIR).
  std::optional<DaemonRequest> Request() const override {
    hostd::FormatsHarvestRequest r;
    r.kernel = std::filesystem::absolute(options_.kernel).string();
    if (timeout_) r.timeout_ms = static_cast<uint64_t>(timeout_->count());
    // It may wait for another harvest first, and its guest may boot for the
    // whole timeout and then take the harvest's command timeout.
    return ToDaemonRequest(r,
                           2 * (r.timeout() + options_.command_timeout) + std::chrono::minutes(1));
  }
  int Run() override {
    if (timeout_) options_.boot_timeout = *timeout_;
    int rc = kExitOk;
    const CacheOwner owner = ChooseCache(name(), cache_, socket_, &options_.cache_root, &rc);
    if (owner == CacheOwner::kFailed) return rc;
    if (owner == CacheOwner::kDaemon) return RunInDaemon();
    if (options_.initrd.empty()) {
      options_.initrd = hostd::ResolveHarvestInitrd({}).string();
      if (options_.initrd.empty()) {
        std::fprintf(stderr,
                     "hvtrace %s: no harvest initramfs beside this binary "
                     "(../guest/6.12/initrd.img); pass --initrd\n",
                     name().c_str());
        return kExitUsage;
      }
    }
    return Harvest(name(), options_, json_);
  }

 private:
  int RunInDaemon() {
    if (!options_.initrd.empty() || options_.keep_work_dir) {
      std::fprintf(stderr,
                   "hvtrace %s: hvtraced harvests with its own initramfs (harvest_initrd) and "
                   "keeps no work dir; --initrd and --keep-work-dir need --cache DIR, a cache "
                   "of your own that hvtraced does not read\n",
                   name().c_str());
      return kExitUsage;
    }
    json result;
    hostd::FormatsHarvestReply harvested;
    const int rc = CallDaemon(name(), socket_, *Request(), &result, &harvested,
                              ProgressPrinter(name(), "hvtraced: "));
    if (rc != kExitOk) return rc;
    PrintHarvest(name(), harvested, json_, stdout);
    return kExitOk;
  }

  hostd::HarvestOptions options_;
  // --timeout; without it each side's default (the daemon's is the
  // request's, the local harvest's HarvestOptions').
  std::optional<std::chrono::milliseconds> timeout_;
  std::string cache_;
  std::string socket_;
  bool json_ = false;
};

// One cached kernel as `formats list` prints it.
void PrintListRow(const hostd::FormatsKernelRow& e) {
  std::printf("%-24s %-7llu %-20s %-16.16s %s%s\n", e.release.c_str(),
              static_cast<unsigned long long>(e.events), e.harvested_utc.c_str(), e.key.c_str(),
              e.kernel.c_str(), e.state == "loaded" ? " (loaded)" : "");
}

class FormatsListCommand final : public Command {
 public:
  void Define(CLI::App& app) override {
    app.add_option("--cache", cache_, kCacheHelp)->type_name("DIR");
    app.add_flag("--json", json_, "print the entries as JSON");
    app.add_option("--socket", socket_,
                   "hvtraced's control socket (default: $HVTRACE_SOCKET, the config file's "
                   "socket, /run/hvtrace/hvtraced.sock)")
        ->type_name("PATH");
  }
  std::optional<DaemonRequest> Request() const override {
    return ToDaemonRequest(hostd::FormatsListRequest{});
  }
  int Run() override {
    std::filesystem::path root;
    int rc = kExitOk;
    const CacheOwner owner = ChooseCache(name(), cache_, socket_, &root, &rc);
    if (owner == CacheOwner::kFailed) return rc;
    json result;
    hostd::FormatsListReply listing;
    if (owner == CacheOwner::kDaemon) {
      if (rc = CallDaemon(name(), socket_, *Request(), &result, &listing); rc != kExitOk) return rc;
    } else if (rc = ListLocal(root, &listing); rc != kExitOk) {
      return rc;
    }
    for (const std::string& p : listing.problems) {
      std::fprintf(stderr, "hvtrace %s: %s\n", name().c_str(), p.c_str());
    }
    if (json_) {
      PrintJson(hostd::MessageToJson(listing));
      return kExitOk;
    }
    if (listing.kernels.empty() && listing.harvests.empty()) {
      std::printf("no cached kernels in %s\n", listing.cache.c_str());
      return kExitOk;
    }
    if (owner == CacheOwner::kDaemon) std::printf("hvtraced's cache %s\n", listing.cache.c_str());
    std::printf("%-24s %-7s %-20s %-16s %s\n", "RELEASE", "EVENTS", "HARVESTED", "KEY", "KERNEL");
    for (const hostd::FormatsKernelRow& e : listing.kernels) PrintListRow(e);
    for (const hostd::FormatsHarvestRow& h : listing.harvests) {
      std::printf("%-24s %-7s %-20s %-16.16s %s\n", "-", "-", "-", h.key.c_str(), h.state.c_str());
    }
    return kExitOk;
  }

 private:
  // The local cache at |root|, as hvtraced would list it.
  int ListLocal(const std::filesystem::path& root, hostd::FormatsListReply* listing) const {
    FormatCache cache(root);
    std::vector<std::string> problems;
    Result<std::vector<hostd::CacheEntrySummary>> entries = cache.List(&problems);
    if (!entries.ok()) {
      std::fprintf(stderr, "hvtrace %s: %s\n", name().c_str(), entries.error().message.c_str());
      return kExitFailed;
    }
    listing->cache = cache.formats_dir().string();
    for (const hostd::CacheEntrySummary& e : *entries)
      listing->kernels.push_back(hostd::KernelRowOf(e));
    listing->problems = std::move(problems);
    return kExitOk;
  }

  std::string cache_;
  std::string socket_;
  bool json_ = false;
};

}  // namespace

int EnsureFormatsCached(const std::string& kernel, const std::string& socket_flag) {
  // The daemon's cache is the one its captures decode with: it harvests the
  // kernel (once, with its own initramfs) before the boot, so the first
  // panic decodes by name. A cache hit is a hash.
  hostd::FormatsHarvestRequest harvest;
  harvest.kernel = kernel;
  const DaemonRequest request = ToDaemonRequest(harvest, std::chrono::minutes(10));
  json result;
  hostd::FormatsHarvestReply harvested;
  const int rc =
      CallDaemon("boot", socket_flag, request, &result, &harvested,
                 ProgressPrinter("boot", "formats: "), CallOptions{.print_refusal = false});
  if (rc == kExitNoDaemon) return rc;  // boot would fail the same way.
  // Refused (an observer): the boot request is refused too, and says so for
  // `boot`, the command the user typed.
  if (rc == kExitDenied) return kExitOk;
  if (rc != kExitOk) {
    // A failed harvest does not stop the boot: the VM is traced either
    // way, and its captures keep region.bin until the formats are harvested.
    std::fprintf(stderr, "hvtrace boot: booting without cached formats\n");
    return kExitOk;
  }
  if (!harvested.cache_hit) {
    std::fprintf(stderr, "hvtrace boot: formats of %s harvested into %s\n", kernel.c_str(),
                 harvested.path.c_str());
  }
  return kExitOk;
}

void AddFormatsCommands(CommandTable& table) {
  CLI::App* formats = table.AddGroup(
      "formats", "harvest a kernel's event formats into the cache; list cached kernels");
  table.Add("harvest", "boot a kernel briefly and cache its event formats",
            std::make_unique<HarvestCommand>(), formats);
  table.Add("list", "list the cached kernels", std::make_unique<FormatsListCommand>(), formats);
}

}  // namespace hvtrace::cli
