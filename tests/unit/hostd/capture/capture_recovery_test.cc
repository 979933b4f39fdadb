// Captures a daemon died in: with region.bin and the recovery record durable,
// the next run finishes them (decoded with the cached formats, or counted
// without), under the original trigger and time, marked recovered; without a
// record, or with a record or region.bin that does not hold up, they are
// removed and the reason said. The region is the real 6.12 boot_map fixture.
#include <gtest/gtest.h>

#include <algorithm>
#include <boost/asio/thread_pool.hpp>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "capture_pipeline.h"
#include "capture_service.h"
#include "fixture_bundle.h"
#include "test_support.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test_support::ReadText;
using test_support::RunCommand;
using test_support::TempDir;
using test_support::Unzstd;

const fs::path kFixtures = fs::path(HVTRACE_FIXTURES_DIR) / "boot_map";
const std::string kKey(64, 'c');

HarvestBundle FixtureBundle() {
  HarvestBundle b = test_support::BootMapFixtureBundle();
  b.kallsyms = ReadText(kFixtures / "kallsyms");
  return b;
}

// A cache holding the fixture kernel's formats, and the service over it.
struct Formats {
  Formats() : pool(1) {
    EXPECT_TRUE(FormatCache(cache.path()).Store(kKey, FixtureBundle(), {}).ok());
    service = std::make_shared<FormatsService>(cache.path(), pool.get_executor(),
                                               [](LogLevel, const std::string&) {});
  }
  ~Formats() { pool.join(); }
  TempDir cache;
  boost::asio::thread_pool pool;
  std::shared_ptr<FormatsService> service;
};

// What a daemon that died right after the region copy was durable leaves:
// a hidden capture directory with region.bin and the recovery record.
fs::path LeaveIncomplete(const CaptureStore& store, std::span<const std::byte> region,
                         const HostTime& triggered, bool with_record = true) {
  CaptureStore writer(store.dir());
  auto pending = writer.Begin("panic", triggered);
  EXPECT_TRUE(pending.ok());
  const fs::path dir = (*pending)->dir();
  EXPECT_TRUE((*pending)->WriteFile("region.bin", region).ok());
  if (with_record) {
    CaptureManifest m;
    m.vm = "vm1";
    m.trigger = "panic";
    m.triggered = triggered;
    m.kernel = {{"formats_key", kKey}, {"path", "/boot/vmlinuz-6.12"}};
    m.region = {{"kind", "boot-range"},
                {"source", "/dev/shm/hvtrace-vm1"},
                {"offset", 0},
                {"size", region.size()},
                {"gpa", 0x40000000}};
    m.qmp_events.push_back({"GUEST_PANICKED", triggered, {{"action", "pause"}}});
    m.extra["timing_ms"] = {{"trigger_to_region_durable", 12.5}};
    EXPECT_TRUE((*pending)->WriteRecoveryRecord(m).ok());
  }
  // The daemon dies here: keep the directory the PendingCapture would remove.
  const fs::path kept = dir.string() + "-kept";
  fs::rename(dir, kept);
  pending->reset();
  fs::rename(kept, dir);
  return dir;
}

json Manifest(const CaptureEntry& e) { return json::parse(ReadText(e.dir / "manifest.json")); }

