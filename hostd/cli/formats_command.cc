// hvtrace formats harvest --kernel K [--initrd I] [--cache DIR] [--timeout 180s]
//                         [--keep-work-dir] [--json]
// hvtrace formats list [--cache DIR] [--json]
//
// Exit status: 0 on success (a cache hit included), 1 when the harvest or the
// cache read failed (the message names the step, with the guest console's
// tail), 2 for a usage error.
#include <chrono>
#include <cstdio>
#include <string>

#include "command.h"
#include "command_table.h"
#include "formats_cache.h"
#include "formats_harvest.h"

namespace hvtrace::cli {
namespace {

using hostd::FormatCache;
using nlohmann::json;

constexpr char kCacheHelp[] =
    "cache root; entries live in DIR/formats/<key>/. Default, as hvtraced finds it: "
    "$HVTRACE_CACHE_DIR, else cache_dir in /etc/hvtrace/hvtraced.conf, else "
    "$XDG_CACHE_HOME/hvtrace, else ~/.cache/hvtrace";

bool ResolveCache(const std::string& command, const std::string& flag_value,
                  std::filesystem::path* root) {
  if (!flag_value.empty()) {
    *root = flag_value;
    return true;
  }
  Result<std::filesystem::path> def = hostd::DefaultCacheRoot();
  if (!def.ok()) {
    std::fprintf(stderr, "hvtrace %s: %s\n", command.c_str(), def.error().message.c_str());
    return false;
  }
  *root = *def;
  return true;
}

// Runs the harvest and prints what it found to |out| (text, or JSON with
// |json_output|); progress and problems go to stderr.
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
  const json& m = r->manifest;
  if (json_output) {
    PrintJson({{"key", r->key},
               {"path", r->entry_dir.string()},
               {"cache_hit", r->cache_hit},
               {"seconds", r->seconds},
               {"manifest", m}});
  } else {
    std::fprintf(out, "key       %s\n", r->key.c_str());
    std::fprintf(out, "release   %s\n", m.value("release", "").c_str());
    std::fprintf(out, "version   %s\n", m.value("proc_version", "").c_str());
    if (r->cache_hit) {
      std::fprintf(out, "status    cached (harvested %s), looked up in %.2f s\n",
                   m.value("harvested_utc", "").c_str(), r->seconds);
    } else {
      const json h = m.value("harvest", json::object());
      std::fprintf(
          out,
          "status    harvested in %.1f s (guest boot %.1f s, collect %.1f s, transfer %.2f s)\n",
          r->seconds, h.value("boot_seconds", 0.0), h.value("collect_seconds", 0.0),
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
    std::fprintf(out, "path      %s\n", r->entry_dir.c_str());
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
  return kExitOk;
}

class HarvestCommand final : public Command {
 public:
  void Define(CLI::App& app) override {
    app.add_option("--kernel", options_.kernel, "the kernel image; its SHA-256 is the cache key")
        ->required()
        ->type_name("VMLINUZ");
    app.add_option("--initrd", options_.initrd,
                   "an initramfs following the hvtrace guest contract (default: the project's own "
                   "harvest initramfs, qemu-scripts/build-guest.sh's)")
        ->type_name("INITRD");
    app.add_option("--cache", cache_, kCacheHelp)->type_name("DIR");
    AddDurationOption(
        app, "--timeout", "", std::chrono::seconds(1), std::chrono::hours(1),
        [this](std::chrono::milliseconds d) { options_.boot_timeout = d; },
        "how long the guest may take to boot (default 180s; a bare number is seconds)");
    app.add_flag("--keep-work-dir", options_.keep_work_dir,
                 "keep the VM's console log, QEMU log and archive");
    app.add_flag("--json", json_, "print {key, path, cache_hit, seconds, manifest} as JSON");
    app.footer(
        "Boots VMLINUZ briefly in a throwaway QEMU guest (TCG) with INITRD, copies out its "
        "tracefs\n"
        "event formats, header_page, header_event, printk_formats, /proc/kallsyms and "
        "/proc/version,\n"
        "checks them, and stores them in the format cache under the SHA-256 of VMLINUZ. A kernel\n"
        "already cached is not booted again.");
  }
  int Run() override {
    if (!ResolveCache(name(), cache_, &options_.cache_root)) return kExitFailed;
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
  hostd::HarvestOptions options_;
  std::string cache_;
  bool json_ = false;
};

class ListCommand final : public Command {
 public:
  void Define(CLI::App& app) override {
    app.add_option("--cache", cache_, kCacheHelp)->type_name("DIR");
    app.add_flag("--json", json_, "print the entries as JSON");
  }
  int Run() override {
    std::filesystem::path root;
    if (!ResolveCache(name(), cache_, &root)) return kExitFailed;
    FormatCache cache(root);
    std::vector<std::string> problems;
    Result<std::vector<hostd::CacheEntrySummary>> entries = cache.List(&problems);
    if (!entries.ok()) {
      std::fprintf(stderr, "hvtrace %s: %s\n", name().c_str(), entries.error().message.c_str());
      return kExitFailed;
    }
    for (const std::string& p : problems)
      std::fprintf(stderr, "hvtrace %s: %s\n", name().c_str(), p.c_str());
    if (json_) {
      json list = json::array();
      for (const hostd::CacheEntrySummary& e : *entries) {
        list.push_back({{"key", e.key},
                        {"release", e.release},
                        {"kernel", e.kernel_path},
                        {"events", e.events},
                        {"harvested_utc", e.harvested_utc}});
      }
      PrintJson({{"cache", cache.formats_dir().string()}, {"kernels", list}});
      return kExitOk;
    }
    if (entries->empty()) {
      std::printf("no cached kernels in %s\n", cache.formats_dir().c_str());
      return kExitOk;
    }
    std::printf("%-24s %-7s %-20s %-16s %s\n", "RELEASE", "EVENTS", "HARVESTED", "KEY", "KERNEL");
    for (const hostd::CacheEntrySummary& e : *entries) {
      std::printf("%-24s %-7llu %-20s %-16.16s %s\n", e.release.c_str(),
                  static_cast<unsigned long long>(e.events), e.harvested_utc.c_str(), e.key.c_str(),
                  e.kernel_path.c_str());
    }
    return kExitOk;
  }

 private:
  std::string cache_;
  bool json_ = false;
};

}  // namespace

int EnsureFormatsCached(const std::string& kernel) {
  auto key = hostd::KernelKeyOfFile(kernel);
  if (!key.ok()) {
    std::fprintf(stderr, "hvtrace boot: %s\n", key.error().message.c_str());
    return kExitFailed;
  }
  auto root = hostd::DefaultCacheRoot();
  if (!root.ok()) return kExitOk;  // No cache dir: nothing to check.
  auto found = FormatCache(*root).Lookup(*key);
  if (found.ok() && found->has_value()) return kExitOk;
  // Never the VM's own initrd: what the harvest guest reports becomes the
  // formats every VM with this kernel decodes with (formats_service.h).
  const std::filesystem::path initrd = hostd::ResolveHarvestInitrd({});
  if (initrd == hostd::kPackagedHarvestInitrd) {
    // The installed daemon harvests the kernel itself, into its own cache,
    // with this same initramfs; one here would fill this user's cache, which
    // that daemon does not read, at the cost of a second TCG boot.
    std::fprintf(stderr,
                 "hvtrace boot: hvtraced harvests the event formats of %s in the background "
                 "(`hvtrace status NAME` shows formats: cached or loaded when done)\n",
                 kernel.c_str());
    return kExitOk;
  }
  if (initrd.empty()) {
    std::fprintf(
        stderr,
        "hvtrace boot: formats for %s are not cached and no harvest initramfs was found; "
        "captures keep region.bin until `hvtrace formats harvest --kernel %s --initrd I`\n",
        kernel.c_str(), kernel.c_str());
    return kExitOk;
  }
  std::fprintf(stderr, "hvtrace boot: harvesting event formats of %s once (boots it briefly)...\n",
               kernel.c_str());
  hostd::HarvestOptions options;
  options.kernel = kernel;
  options.initrd = initrd.string();
  options.cache_root = *root;
  // The summary goes to stderr: stdout is boot's own (its --json too). A
  // failed harvest does not stop the boot: the VM is traced either way, and
  // its captures keep region.bin until the formats are harvested.
  if (Harvest("boot", options, /*json_output=*/false, stderr) != kExitOk) {
    std::fprintf(stderr, "hvtrace boot: booting without cached formats\n");
  }
  return kExitOk;
}

void AddFormatsCommands(CommandTable& table) {
  CLI::App* formats = table.AddGroup(
      "formats", "harvest a kernel's event formats into the cache; list cached kernels");
  table.Add("harvest", "boot a kernel briefly and cache its event formats",
            std::make_unique<HarvestCommand>(), formats);
  table.Add("list", "list the cached kernels", std::make_unique<ListCommand>(), formats);
}

}  // namespace hvtrace::cli
