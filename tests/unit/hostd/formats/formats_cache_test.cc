// FormatCache: the kernel key, atomic stores, lookups and loads, and a cache
// directory edited by someone else.
#include "formats_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fixture_bundle.h"
#include "hvtrace/format.h"
#include "sha256.h"
#include "test_support.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test_support::ReadText;
using test_support::TempDir;
using ::testing::HasSubstr;

const fs::path kFixtures = fs::path(HVTRACE_FIXTURES_DIR) / "boot_map";
const std::string kKey(64, 'a');

// A bundle from the real 6.12 fixtures, as ParseHarvestArchive would give.
HarvestBundle FixtureBundle() {
  HarvestBundle b = test_support::BootMapFixtureBundle();
  b.proc_version = "Linux version 6.12.95+deb12-amd64 #1 SMP";
  b.printk_formats = "0xffffffff82a0c1e0 : \"hello\\n\"\n";
  b.kallsyms = "ffffffff81000000 T _stext\n";
  b.kallsyms_symbols = 1;
  b.kallsyms_nonzero_addresses = 1;
  b.modules = "pvpanic 12288 0 - Live 0x0\n";
  return b;
}

std::vector<std::string> Names(const fs::path& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

TEST(FormatCacheTest, KernelKeyIsSha256OfTheImage) {
  TempDir dir;
  const fs::path image = dir.path() / "vmlinuz";
  std::ofstream(image, std::ios::binary) << "not really a kernel";
  Result<std::string> key = KernelKeyOfFile(image.string());
  ASSERT_TRUE(key.ok()) << key.error().message;
  EXPECT_TRUE(IsValidKernelKey(*key));
  EXPECT_EQ(*key, Sha256Hex(std::as_bytes(std::span<const char>("not really a kernel", 19))));
  // A rebuild with the same release string is a different key.
  std::ofstream(image, std::ios::binary) << "not really a kernel!";
  EXPECT_NE(*KernelKeyOfFile(image.string()), *key);
  Result<std::string> missing = KernelKeyOfFile((dir.path() / "nope").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.error().message, HasSubstr("nope"));
}

TEST(FormatCacheTest, KeyValidation) {
  EXPECT_TRUE(IsValidKernelKey(kKey));
  EXPECT_TRUE(IsValidKernelKey("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"));
  EXPECT_FALSE(IsValidKernelKey(""));
  EXPECT_FALSE(IsValidKernelKey(std::string(63, 'a')));
  EXPECT_FALSE(IsValidKernelKey(std::string(64, 'A')));
  EXPECT_FALSE(IsValidKernelKey("../" + std::string(61, 'a')));
}

// One rule for the CLI and the daemon (formats_cache.h): flag, then
// $HVTRACE_CACHE_DIR, then the config's cache_dir, then XDG, then HOME.
TEST(FormatCacheTest, CacheRootRuleTakesTheFirstSourceSet) {
  CacheRootSources all{"/flag", "/env", "/config", "/xdg", "/home/u"};
  EXPECT_EQ(ResolveCacheRoot(all).value(), fs::path("/flag"));
  all.flag.clear();
  EXPECT_EQ(ResolveCacheRoot(all).value(), fs::path("/env"));
  all.env_cache_dir.clear();
  EXPECT_EQ(ResolveCacheRoot(all).value(), fs::path("/config"));
  all.config_cache_dir.clear();
  EXPECT_EQ(ResolveCacheRoot(all).value(), fs::path("/xdg/hvtrace"));
  all.xdg_cache_home = "relative/xdg";  // Invalid per the XDG spec: ignored.
  EXPECT_EQ(ResolveCacheRoot(all).value(), fs::path("/home/u/.cache/hvtrace"));
  all.xdg_cache_home.clear();
  EXPECT_EQ(ResolveCacheRoot(all).value(), fs::path("/home/u/.cache/hvtrace"));
  all.home.clear();
  auto none = ResolveCacheRoot(all);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("HVTRACE_CACHE_DIR"), std::string::npos);
}

