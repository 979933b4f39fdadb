// FormatsService: the daemon loads a kernel's cached formats once and shares
// them; a kernel that is not cached is reported, not harvested without the
// harvest initramfs (and never with one another user could have changed); a
// cache entry edited into garbage is an error naming it.
#include "formats_service.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "fixture_bundle.h"
#include "test_support.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using test_support::ReadText;
using test_support::TempDir;

const fs::path kFixtures = fs::path(HVTRACE_FIXTURES_DIR) / "boot_map";
const std::string kKey(64, 'b');

HarvestBundle FixtureBundle() {
  HarvestBundle b = test_support::BootMapFixtureBundle();
  b.kallsyms = ReadText(kFixtures / "kallsyms");
  return b;
}

struct Service {
  explicit Service(fs::path root, fs::path harvest_initrd = {})
      : pool(1),
        formats(std::make_shared<FormatsService>(
            std::move(root), pool.get_executor(),
            [this](LogLevel, const std::string& m) {
              std::lock_guard lock(mu);
              log.push_back(m);
            },
            std::move(harvest_initrd))) {}
  ~Service() { pool.join(); }
  std::string Log() {
    std::lock_guard lock(mu);
    std::string all;
    for (const auto& l : log) all += l + "\n";
    return all;
  }
  boost::asio::thread_pool pool;
  std::mutex mu;
  std::vector<std::string> log;
  std::shared_ptr<FormatsService> formats;
};

// Entries() lists the cache again only when its directory changed: an
// entry stored (or removed) after a listing is in (or out of) the next one,
// with the banner a panic's decode looks its kernel up by.
TEST(FormatsServiceTest, EntriesFollowTheCacheDirectory) {
  TempDir dir;
  Service s(dir.path());
  std::vector<std::string> problems;
  auto none = s.formats->Entries(&problems);
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_TRUE(none->empty());
  HarvestBundle bundle = FixtureBundle();
  bundle.proc_version = "Linux version 6.12.95+deb12-amd64 (test) #1 SMP";
  ASSERT_TRUE(FormatCache(dir.path()).Store(kKey, bundle, {}).ok());
  auto one = s.formats->Entries(&problems);
  ASSERT_TRUE(one.ok()) << one.error().message;
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].key, kKey);
  EXPECT_EQ((*one)[0].proc_version, bundle.proc_version);
  auto again = s.formats->Entries(&problems);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->size(), 1u);
  const std::string other(64, 'c');
  ASSERT_TRUE(FormatCache(dir.path()).Store(other, FixtureBundle(), {}).ok());
  auto two = s.formats->Entries(&problems);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->size(), 2u);
  fs::remove_all(FormatCache(dir.path()).EntryDir(kKey));
  auto left = s.formats->Entries(&problems);
  ASSERT_TRUE(left.ok());
  ASSERT_EQ(left->size(), 1u);
  EXPECT_EQ((*left)[0].key, other);
  EXPECT_TRUE(problems.empty()) << problems.front();
}

TEST(FormatsServiceTest, LoadsACachedKernelOnceAndSharesIt) {
  TempDir dir;
  ASSERT_TRUE(FormatCache(dir.path()).Store(kKey, FixtureBundle(), {}).ok());
  Service s(dir.path());
  EXPECT_EQ(s.formats->StateOf(kKey), "cached");
  auto a = s.formats->Get(kKey);
  ASSERT_TRUE(a.ok()) << a.error().message;
  ASSERT_NE(*a, nullptr);
  EXPECT_EQ((*a)->key, kKey);
  EXPECT_EQ((*a)->events.size(), 9u);
  EXPECT_EQ(s.formats->StateOf(kKey), "loaded");
  // Trial-parsed once as they loaded (format_trials.h): every format our
  // parser took passed libtraceevent's trial.
  for (const CachedEventFormat& f : (*a)->events) {
    EXPECT_EQ(f.trial_passed, f.parse_error.empty()) << f.system << "/" << f.name;
  }
  EXPECT_NE(s.Log().find("trial parse in one child"), std::string::npos) << s.Log();
  EXPECT_NE(s.Log().find(" 9 passed, 0 not"), std::string::npos) << s.Log();
  // Concurrent captures share one copy.
  std::shared_ptr<const KernelFormats> b, c;
  std::thread t1([&] { b = s.formats->Get(kKey).value(); });
  std::thread t2([&] { c = s.formats->Get(kKey).value(); });
  t1.join();
  t2.join();
  EXPECT_EQ(b.get(), a->get());
  EXPECT_EQ(c.get(), a->get());
}

