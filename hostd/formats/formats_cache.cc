#include "formats_cache.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <set>
#include <system_error>
#include <tuple>
#include <vector>

#include "capped_file.h"
#include "config.h"
#include "hvtrace/format.h"
#include "parsed_formats.h"
#include "private_path.h"
#include "sha256.h"
#include "state_dir.h"
#include "unique_fd.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kCacheFormatVersion = 1;
constexpr size_t kMaxManifestBytes = 4u << 20;
constexpr size_t kMaxHeaderBytes = 64u << 10;
constexpr size_t kMaxPrintkBytes = 16u << 20;
constexpr size_t kMaxKallsymsBytes = 64u << 20;
constexpr size_t kMaxEventsJsonBytes = 64u << 20;

std::string Errno(int err) { return std::strerror(err); }

Status WriteFile(const fs::path& path, std::string_view data) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) return Error{"cannot create " + path.string() + ": " + Errno(errno)};
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error{"writing " + path.string() + " at offset " + std::to_string(done) + " of " +
                   std::to_string(data.size()) + ": " + Errno(errno)};
    }
    if (n == 0) return Error{"writing " + path.string() + ": write returned 0"};
    done += static_cast<size_t>(n);
  }
  if (fd.Close() != 0) return Error{"closing " + path.string() + ": " + Errno(errno)};
  return {};
}

Status MakeDir(const fs::path& path) {
  if (::mkdir(path.c_str(), 0700) != 0) {
    return Error{"cannot create directory " + path.string() + ": " + Errno(errno)};
  }
  return {};
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Module names from /proc/modules ("name size refs deps state addr").
std::vector<std::string> ModuleNames(std::string_view modules) {
  std::vector<std::string> names;
  size_t pos = 0;
  while (pos < modules.size() && names.size() < 4096) {
    size_t end = modules.find('\n', pos);
    if (end == std::string_view::npos) end = modules.size();
    const std::string_view line = modules.substr(pos, end - pos);
    pos = end + 1;
    const std::string_view name = line.substr(0, line.find(' '));
    if (IsSafeComponent(name)) names.emplace_back(name);
  }
  return names;
}

// Every file of an entry is read only when it and every directory above it
// is root's (or this process's user's) and nobody else can write them
// (private_path.h): hvtraced decodes every VM with that kernel with what it
// says, so a local user must not be able to plant or swap an entry.
Result<std::string> ReadTrusted(const fs::path& path, size_t cap) {
  if (Status s = CheckTrustedPath(path, "formats cache"); !s.ok()) return s.error();
  return ReadCappedFile(path, cap);
}

// Removes a temporary entry; best effort, errors are not interesting then.
void RemoveTree(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

}  // namespace

bool IsValidKernelKey(std::string_view key) {
  return key.size() == 64 && std::all_of(key.begin(), key.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

Result<std::string> KernelKeyOfFile(const std::string& vmlinuz_path) {
  Result<std::string> hash = Sha256File(vmlinuz_path);
  if (!hash.ok()) return Error{"kernel key: " + hash.error().message};
  return hash;
}

Result<fs::path> ResolveCacheRoot(const CacheRootSources& sources) {
  if (!sources.flag.empty()) return fs::path(sources.flag);
  if (!sources.env_cache_dir.empty()) return fs::path(sources.env_cache_dir);
  if (!sources.config_cache_dir.empty()) return fs::path(sources.config_cache_dir);
  // The XDG spec says relative values are invalid and must be ignored.
  if (!sources.xdg_cache_home.empty() && sources.xdg_cache_home.front() == '/') {
    return fs::path(sources.xdg_cache_home) / "hvtrace";
  }
  if (!sources.home.empty()) return fs::path(sources.home) / ".cache" / "hvtrace";
  return Error{
      "no formats cache directory: none of HVTRACE_CACHE_DIR, cache_dir (config), "
      "XDG_CACHE_HOME, HOME is set and the user has no home directory; pass --cache DIR"};
}

CacheRootSources CacheRootSourcesFromEnvironment(std::string flag, std::string config_cache_dir) {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v != nullptr ? v : "");
  };
  CacheRootSources s{std::move(flag), env("HVTRACE_CACHE_DIR"), std::move(config_cache_dir),
                     env("XDG_CACHE_HOME"), env("HOME")};
  if (s.home.empty()) {
    // systemd starts root services without $HOME.
    long size = ::sysconf(_SC_GETPW_R_SIZE_MAX);
    std::vector<char> buf(size > 0 ? static_cast<size_t>(size) : 16384);
    struct passwd pw, *found = nullptr;
    if (::getpwuid_r(::geteuid(), &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr &&
        found->pw_dir != nullptr) {
      s.home = found->pw_dir;
    }
  }
  return s;
}

Result<fs::path> DefaultCacheRoot() {
  std::string config_cache_dir;
  if (auto config = LoadConfigFile(std::string(kDefaultConfigPath), false); config.ok()) {
    config_cache_dir = config->cache_dir.string();
  }
  return ResolveCacheRoot(CacheRootSourcesFromEnvironment("", std::move(config_cache_dir)));
}

FormatCache::FormatCache(fs::path root) : root_(std::move(root)) {}

fs::path FormatCache::EntryDir(std::string_view key) const { return formats_dir() / key; }

Result<std::optional<json>> FormatCache::Lookup(std::string_view key) const {
  if (!IsValidKernelKey(key)) {
    return Error{"format cache key '" + std::string(key.substr(0, 80)) +
                 "' is not 64 lowercase hex digits"};
  }
  const fs::path dir = EntryDir(key);
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::optional<json>();
    return Error{"stat " + dir.string() + ": " + Errno(errno)};
  }
  if (!S_ISDIR(st.st_mode)) return Error{dir.string() + " is not a directory"};
  Result<std::string> text = ReadTrusted(dir / "manifest.json", kMaxManifestBytes);
  if (!text.ok()) return Error{"format cache entry: " + text.error().message};
  json manifest = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!manifest.is_object()) {
    return Error{(dir / "manifest.json").string() + " is not a JSON object"};
  }
  if (manifest.value("key", "") != key) {
    return Error{(dir / "manifest.json").string() + " names key '" +
                 manifest.value("key", "").substr(0, 80) + "', not its directory's"};
  }
  if (manifest.value("format_version", 0) != kCacheFormatVersion) {
    return Error{(dir / "manifest.json").string() + " has format_version " +
                 std::to_string(manifest.value("format_version", 0)) + "; this hvtrace reads " +
                 std::to_string(kCacheFormatVersion)};
  }
  return std::optional<json>(std::move(manifest));
}