TEST(FormatCacheTest, CacheRootSourcesComeFromTheEnvironmentOrPasswd) {
  struct Saved {
    const char* name;
    std::optional<std::string> value;
  } saved[] = {{"HVTRACE_CACHE_DIR", {}}, {"XDG_CACHE_HOME", {}}, {"HOME", {}}};
  for (auto& s : saved) {
    if (const char* v = std::getenv(s.name)) s.value = v;
  }
  ::setenv("HVTRACE_CACHE_DIR", "/somewhere/cache", 1);
  EXPECT_EQ(CacheRootSourcesFromEnvironment("", "").env_cache_dir, "/somewhere/cache");
  EXPECT_EQ(ResolveCacheRoot(CacheRootSourcesFromEnvironment("", "/cfg")).value(),
            fs::path("/somewhere/cache"));
  ::unsetenv("HVTRACE_CACHE_DIR");
  ::unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(ResolveCacheRoot(CacheRootSourcesFromEnvironment("", "/cfg")).value(),
            fs::path("/cfg"));
  ::setenv("HOME", "/home/tester", 1);
  EXPECT_EQ(ResolveCacheRoot(CacheRootSourcesFromEnvironment("", "")).value(),
            fs::path("/home/tester/.cache/hvtrace"));
  // Without $HOME (root under systemd) the passwd entry names the home.
  ::unsetenv("HOME");
  const CacheRootSources no_home = CacheRootSourcesFromEnvironment("", "");
  EXPECT_FALSE(no_home.home.empty());
  for (auto& s : saved) {
    if (s.value) {
      ::setenv(s.name, s.value->c_str(), 1);
    } else {
      ::unsetenv(s.name);
    }
  }
}

TEST(FormatCacheTest, StoreLookupLoadRoundTrip) {
  TempDir dir;
  FormatCache cache(dir.path());
  Result<std::optional<json>> before = cache.Lookup(kKey);
  ASSERT_TRUE(before.ok()) << before.error().message;
  EXPECT_FALSE(before->has_value());

  const HarvestBundle bundle = FixtureBundle();
  ASSERT_GE(bundle.events.size(), 3u);
  Result<fs::path> stored = cache.Store(kKey, bundle, {{"kernel_path", "/k/vmlinuz"}});
  ASSERT_TRUE(stored.ok()) << stored.error().message;
  EXPECT_EQ(*stored, dir.path() / "formats" / kKey);
  // Nothing but the entry: the temporary directory was renamed.
  EXPECT_EQ(Names(dir.path() / "formats"), std::vector<std::string>{kKey});

  Result<std::optional<json>> manifest = cache.Lookup(kKey);
  ASSERT_TRUE(manifest.ok()) << manifest.error().message;
  ASSERT_TRUE(manifest->has_value());
  const json& m = **manifest;
  EXPECT_EQ(m["key"], kKey);
  EXPECT_EQ(m["release"], "6.12.95+deb12-amd64");
  EXPECT_EQ(m["kernel_path"], "/k/vmlinuz");
  EXPECT_EQ(m["events"], bundle.events.size());
  EXPECT_EQ(m["modules_loaded_at_harvest"], json::array({"pvpanic"}));
  EXPECT_FALSE(m.value("harvested_utc", "").empty());

  Result<KernelFormats> loaded = cache.Load(kKey);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  EXPECT_EQ(loaded->release, bundle.release);
  EXPECT_EQ(loaded->proc_version, bundle.proc_version);
  EXPECT_EQ(loaded->header_page, bundle.header_page);
  EXPECT_EQ(loaded->header_event, bundle.header_event);
  EXPECT_EQ(loaded->printk_formats, bundle.printk_formats);
  EXPECT_EQ(loaded->kallsyms, bundle.kallsyms);
  ASSERT_EQ(loaded->events.size(), bundle.events.size());
  for (size_t i = 0; i < bundle.events.size(); ++i) {
    EXPECT_EQ(loaded->events[i].system, bundle.events[i].system);
    EXPECT_EQ(loaded->events[i].name, bundle.events[i].name);
    EXPECT_EQ(loaded->events[i].text, bundle.events[i].text);
    EXPECT_EQ(loaded->events[i].id, bundle.events[i].id);
    EXPECT_TRUE(ParseEventFormat(loaded->events[i].system, loaded->events[i].text).ok());
  }
  // The files a person would look at are plain text beside the manifest.
  EXPECT_EQ(ReadText(*stored / "header_page"), bundle.header_page);
  EXPECT_EQ(ReadText(*stored / "kallsyms"), bundle.kallsyms);

  Result<std::vector<CacheEntrySummary>> list = cache.List();
  ASSERT_TRUE(list.ok()) << list.error().message;
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].key, kKey);
  EXPECT_EQ((*list)[0].release, "6.12.95+deb12-amd64");
  EXPECT_EQ((*list)[0].kernel_path, "/k/vmlinuz");
  EXPECT_EQ((*list)[0].events, bundle.events.size());
}