TEST(FormatsServiceTest, MissingKernelIsReportedAndNotHarvestedWithoutHarvestInitrd) {
  TempDir dir;
  Service s(dir.path());
  auto got = s.formats->Get(kKey);
  ASSERT_TRUE(got.ok()) << got.error().message;
  EXPECT_EQ(*got, nullptr);
  EXPECT_EQ(s.formats->StateOf(kKey), "missing");
  s.formats->Prepare(kKey, "/boot/vmlinuz-x");
  s.pool.join();
  EXPECT_NE(s.Log().find("hvtrace formats harvest --kernel /boot/vmlinuz-x"), std::string::npos)
      << s.Log();
  EXPECT_NE(s.Log().find("no harvest_initrd"), std::string::npos) << s.Log();
  EXPECT_EQ(s.formats->StateOf(kKey), "missing");
  EXPECT_FALSE(fs::exists(dir.path() / "formats" / kKey));
}

// A harvest initramfs another user could have rewritten (here: writable by
// everyone) is refused before any guest boots: its /init would decide what
// the cache says about the kernel for every VM.
TEST(FormatsServiceTest, Malicious_HarvestInitrdOthersCanWriteIsRefused) {
  TempDir dir;
  const fs::path initrd = dir.path() / "initrd.img";
  std::ofstream(initrd) << "not really an initramfs";
  fs::permissions(initrd, fs::perms::all);
  Service s(dir.path() / "cache", initrd);
  s.formats->Prepare(kKey, "/boot/vmlinuz-x");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (s.formats->StateOf(kKey).rfind("harvest failed", 0) != 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string state = s.formats->StateOf(kKey);
  EXPECT_NE(state.find("harvest failed"), std::string::npos) << state;
  EXPECT_NE(state.find("writable by others"), std::string::npos) << state;
  EXPECT_NE(state.find(initrd.string()), std::string::npos) << state;
  EXPECT_FALSE(fs::exists(dir.path() / "cache" / "formats" / kKey));
}

TEST(FormatsServiceTest, NoCacheRootMeansEveryKernelIsMissing) {
  Service s{fs::path()};
  auto got = s.formats->Get(kKey);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, nullptr);
  EXPECT_EQ(s.formats->StateOf(kKey), "missing");
}

TEST(FormatsServiceTest, Malicious_BadKeysAndEditedEntriesAreErrors) {
  TempDir dir;
  Service s(dir.path());
  auto bad = s.formats->Get("../../etc");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("64 lowercase hex"), std::string::npos);
  ASSERT_TRUE(FormatCache(dir.path()).Store(kKey, FixtureBundle(), {}).ok());
  std::ofstream(dir.path() / "formats" / kKey / "events.json", std::ios::trunc) << "{not json";
  auto edited = s.formats->Get(kKey);
  ASSERT_FALSE(edited.ok());
  EXPECT_NE(edited.error().message.find(kKey), std::string::npos) << edited.error().message;
}

// A harvest a client asked for: refused at once, naming the client's kernel
// path and the config key, when there is no harvest initramfs; with an
// untrusted one it fails before any guest boots, is reported to |done| and
// in HarvestStates, and a later request is tried again (not remembered as
// failed the way a background harvest is).
TEST(FormatsServiceTest, Malicious_RequestedHarvestFailsWithTheKernelAndCause) {
  TempDir dir;
  {
    Service none(dir.path() / "cache");
    std::string why;
    FormatsService::HarvestRequest r;
    r.key = kKey;
    r.kernel = "/var/lib/hvtrace/harvest/inputs/kernel-0";
    r.label = "/home/u/vmlinuz";
    r.done = [&](Result<HarvestResult> result) {
      why = result.ok() ? "ok" : result.error().message;
    };
    none.formats->Harvest(std::move(r));
    EXPECT_NE(why.find("harvest of /home/u/vmlinuz: "), std::string::npos) << why;
    EXPECT_NE(why.find("set harvest_initrd in hvtraced.conf"), std::string::npos) << why;
  }
  const fs::path initrd = dir.path() / "initrd.img";
  std::ofstream(initrd) << "not really an initramfs";
  fs::permissions(initrd, fs::perms::all);
  Service s(dir.path() / "cache", initrd);
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::promise<std::string> failed;
    FormatsService::HarvestRequest r;
    r.key = kKey;
    r.kernel = "/nonexistent/kernel-copy";
    r.label = "/home/u/vmlinuz";
    r.done = [&](Result<HarvestResult> result) {
      failed.set_value(result.ok() ? "ok" : result.error().message);
    };
    s.formats->Harvest(std::move(r));
    auto future = failed.get_future();
    ASSERT_EQ(future.wait_for(std::chrono::seconds(10)), std::future_status::ready) << attempt;
    const std::string why = future.get();
    EXPECT_NE(why.find("harvest of /home/u/vmlinuz: harvest initramfs"), std::string::npos) << why;
    EXPECT_NE(why.find("writable by others"), std::string::npos) << why;
    EXPECT_NE(s.formats->HarvestStates()[kKey].find("harvest failed"), std::string::npos);
  }
  EXPECT_NE(s.Log().find("harvesting them from /home/u/vmlinuz as asked"), std::string::npos)
      << s.Log();
  EXPECT_FALSE(fs::exists(dir.path() / "cache" / "formats" / kKey));
}

}  // namespace
}  // namespace hvtrace::hostd