std::shared_ptr<const KernelSymbols> SymbolsOf(const KernelFormats& formats) {
  return formats.symbols ? formats.symbols
                         : KernelSymbols::Build(formats.kallsyms, formats.printk_formats);
}

Result<KernelFormats> FormatCache::Load(std::string_view key) const {
  Result<std::optional<json>> manifest = Lookup(key);
  if (!manifest.ok()) return manifest.error();
  const fs::path dir = EntryDir(key);
  if (!manifest->has_value())
    return Error{"no cached formats for kernel " + std::string(key) + " in " +
                 formats_dir().string()};
  KernelFormats out;
  out.key = std::string(key);
  out.manifest = std::move(**manifest);
  out.release = out.manifest.value("release", "");
  out.proc_version = out.manifest.value("proc_version", "");
  struct {
    const char* name;
    size_t cap;
    std::string* into;
  } files[] = {{"header_page", kMaxHeaderBytes, &out.header_page},
               {"header_event", kMaxHeaderBytes, &out.header_event},
               {"printk_formats", kMaxPrintkBytes, &out.printk_formats},
               {"kallsyms", kMaxKallsymsBytes, &out.kallsyms}};
  for (const auto& f : files) {
    Result<std::string> data = ReadTrusted(dir / f.name, f.cap);
    if (!data.ok()) return data.error();
    *f.into = std::move(*data);
  }
  out.symbols = KernelSymbols::Build(out.kallsyms, out.printk_formats);
  const fs::path events_path = dir / "events.json";
  Result<std::string> events_text = ReadTrusted(events_path, kMaxEventsJsonBytes);
  if (!events_text.ok()) return events_text.error();
  const json events = json::parse(*events_text, nullptr, /*allow_exceptions=*/false);
  if (!events.is_object() || !events.contains("events") || !events["events"].is_array()) {
    return Error{events_path.string() + " is not an object with an \"events\" array"};
  }
  if (events["events"].size() > kMaxHarvestEvents) {
    return Error{events_path.string() + " lists more than " + std::to_string(kMaxHarvestEvents) +
                 " events"};
  }
  std::set<std::pair<std::string, std::string>> seen;
  size_t index = 0;
  for (const json& e : events["events"]) {
    const std::string where = events_path.string() + " entry " + std::to_string(index++);
    if (!e.is_object() || !e.contains("system") || !e["system"].is_string() ||
        !e.contains("name") || !e["name"].is_string() || !e.contains("format") ||
        !e["format"].is_string() || !e.contains("id") || !e["id"].is_number_unsigned() ||
        (e.contains("parse_error") && !e["parse_error"].is_string())) {
      return Error{where + ": needs string system, name, format and an unsigned id"};
    }
    CachedEventFormat ev;
    ev.system = e["system"].get<std::string>();
    ev.name = e["name"].get<std::string>();
    if (!IsSafeComponent(ev.system) || !IsSafeComponent(ev.name)) {
      return Error{where + ": unsafe event name '" + ev.system.substr(0, 64) + "/" +
                   ev.name.substr(0, 64) + "'"};
    }
    if (!seen.insert({ev.system, ev.name}).second) {
      return Error{where + ": " + ev.system + "/" + ev.name + " appears twice"};
    }
    const uint64_t id = e["id"].get<uint64_t>();
    if (id > 0xffff) return Error{where + ": id " + std::to_string(id) + " is above 65535"};
    ev.id = static_cast<uint32_t>(id);
    ev.text = e["format"].get<std::string>();
    if (ev.text.size() > kMaxFormatTextSize) {
      return Error{where + ": format of " + ev.system + "/" + ev.name + " exceeds " +
                   std::to_string(kMaxFormatTextSize) + " bytes"};
    }
    if (e.contains("parse_error")) ev.parse_error = e["parse_error"].get<std::string>();
    out.events.push_back(std::move(ev));
  }
  std::sort(out.events.begin(), out.events.end(),
            [](const CachedEventFormat& x, const CachedEventFormat& y) {
              return std::tie(x.system, x.name) < std::tie(y.system, y.name);
            });
  // Made for the sorted vector, which a move of |out| keeps.
  out.parsed = std::make_shared<const ParsedFormats>(out);
  return out;
}