TEST(FormatCacheTest, SecondStoreKeepsTheFirstEntry) {
  TempDir dir;
  FormatCache cache(dir.path());
  ASSERT_TRUE(cache.Store(kKey, FixtureBundle(), {{"kernel_path", "first"}}).ok());
  HarvestBundle other = FixtureBundle();
  other.kallsyms = "ffffffff81000000 T _other\n";
  Result<fs::path> again = cache.Store(kKey, other, {{"kernel_path", "second"}});
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(cache.Lookup(kKey).value().value()["kernel_path"], "first");
  EXPECT_EQ(cache.Load(kKey).value().kallsyms, "ffffffff81000000 T _stext\n");
  EXPECT_EQ(Names(dir.path() / "formats"), std::vector<std::string>{kKey});
}

// A cache an older version made 0755 is tightened, not refused; a symlink in
// formats/'s place is refused and left alone.
TEST(FormatCacheTest, Malicious_AnOpenOrSymlinkedCacheDirIsTightenedOrRefused) {
  TempDir dir;
  FormatCache cache(dir.path());
  fs::create_directories(dir.path() / "formats");
  fs::permissions(dir.path() / "formats", fs::perms(0755));
  bool tightened = false;
  ASSERT_TRUE(cache.Secure(&tightened).ok());
  EXPECT_TRUE(tightened);
  EXPECT_EQ(fs::status(dir.path() / "formats").permissions(), fs::perms(0700));
  ASSERT_TRUE(cache.Store(kKey, FixtureBundle(), {{"kernel_path", "k"}}).ok());

  TempDir other;
  fs::create_directories(other.path() / "elsewhere");
  fs::create_directory_symlink(other.path() / "elsewhere", other.path() / "formats");
  Status s = FormatCache(other.path()).Secure();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.error().message, HasSubstr("formats cache"));
  EXPECT_FALSE(FormatCache(other.path()).Store(kKey, FixtureBundle(), {}).ok());
  EXPECT_TRUE(fs::is_empty(other.path() / "elsewhere"));
}

TEST(FormatCacheTest, ConcurrentStoresOfOneKernelLeaveOneWholeEntry) {
  TempDir dir;
  FormatCache cache(dir.path());
  const HarvestBundle bundle = FixtureBundle();
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { ok[i] = cache.Store(kKey, bundle, {{"writer", i}}).ok(); });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, std::vector<int>(4, 1));
  EXPECT_EQ(Names(dir.path() / "formats"), std::vector<std::string>{kKey});
  Result<KernelFormats> loaded = cache.Load(kKey);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  EXPECT_EQ(loaded->events.size(), bundle.events.size());
}

// A store that fails half way leaves neither an entry nor a temporary dir.
TEST(FormatCacheTest, FailedStoreLeavesNothing) {
  TempDir dir;
  FormatCache cache(dir.path());
  HarvestBundle dup = FixtureBundle();
  dup.events.push_back(dup.events.front());  // The same event twice.
  Result<fs::path> r = cache.Store(kKey, dup, json::object());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message, HasSubstr("appears twice"));
  EXPECT_TRUE(Names(dir.path() / "formats").empty());
  EXPECT_FALSE(cache.Lookup(kKey).value().has_value());
}