TEST(CaptureRecoveryTest, DurableRegionIsDecodedAndCommittedAsRecovered) {
  const std::vector<std::byte> region = Unzstd(kFixtures / "region.bin.zst");
  ASSERT_EQ(region.size(), 16u << 20);
  Formats formats;
  TempDir tmp;
  CaptureStore store(tmp.path() / "captures");
  const HostTime triggered = HostTime::Now();
  LeaveIncomplete(store, region, triggered);

  auto report = CaptureService(formats.service, 1).Recover(store);
  ASSERT_TRUE(report.ok()) << report.error().message;
  ASSERT_EQ(report->recovered.size(), 1u);
  EXPECT_TRUE(report->removed.empty());
  const CaptureEntry& entry = report->recovered[0];
  EXPECT_EQ(entry.id, UtcStamp(triggered.realtime_ns) + "-panic");
  EXPECT_TRUE(store.ListIncomplete()->empty());

  json m = Manifest(entry);
  EXPECT_EQ(m["vm"], "vm1");
  EXPECT_EQ(m["trigger"], "panic");
  EXPECT_EQ(m["host_time"]["triggered"]["realtime_ns"], triggered.realtime_ns);
  EXPECT_EQ(m["qmp_events"][0]["event"], "GUEST_PANICKED");
  EXPECT_TRUE(m["recovered"].is_object()) << m.dump(2);
  EXPECT_NE(m["recovered"]["note"].get<std::string>().find("was durable"), std::string::npos);
  EXPECT_EQ(m["extra"]["formats"]["decoded"], true) << m["extra"].dump(2);
  EXPECT_EQ(m["extra"]["timing_ms"]["trigger_to_region_durable"], 12.5);
  EXPECT_TRUE(m["extra"]["timing_ms"].contains("trace_dat_write"));
  // The same decode step as a live capture: its consistency summary and
  // trigger-to-decoded time too (here, across the daemon that stopped).
  EXPECT_TRUE(m["extra"]["consistency"].contains("note")) << m["extra"].dump(2);
  EXPECT_TRUE(m["extra"]["timing_ms"].contains("trigger_to_decoded")) << m["extra"].dump(2);
  EXPECT_TRUE(entry.summary.contains("recovered"));
  std::vector<std::string> files;
  for (const json& f : m["files"]) files.push_back(f["name"]);
  EXPECT_EQ(files, (std::vector<std::string>{"boot-0.trace.dat", "region.bin"}));
  EXPECT_FALSE(fs::exists(entry.dir / std::string(kRecoveryRecordName)));

  // The same counts a capture decoded on the spot has.
  CaptureManifest counted;
  BootMapCaptureOptions opts;
  ASSERT_TRUE(CountBootMapCapture(region, opts, counted).ok());
  EXPECT_EQ(m["totals"]["events"], counted.ToJson()["totals"]["events"]);
  EXPECT_GT(m["totals"]["events"].get<uint64_t>(), 1000u);
  const std::string report_text =
      RunCommand("trace-cmd report -i '" + (entry.dir / "boot-0.trace.dat").string() + "' 2>&1");
  EXPECT_NE(report_text.find("sched_switch"), std::string::npos) << report_text.substr(0, 500);
}

TEST(CaptureRecoveryTest, WithoutFormatsTheRegionIsCountedAndKept) {
  const std::vector<std::byte> region = Unzstd(kFixtures / "region.bin.zst");
  ASSERT_FALSE(region.empty());
  TempDir tmp;
  CaptureStore store(tmp.path() / "captures");
  LeaveIncomplete(store, region, HostTime::Now());
  auto report = CaptureService(nullptr, 1).Recover(store);
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->recovered.size(), 1u);
  json m = Manifest(report->recovered[0]);
  EXPECT_EQ(m["extra"]["formats"]["decoded"], false);
  EXPECT_GT(m["totals"]["events"].get<uint64_t>(), 1000u);
  EXPECT_EQ(m["files"].size(), 1u);  // region.bin; `hvtrace show` decodes it later.
}

// Recovers |store| without formats, where every capture is to be removed:
// the |removed| reasons, a line each ("" and a failure otherwise).
std::string RemovedReasons(const CaptureStore& store, size_t removed) {
  auto report = CaptureService(nullptr, 1).Recover(store);
  if (!report.ok()) {
    ADD_FAILURE() << report.error().message;
    return "";
  }
  EXPECT_TRUE(report->recovered.empty());
  EXPECT_EQ(report->removed.size(), removed);
  std::string all;
  for (const std::string& why : report->removed) all += why + "\n";
  return all;
}