Result<std::vector<CacheEntrySummary>> FormatCache::List(std::vector<std::string>* problems) const {
  std::vector<CacheEntrySummary> out;
  std::error_code ec;
  fs::directory_iterator it(formats_dir(), ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) return out;
    return Error{"listing " + formats_dir().string() + ": " + ec.message()};
  }
  for (fs::directory_iterator end; it != end; it.increment(ec)) {
    if (ec) return Error{"listing " + formats_dir().string() + ": " + ec.message()};
    const std::string key = it->path().filename().string();
    if (!IsValidKernelKey(key)) continue;  // Temporary entries and strangers.
    Result<std::optional<json>> manifest = Lookup(key);
    if (!manifest.ok() || !manifest->has_value()) {
      if (problems != nullptr) {
        problems->push_back(manifest.ok() ? key + ": vanished" : manifest.error().message);
      }
      continue;
    }
    const json& m = **manifest;
    CacheEntrySummary s;
    s.key = key;
    s.release = m.value("release", "");
    s.kernel_path = m.value("kernel_path", "");
    s.events = m.value("events", uint64_t{0});
    s.harvested_utc = m.value("harvested_utc", "");
    s.proc_version = m.value("proc_version", "");
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(), [](const CacheEntrySummary& a, const CacheEntrySummary& b) {
    return std::tie(a.release, a.key) < std::tie(b.release, b.key);
  });
  return out;
}

Status FormatCache::Secure(bool* tightened) const {
  return TightenPrivateDir(formats_dir(), "formats cache", tightened);
}