TEST(FormatCacheTest, Malicious_UnsafeNamesAndKeysAreRefused) {
  TempDir dir;
  FormatCache cache(dir.path());
  for (const std::string bad : {"..", ".hidden", "a/b", "", "x y"}) {
    SCOPED_TRACE(bad);
    HarvestBundle b = FixtureBundle();
    b.events[0].system = bad;
    Result<fs::path> r = cache.Store(kKey, b, json::object());
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.error().message, HasSubstr("unsafe event name"));
  }
  EXPECT_TRUE(Names(dir.path() / "formats").empty());
  for (const std::string& key : {std::string("../../etc"), std::string(64, 'G'), std::string()}) {
    EXPECT_FALSE(cache.Store(key, FixtureBundle(), json::object()).ok());
    EXPECT_FALSE(cache.Lookup(key).ok());
    EXPECT_FALSE(cache.Load(key).ok());
  }
}

TEST(FormatCacheTest, Malicious_EditedEntriesAreErrorsNotCrashes) {
  TempDir dir;
  FormatCache cache(dir.path());
  ASSERT_TRUE(cache.Store(kKey, FixtureBundle(), json::object()).ok());
  const fs::path entry = cache.EntryDir(kKey);

  // events.json replaced by a symlink is not followed.
  const fs::path events = entry / "events.json";
  const std::string saved = ReadText(events);
  fs::rename(events, entry / "events.json.saved");
  fs::create_symlink("/proc/self/environ", events);
  Result<KernelFormats> r = cache.Load(kKey);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message, HasSubstr("events.json"));
  fs::remove(events);
  fs::rename(entry / "events.json.saved", events);
  ASSERT_TRUE(cache.Load(kKey).ok());

  // Hand-edited entries: unsafe names, duplicates, wrong types, huge texts.
  const json good_events = json::parse(saved);
  auto edited = [&](const std::function<void(json&)>& edit) {
    json j = good_events;
    edit(j);
    std::ofstream(events, std::ios::trunc | std::ios::binary) << j.dump();
    Result<KernelFormats> loaded = cache.Load(kKey);
    return loaded.ok() ? std::string("loaded") : loaded.error().message;
  };
  EXPECT_THAT(edited([](json& j) { j["events"][0]["system"] = "../../etc"; }),
              HasSubstr("unsafe event name"));
  EXPECT_THAT(edited([](json& j) { j["events"].push_back(j["events"][0]); }),
              HasSubstr("appears twice"));
  EXPECT_THAT(edited([](json& j) { j["events"][0]["id"] = -1; }), HasSubstr("unsigned id"));
  EXPECT_THAT(edited([](json& j) { j["events"][0]["id"] = 70000; }), HasSubstr("above 65535"));
  EXPECT_THAT(edited([](json& j) { j["events"][0]["format"] = 5; }), HasSubstr("needs string"));
  EXPECT_THAT(edited([](json& j) { j["events"][0]["format"] = std::string((1u << 20) + 1, 'x'); }),
              HasSubstr("exceeds"));
  EXPECT_THAT(edited([](json& j) { j = json::array(); }), HasSubstr("\"events\" array"));
  EXPECT_THAT(edited([](json& j) {
                for (int i = 0; i < 20001; ++i) j["events"].push_back(1);
              }),
              HasSubstr("more than 20000"));
  std::ofstream(events, std::ios::trunc | std::ios::binary) << saved;
  ASSERT_TRUE(cache.Load(kKey).ok());

  // A header replaced by something big is refused.
  std::ofstream(entry / "header_page", std::ios::trunc) << std::string((64u << 10) + 1, 'h');
  r = cache.Load(kKey);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.error().message, HasSubstr("limit"));

  // A manifest that names another key, is not JSON, or is from the future.
  const fs::path manifest = entry / "manifest.json";
  const std::string good = ReadText(manifest);
  json m = json::parse(good);
  m["key"] = std::string(64, 'b');
  std::ofstream(manifest, std::ios::trunc) << m.dump();
  EXPECT_THAT(cache.Lookup(kKey).error().message, HasSubstr("not its directory's"));
  std::ofstream(manifest, std::ios::trunc) << "{not json";
  EXPECT_THAT(cache.Lookup(kKey).error().message, HasSubstr("not a JSON object"));
  m = json::parse(good);
  m["format_version"] = 99;
  std::ofstream(manifest, std::ios::trunc) << m.dump();
  EXPECT_THAT(cache.Lookup(kKey).error().message, HasSubstr("format_version 99"));

  // list skips the broken entry and says why; temporary dirs are not listed.
  fs::create_directory(dir.path() / "formats" / (".tmp-" + kKey + "-1-0"));
  fs::create_directory(dir.path() / "formats" / "not-a-key");
  std::vector<std::string> problems;
  Result<std::vector<CacheEntrySummary>> list = cache.List(&problems);
  ASSERT_TRUE(list.ok()) << list.error().message;
  EXPECT_TRUE(list->empty());
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_THAT(problems[0], HasSubstr("format_version 99"));
}

