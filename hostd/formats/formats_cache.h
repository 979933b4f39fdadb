// FormatCache: per-kernel-build tracefs formats, harvested once (see
// formats_harvest.h) and read by the daemon and the boot-buffer decoder.
//
// Cache key: the lowercase hex SHA-256 of the kernel image file (vmlinuz) as
// the host has it. Event ids of built-in events are assigned at boot in link
// order, so every boot of one build gets the same ids; the image hash names
// the build exactly and is computed on the host before anything boots. The
// release (uname -r) alone is not enough (rebuilds keep it), so it and
// /proc/version are only recorded in the manifest.
//
//   <root>/formats/<key>/manifest.json    identity, counts, harvest timings
//   <root>/formats/<key>/events.json      {"events": [{"system", "name", "id",
//                                          "format", ["parse_error"]}, ...]}
//   <root>/formats/<key>/header_page
//   <root>/formats/<key>/header_event
//   <root>/formats/<key>/printk_formats
//   <root>/formats/<key>/kallsyms
//   <root>/formats/.tmp-<key>-<pid>-<n>/  an entry being written
//
// The ~1500 formats of a distribution kernel go into one JSON file rather
// than a tracefs-like tree: on this machine's disk creating (and removing)
// 3000 small files and directories took 4-8 s, one file takes milliseconds,
// and readers load it with one read.
//
// Trust: an entry is read only when it, its files and every directory above
// them are root's (or this process's user's) and writable by nobody else, no
// symlink on the way (private_path.h); directories are created 0700. A
// user's own cache (the CLI's ~/.cache/hvtrace) is theirs, and hvtraced never
// reads another user's. Formats a guest agent publishes are checked against
// their fingerprints and stay in that VM's captures; only a harvest with the
// project's own initramfs writes here.
//
// <root> follows one rule for hvtrace and hvtraced (ResolveCacheRoot), so an
// entry the CLI harvested is the one the daemon decodes with. An entry
// appears whole or not at all (written under a temporary name, fsynced,
// renamed).
#ifndef HVTRACE_HOSTD_FORMATS_CACHE_H_
#define HVTRACE_HOSTD_FORMATS_CACHE_H_

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats_bundle.h"
#include "hvtrace/result.h"
#include "kernel_symbols.h"

namespace hvtrace::hostd {

// True for 64 lowercase hex digits.
bool IsValidKernelKey(std::string_view key);

// The cache key of the kernel image at |vmlinuz_path|.
Result<std::string> KernelKeyOfFile(const std::string& vmlinuz_path);

// Where the formats cache lives, first match wins:
//   1. |flag|             (hvtrace --cache DIR)
//   2. |env_cache_dir|    ($HVTRACE_CACHE_DIR)
//   3. |config_cache_dir| (cache_dir in hvtraced.conf: the daemon's --config,
//                          the CLI's /etc/hvtrace/hvtraced.conf)
//   4. |xdg_cache_home|/hvtrace   ($XDG_CACHE_HOME, if absolute)
//   5. |home|/.cache/hvtrace      ($HOME, else the user's passwd entry, so
//                                  root under systemd gets /root/.cache/hvtrace)
// Empty strings count as unset. An error only when nothing is set.
struct CacheRootSources {
  std::string flag;
  std::string env_cache_dir;
  std::string config_cache_dir;
  std::string xdg_cache_home;
  std::string home;
};
Result<std::filesystem::path> ResolveCacheRoot(const CacheRootSources& sources);

// The sources from this process's environment and passwd entry, with
// |flag| and |config_cache_dir| as given.
CacheRootSources CacheRootSourcesFromEnvironment(std::string flag, std::string config_cache_dir);

// The CLI's root: the rule with no flag and cache_dir from the default config
// file (/etc/hvtrace/hvtraced.conf; ignored when absent or unreadable).
Result<std::filesystem::path> DefaultCacheRoot();

struct CachedEventFormat {
  std::string system;
  std::string name;
  uint32_t id = 0;          // As harvested; 0 when our parser refused the text.
  std::string text;         // The format file as the guest kernel printed it.
  std::string parse_error;  // Why ParseEventFormat refused it at harvest.
  // libtraceevent survived |text| in a trial run when the daemon loaded it
  // (format_trials.h); false: not tried, or it failed.
  bool trial_passed = false;
};

class ParsedFormats;

// Everything cached for one kernel build.
struct KernelFormats {
  std::string key;
  std::string release;
  std::string proc_version;
  nlohmann::json manifest;
  std::string header_page;
  std::string header_event;
  std::string printk_formats;
  std::string kallsyms;
  // |kallsyms| and |printk_formats| indexed (Load fills it, so a capture
  // does not parse 7 MB).
  std::shared_ptr<const KernelSymbols> symbols;
  std::vector<CachedEventFormat> events;  // Sorted by system, then name.
  // |events| parsed on first use (parsed_formats.h; Load makes it).
  std::shared_ptr<const ParsedFormats> parsed;
};

// |formats|' indexed symbols: those Load made, or indexed now for formats
// built another way (tests, a capture's own files).
std::shared_ptr<const KernelSymbols> SymbolsOf(const KernelFormats& formats);

// One line of `hvtrace formats list`.
struct CacheEntrySummary {
  std::string key;
  std::string release;
  std::string kernel_path;  // As given to the harvest that made the entry.
  uint64_t events = 0;
  std::string harvested_utc;
  std::string proc_version;  // The kernel's /proc/version, as harvested.
};

class FormatCache {
 public:
  // |root| holds formats/ (see above).
  explicit FormatCache(std::filesystem::path root);

  std::filesystem::path formats_dir() const { return root_ / "formats"; }
  // Callers pass a key checked by IsValidKernelKey.
  std::filesystem::path EntryDir(std::string_view key) const;

  // The manifest of |key|'s entry, or nullopt when there is none. A present
  // but unreadable entry is an error naming its path.
  Result<std::optional<nlohmann::json>> Lookup(std::string_view key) const;

  // Loads every file of |key|'s entry, capped and checked as on harvest
  // (the cache directory may have been edited by hand).
  Result<KernelFormats> Load(std::string_view key) const;

  // Entries with readable manifests, sorted by release then key; unreadable
  // ones are skipped and named in |problems| when given.
  Result<std::vector<CacheEntrySummary>> List(std::vector<std::string>* problems = nullptr) const;

  // Makes formats/ this process's own, mode 0700 (tightening one an older
  // version made 0755), under a trusted path: a local user can neither read
  // nor plant entries. |tightened| says whether the mode was changed.
  Status Secure(bool* tightened = nullptr) const;

  // Writes |bundle| as |key|'s entry with |manifest| (the harvest's facts;
  // counts and sizes are added here). Atomic: temp dir, fsync, rename. When
  // another harvest stored the same key first, that entry is kept and its
  // path returned.
  Result<std::filesystem::path> Store(std::string_view key, const HarvestBundle& bundle,
                                      nlohmann::json manifest) const;

 private:
  std::filesystem::path root_;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_FORMATS_CACHE_H_
