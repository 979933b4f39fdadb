// hvtrace formats harvest --kernel K --initrd I [--cache DIR] [--timeout SEC]
//                         [--keep-work-dir]
// hvtrace formats list [--cache DIR]
//
// Exit status: 0 on success (a cache hit included), 1 when the harvest or the
// cache read failed (the message names the step, with the guest console's
// tail), 2 for a usage error.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "commands.h"
#include "formats_cache.h"
#include "formats_harvest.h"

namespace hvtrace::cli {
namespace {

using hostd::FormatCache;

void FormatsUsage(FILE* out) {
  std::fprintf(
      out,
      "usage: hvtrace formats harvest --kernel VMLINUZ --initrd INITRD [--cache DIR]\n"
      "                               [--timeout SEC] [--keep-work-dir]\n"
      "       hvtrace formats list [--cache DIR]\n"
      "\n"
      "harvest boots VMLINUZ briefly in a throwaway QEMU guest (TCG) with INITRD (an\n"
      "initramfs following the hvtrace guest contract, e.g. qemu-scripts/build-guest.sh's),\n"
      "copies out its tracefs event formats, header_page, header_event, printk_formats,\n"
      "/proc/kallsyms and /proc/version, checks them, and stores them in the format cache\n"
      "under the SHA-256 of VMLINUZ. A kernel already cached is not booted again.\n"
      "list prints the cached kernels.\n"
      "\n"
      "  --cache DIR       cache root; entries live in DIR/formats/<key>/. Default, as\n"
      "                    hvtraced finds it: $HVTRACE_CACHE_DIR, else cache_dir in\n"
      "                    /etc/hvtrace/hvtraced.conf, else $XDG_CACHE_HOME/hvtrace,\n"
      "                    else ~/.cache/hvtrace\n"
      "  --timeout SEC     how long the guest may take to boot (default 180)\n"
      "  --keep-work-dir   keep the VM's console log, QEMU log and archive\n");
}

// Parses "--flag VALUE" pairs; returns false after printing a usage error.
bool NextValue(int argc, char** argv, int* i, const char* flag, std::string* out) {
  if (*i + 1 >= argc) {
    std::fprintf(stderr, "hvtrace formats: %s needs a value\n", flag);
    return false;
  }
  *out = argv[++*i];
  return true;
}

bool ResolveCache(const std::string& flag_value, std::filesystem::path* root) {
  if (!flag_value.empty()) {
    *root = flag_value;
    return true;
  }
  Result<std::filesystem::path> def = hostd::DefaultCacheRoot();
  if (!def.ok()) {
    std::fprintf(stderr, "hvtrace formats: %s\n", def.error().message.c_str());
    return false;
  }
  *root = *def;
  return true;
}

int Harvest(int argc, char** argv) {
  hostd::HarvestOptions options;
  std::string cache_flag, timeout;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      FormatsUsage(stdout);
      return 0;
    } else if (arg == "--kernel") {
      if (!NextValue(argc, argv, &i, "--kernel", &options.kernel)) return 2;
    } else if (arg == "--initrd") {
      if (!NextValue(argc, argv, &i, "--initrd", &options.initrd)) return 2;
    } else if (arg == "--cache") {
      if (!NextValue(argc, argv, &i, "--cache", &cache_flag)) return 2;
    } else if (arg == "--timeout") {
      if (!NextValue(argc, argv, &i, "--timeout", &timeout)) return 2;
      char* end = nullptr;
      const long sec = std::strtol(timeout.c_str(), &end, 10);
      if (end == timeout.c_str() || *end != '\0' || sec < 1 || sec > 3600) {
        std::fprintf(stderr, "hvtrace formats: --timeout wants 1..3600 seconds, not '%s'\n",
                     timeout.c_str());
        return 2;
      }
      options.boot_timeout = std::chrono::seconds(sec);
    } else if (arg == "--keep-work-dir") {
      options.keep_work_dir = true;
    } else {
      std::fprintf(stderr, "hvtrace formats harvest: unexpected argument '%s'\n", arg.c_str());
      FormatsUsage(stderr);
      return 2;
    }
  }
  if (options.kernel.empty() || options.initrd.empty()) {
    std::fprintf(stderr, "hvtrace formats harvest: --kernel and --initrd are required\n");
    FormatsUsage(stderr);
    return 2;
  }
  if (!ResolveCache(cache_flag, &options.cache_root)) return 2;
  options.progress = [](std::string_view line) {
    std::fprintf(stderr, "hvtrace formats: %.*s\n", static_cast<int>(line.size()), line.data());
  };