Result<fs::path> FormatCache::Store(std::string_view key, const HarvestBundle& bundle,
                                    json manifest) const {
  if (!IsValidKernelKey(key)) {
    return Error{"format cache key '" + std::string(key.substr(0, 80)) +
                 "' is not 64 lowercase hex digits"};
  }
  if (Status s = Secure(); !s.ok()) return s.error();
  const fs::path final_dir = EntryDir(key);

  static std::atomic<uint64_t> counter{0};
  const fs::path tmp =
      formats_dir() / (".tmp-" + std::string(key) + "-" + std::to_string(::getpid()) + "-" +
                       std::to_string(counter.fetch_add(1)));
  if (Status s = MakeDir(tmp); !s.ok()) return s.error();
  auto fail = [&tmp](const Error& e) -> Result<fs::path> {
    RemoveTree(tmp);
    return e;
  };

  std::set<std::string> systems;
  std::set<std::pair<std::string, std::string>> seen;
  json events = json::array();
  for (const HarvestedEvent& ev : bundle.events) {
    // The bundle parser checked these; the cache checks again because a
    // bundle can also be built by hand, and readers trust names from here
    // no more than from the guest.
    if (!IsSafeComponent(ev.system) || !IsSafeComponent(ev.name)) {
      return fail(Error{"unsafe event name '" + ev.system.substr(0, 64) + "/" +
                        ev.name.substr(0, 64) + "'"});
    }
    if (!seen.insert({ev.system, ev.name}).second) {
      return fail(Error{"event " + ev.system + "/" + ev.name + " appears twice"});
    }
    systems.insert(ev.system);
    json e = {{"system", ev.system}, {"name", ev.name}, {"id", ev.id}, {"format", ev.text}};
    if (!ev.parse_error.empty()) e["parse_error"] = ev.parse_error;
    events.push_back(std::move(e));
  }
  const std::pair<const char*, const std::string*> files[] = {
      {"header_page", &bundle.header_page},
      {"header_event", &bundle.header_event},
      {"printk_formats", &bundle.printk_formats},
      {"kallsyms", &bundle.kallsyms}};
  for (const auto& [name, data] : files) {
    if (Status s = WriteFile(tmp / name, *data); !s.ok()) return fail(s.error());
  }
  // Strings from the guest may hold bytes that are not UTF-8; replace them
  // rather than fail (the formats we keep are ASCII; this is for the rest).
  const std::string events_json =
      json{{"events", std::move(events)}}.dump(1, ' ', false, json::error_handler_t::replace);
  if (Status s = WriteFile(tmp / "events.json", events_json + "\n"); !s.ok()) {
    return fail(s.error());
  }

  manifest["format_version"] = kCacheFormatVersion;
  manifest["key"] = std::string(key);
  manifest["key_kind"] = "sha256 of the kernel image file";
  manifest["release"] = bundle.release;
  manifest["proc_version"] = bundle.proc_version;
  manifest["events"] = bundle.events.size();
  manifest["systems"] = systems.size();
  manifest["rejected_formats"] = bundle.rejected;
  json unparsed = json::array();
  for (const HarvestedEvent& ev : bundle.events) {
    if (!ev.parse_error.empty())
      unparsed.push_back(ev.system + "/" + ev.name + ": " + ev.parse_error);
  }
  manifest["unparsed_formats"] = std::move(unparsed);
  manifest["printk_formats_bytes"] = bundle.printk_formats.size();
  manifest["kallsyms_symbols"] = bundle.kallsyms_symbols;
  manifest["kallsyms_nonzero_addresses"] = bundle.kallsyms_nonzero_addresses;
  manifest["modules_loaded_at_harvest"] = ModuleNames(bundle.modules);
  if (!manifest.contains("harvested_utc")) manifest["harvested_utc"] = UtcNow();
  if (Status s = WriteFile(tmp / "manifest.json",
                           manifest.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
      !s.ok()) {
    return fail(s.error());
  }

  // One syncfs for the handful of files, then the rename publishes them.
  {
    UniqueFd dirfd(::open(tmp.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dirfd.get() < 0 || ::syncfs(dirfd.get()) != 0) {
      return fail(Error{"syncing " + tmp.string() + ": " + Errno(errno)});
    }
  }
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    const int err = errno;
    RemoveTree(tmp);
    if (err == EEXIST || err == ENOTEMPTY) {
      // Another harvest of the same kernel won the race; its entry is as good.
      Result<std::optional<json>> existing = Lookup(key);
      if (existing.ok() && existing->has_value()) return final_dir;
      return Error{final_dir.string() + " exists but is not a usable cache entry" +
                   (existing.ok() ? std::string() : ": " + existing.error().message)};
    }
    return Error{"renaming " + tmp.string() + " to " + final_dir.string() + ": " + Errno(err)};
  }
  UniqueFd parent(::open(formats_dir().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (parent.get() < 0 || ::fsync(parent.get()) != 0) {
    return Error{"fsync " + formats_dir().string() + ": " + Errno(errno)};
  }
  return final_dir;
}

}  // namespace hvtrace::hostd