// hvtraced decodes every VM with a kernel's entry, so an entry someone other
// than root (or the cache's own user) could have written is not read: a file
// or directory writable by others, one owned by another user, a symlink on
// the way. New directories are 0700.
TEST(FormatCacheTest, Malicious_EntriesOthersCouldChangeAreNotTrusted) {
  TempDir dir;
  FormatCache cache(dir.path() / "cache");
  ASSERT_TRUE(cache.Store(kKey, FixtureBundle(), json::object()).ok());
  const fs::path entry = cache.EntryDir(kKey);
  for (const fs::path& d : {dir.path() / "cache", cache.formats_dir(), entry}) {
    EXPECT_EQ(fs::status(d).permissions() & fs::perms::all, fs::perms::owner_all) << d;
  }
  ASSERT_TRUE(cache.Load(kKey).ok());

  const fs::path manifest = entry / "manifest.json";
  fs::permissions(manifest, fs::perms::others_write, fs::perm_options::add);
  Result<std::optional<json>> looked = cache.Lookup(kKey);
  ASSERT_FALSE(looked.ok());
  EXPECT_THAT(looked.error().message, HasSubstr("writable by others"));
  EXPECT_THAT(looked.error().message, HasSubstr(manifest.string()));
  fs::permissions(manifest, fs::perms::others_write, fs::perm_options::remove);

  fs::permissions(cache.formats_dir(), fs::perms::group_write, fs::perm_options::add);
  Result<KernelFormats> loaded = cache.Load(kKey);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.error().message, HasSubstr("writable by others"));
  EXPECT_THAT(loaded.error().message, HasSubstr(cache.formats_dir().string()));
  // Nor is a new entry written there.
  EXPECT_FALSE(cache.Store(std::string(64, 'c'), FixtureBundle(), json::object()).ok());
  fs::permissions(cache.formats_dir(), fs::perms::group_write, fs::perm_options::remove);

  if (::geteuid() == 0) {
    ASSERT_EQ(::chown((entry / "kallsyms").c_str(), 65534, 65534), 0);
    loaded = cache.Load(kKey);
    ASSERT_FALSE(loaded.ok());
    EXPECT_THAT(loaded.error().message, HasSubstr("belongs to another user"));
    EXPECT_THAT(loaded.error().message, HasSubstr("kallsyms"));
    ASSERT_EQ(::chown((entry / "kallsyms").c_str(), 0, 0), 0);
  }

  // The cache reached through a symlink: not followed.
  fs::create_directory_symlink(dir.path() / "cache", dir.path() / "link");
  looked = FormatCache(dir.path() / "link").Lookup(kKey);
  ASSERT_FALSE(looked.ok());
  EXPECT_THAT(looked.error().message, HasSubstr("is a symlink"));
  ASSERT_TRUE(cache.Load(kKey).ok());
}

TEST(FormatCacheTest, ListOfAMissingCacheIsEmpty) {
  TempDir dir;
  FormatCache cache(dir.path() / "never-created");
  Result<std::vector<CacheEntrySummary>> list = cache.List();
  ASSERT_TRUE(list.ok()) << list.error().message;
  EXPECT_TRUE(list->empty());
}

}  // namespace
}  // namespace hvtrace::hostd