  Result<hostd::HarvestResult> r = hostd::HarvestFormats(options);
  if (!r.ok()) {
    std::fprintf(stderr, "hvtrace formats harvest: %s\n", r.error().message.c_str());
    return 1;
  }
  const nlohmann::json& m = r->manifest;
  std::printf("key       %s\n", r->key.c_str());
  std::printf("release   %s\n", m.value("release", "").c_str());
  std::printf("version   %s\n", m.value("proc_version", "").c_str());
  if (r->cache_hit) {
    std::printf("status    cached (harvested %s), looked up in %.2f s\n",
                m.value("harvested_utc", "").c_str(), r->seconds);
  } else {
    std::printf("status    harvested in %.1f s (guest boot %.1f s, collect %.1f s, transfer %.2f s)\n",
                r->seconds, m["harvest"].value("boot_seconds", 0.0),
                m["harvest"].value("collect_seconds", 0.0),
                m["harvest"].value("transfer_seconds", 0.0));
  }
  const size_t rejected = m.contains("rejected_formats") ? m["rejected_formats"].size() : 0;
  const size_t unparsed = m.contains("unparsed_formats") ? m["unparsed_formats"].size() : 0;
  std::printf("events    %llu in %llu systems (%zu our parser refuses, %zu rejected)\n",
              static_cast<unsigned long long>(m.value("events", uint64_t{0})),
              static_cast<unsigned long long>(m.value("systems", uint64_t{0})), unparsed, rejected);
  std::printf("kallsyms  %llu symbols\n",
              static_cast<unsigned long long>(m.value("kallsyms_symbols", uint64_t{0})));
  std::printf("path      %s\n", r->entry_dir.c_str());
  for (const char* list : {"rejected_formats", "unparsed_formats"}) {
    if (!m.contains(list) || !m[list].is_array()) continue;
    for (const auto& why : m[list]) {
      if (!why.is_string()) continue;
      std::fprintf(stderr, "hvtrace formats: %s %s\n",
                   list[0] == 'r' ? "rejected" : "kept but does not parse:",
                   why.get<std::string>().c_str());
    }
  }
  if (m.value("kallsyms_nonzero_addresses", uint64_t{0}) == 0) {
    std::fprintf(stderr, "hvtrace formats: warning: kallsyms has no addresses (kptr_restrict)\n");
  }
  return 0;
}

int List(int argc, char** argv) {
  std::string cache_flag;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      FormatsUsage(stdout);
      return 0;
    } else if (arg == "--cache") {
      if (!NextValue(argc, argv, &i, "--cache", &cache_flag)) return 2;
    } else {
      std::fprintf(stderr, "hvtrace formats list: unexpected argument '%s'\n", arg.c_str());
      return 2;
    }
  }
  std::filesystem::path root;
  if (!ResolveCache(cache_flag, &root)) return 2;
  FormatCache cache(root);
  std::vector<std::string> problems;
  Result<std::vector<hostd::CacheEntrySummary>> entries = cache.List(&problems);
  if (!entries.ok()) {
    std::fprintf(stderr, "hvtrace formats list: %s\n", entries.error().message.c_str());
    return 1;
  }
  for (const std::string& p : problems) std::fprintf(stderr, "hvtrace formats list: %s\n", p.c_str());
  if (entries->empty()) {
    std::printf("no cached kernels in %s\n", cache.formats_dir().c_str());
    return 0;
  }
  std::printf("%-24s %-7s %-20s %-16s %s\n", "RELEASE", "EVENTS", "HARVESTED", "KEY", "KERNEL");
  for (const hostd::CacheEntrySummary& e : *entries) {
    std::printf("%-24s %-7llu %-20s %-16.16s %s\n", e.release.c_str(),
                static_cast<unsigned long long>(e.events), e.harvested_utc.c_str(), e.key.c_str(),
                e.kernel_path.c_str());
  }
  return 0;
}

}  // namespace

int RunFormats(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
    FormatsUsage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "harvest")) return Harvest(argc - 1, argv + 1);
  if (!std::strcmp(argv[1], "list")) return List(argc - 1, argv + 1);
  std::fprintf(stderr, "hvtrace formats: unknown subcommand '%s' (harvest or list)\n", argv[1]);
  return 2;
}

}  // namespace hvtrace::cli