TEST(CaptureRecoveryTest, CapturesThatCannotBeFinishedAreRemovedWithTheReason) {
  const std::vector<std::byte> region = Unzstd(kFixtures / "region.bin.zst");
  ASSERT_FALSE(region.empty());
  TempDir tmp;
  CaptureStore store(tmp.path() / "captures");
  // Died before region.bin was durable: no record.
  LeaveIncomplete(store, region, HostTime::Now(), /*with_record=*/false);
  // region.bin shorter than the region the record names.
  const fs::path short_region = LeaveIncomplete(store, region, HostTime::Now());
  fs::resize_file(short_region / "region.bin", 4096);
  // A record that is not one.
  const fs::path garbage = LeaveIncomplete(store, region, HostTime::Now());
  std::ofstream(garbage / std::string(kRecoveryRecordName), std::ios::trunc)
      << "{\"format\": \"hvtrace-capture-recovery\", \"manifest\": {\"vm\": 7}}";

  const std::string all = RemovedReasons(store, 3);
  EXPECT_NE(all.find("no recovery record"), std::string::npos) << all;
  EXPECT_NE(all.find("region.bin is 4096 bytes, the region 16777216"), std::string::npos) << all;
  EXPECT_NE(all.find("vm is not a string"), std::string::npos) << all;
  EXPECT_TRUE(store.ListIncomplete()->empty());
  EXPECT_TRUE(store.List()->empty());
}

// Records whose fields have other types than the daemon writes (the
// manifest fuzzer's "format": [] aborted the recovery, and with it the
// daemon's start): each is removed with the reason, the next one still runs.
TEST(CaptureRecoveryTest, RecordsWithFieldsOfAnotherTypeAreRemovedWithTheReason) {
  const std::vector<std::byte> region = Unzstd(kFixtures / "region.bin.zst");
  ASSERT_FALSE(region.empty());
  TempDir tmp;
  CaptureStore store(tmp.path() / "captures");
  const fs::path format_array = LeaveIncomplete(store, region, HostTime::Now());
  std::ofstream(format_array / std::string(kRecoveryRecordName), std::ios::trunc)
      << "{\"format\": [], \"manifest\": {}}";
  const fs::path kind_array = LeaveIncomplete(store, region, HostTime::Now());
  json record = json::parse(ReadText(kind_array / std::string(kRecoveryRecordName)));
  record["manifest"]["region"]["kind"] = json::array();
  std::ofstream(kind_array / std::string(kRecoveryRecordName), std::ios::trunc) << record.dump();
  const fs::path stopped_text = LeaveIncomplete(store, region, HostTime::Now());
  record = json::parse(ReadText(stopped_text / std::string(kRecoveryRecordName)));
  record["manifest"]["extra"]["consistency"] = {{"vcpus_stopped", "yes"}};
  std::ofstream(stopped_text / std::string(kRecoveryRecordName), std::ios::trunc) << record.dump();

  const std::string all = RemovedReasons(store, 3);
  EXPECT_NE(all.find("is not an hvtrace recovery record"), std::string::npos) << all;
  EXPECT_NE(all.find("region.kind is not a string"), std::string::npos) << all;
  EXPECT_NE(all.find("its recovery record is malformed"), std::string::npos) << all;
  EXPECT_TRUE(store.ListIncomplete()->empty());
}

TEST(CaptureRecoveryTest, CommittedCaptureKeepsNoRecoveryRecord) {
  TempDir tmp;
  CaptureStore store(tmp.path() / "captures");
  auto pending = store.Begin("manual", HostTime::Now());
  ASSERT_TRUE(pending.ok());
  const std::vector<std::byte> data(4096, std::byte{1});
  ASSERT_TRUE((*pending)->WriteFile("region.bin", data).ok());
  CaptureManifest m;
  m.vm = "vm1";
  m.trigger = "manual";
  ASSERT_TRUE((*pending)->WriteRecoveryRecord(m).ok());
  auto entry = (*pending)->Commit(m);
  ASSERT_TRUE(entry.ok()) << entry.error().message;
  EXPECT_FALSE(fs::exists(entry->dir / std::string(kRecoveryRecordName)));
  json doc = Manifest(*entry);
  EXPECT_EQ(doc["files"].size(), 1u);
  EXPECT_FALSE(doc.contains("recovered"));
}

}  // namespace
}  // namespace hvtrace::hostd
