// The real Linux 7.3 persistent buffer (Debian's 7.3.4, 16 MiB, 2 vCPUs,
// tests/fixtures/boot_map/linux-7.3/, make_fixture.py --kernel 7.3): the
// 6.15+ layout read back as the guest's own trace file showed it, and its
// scratch area as the guest's /proc/modules and kallsyms said.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "boot_map_fixture.h"
#include "hvtrace/boot_map.h"
#include "hvtrace/page.h"
#include "test_support.h"

namespace hvtrace {
namespace {

using test_support::ReadText;
using test_support::Unzstd;

const std::string kDir = std::string(HVTRACE_FIXTURES_DIR) + "/boot_map/linux-7.3/";

using boot_map_fixture::FixtureOptions;
using boot_map_fixture::GuestTrace;
using boot_map_fixture::TraceLine;
using boot_map_fixture::Usecs;

class Linux73Test : public ::testing::Test {
 protected:
  void SetUp() override {
    range_ = Unzstd(kDir + "region.bin.zst");
    ASSERT_EQ(range_.size(), 16u << 20);
    options_ = FixtureOptions(kDir);
    meta_ = nlohmann::json::parse(ReadText(kDir + "meta.json"));
  }
  std::vector<std::byte> range_;
  BootMapOptions options_;
  nlohmann::json meta_;
};

TEST_F(Linux73Test, RealRangeMatchesTheGuestsTraceFile) {
  auto map = ReadBootMap(range_, options_);
  ASSERT_TRUE(map.ok()) << map.error().message;
  EXPECT_EQ(map->layout, "linux-6.15");
  EXPECT_EQ(map->struct_sizes, 0x180020u);
  EXPECT_EQ(map->total_size, 16u << 20);
  EXPECT_EQ(map->cpus, 2);
  EXPECT_TRUE(map->cpus_derived);
  EXPECT_EQ(map->boots, 1u);
  for (const BootMapIssue& issue : map->issues) {
    EXPECT_EQ(issue.check, BootMapCheck::kTimeWentBackwards) << issue.message;
  }
  const std::vector<TraceLine> lines = GuestTrace(kDir + "trace.txt.zst");
  ASSERT_GT(lines.size(), 500u);
  std::map<int, std::vector<uint64_t>> want;
  for (const TraceLine& l : lines) want[l.cpu].push_back(l.usecs);
  for (const BootMapCpu& cpu : map->cpu) {
    SCOPED_TRACE("cpu " + std::to_string(cpu.cpu));
    EXPECT_TRUE(cpu.meta_valid);
    EXPECT_EQ(cpu.stats.rejected_total(), 0u);
    std::vector<uint64_t> got;
    for (const BootMapRecord& r : cpu.records) got.push_back(Usecs(r.timestamp));
    EXPECT_EQ(got, want[cpu.cpu]);
  }
  options_.cpus = 2;  // Given: the same.
  auto given = ReadBootMap(range_, options_);
  ASSERT_TRUE(given.ok());
  EXPECT_EQ(given->total_records(), map->total_records());
}

TEST_F(Linux73Test, ScratchAreaIsTheGuestsTextAndModules) {
  auto map = ReadBootMap(range_, options_);
  ASSERT_TRUE(map.ok()) << map.error().message;
  const BootMapScratch& s = map->scratch;
  EXPECT_EQ(s.layout, "clock_id");
  EXPECT_EQ(s.clock_id, 0u);  // "local", the instance's default clock.
  EXPECT_EQ(s.text_addr, std::stoull(meta_["text_addr"].get<std::string>(), nullptr, 16));
  EXPECT_TRUE(s.problems.empty());
  // /proc/modules: "name size refs deps state 0xaddr" per line.
  std::map<std::string, uint64_t> want;
  std::istringstream in(meta_["modules"].get<std::string>());
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string name, word, last;
    words >> name;
    while (words >> word) last = word;
    want[name] = std::stoull(last, nullptr, 16);
  }
  std::map<std::string, uint64_t> got;
  for (const BootMapModule& m : s.modules) got[m.name] = m.addr;
  EXPECT_EQ(got, want);
}

TEST_F(Linux73Test, Malicious_OneBadSubBufferKeepsTheRestOfItsCpu) {
  auto clean = ReadBootMap(range_, options_);
  ASSERT_TRUE(clean.ok());
  const BootMapCpu& c0 = clean->cpu[0];
  size_t victim = 1;
  while (victim < c0.pages.size() && c0.pages[victim].records < 3) ++victim;
  ASSERT_LT(victim, c0.pages.size());
  const uint64_t page_off = c0.pages[victim].offset;
  const uint32_t page_records = c0.pages[victim].records;
  const size_t total0 = c0.records.size(), total1 = clean->cpu[1].records.size();
  // The page's commit claims more than a sub-buffer holds.
  const uint64_t commit = uint64_t{options_.layout.page_size};
  std::memcpy(&range_[page_off + options_.layout.commit_offset], &commit, 8);
  auto map = ReadBootMap(range_, options_);
  ASSERT_TRUE(map.ok()) << map.error().message;
  bool reported = false;
  for (const BootMapIssue& i : map->issues)
    reported |= i.cpu == 0 && i.check == BootMapCheck::kBadPage;
  EXPECT_TRUE(reported);
  EXPECT_EQ(map->cpu[0].records.size(), total0 - page_records);
  EXPECT_EQ(map->cpu[0].stats.rejected_total(), 1u);
  EXPECT_EQ(map->cpu[1].records.size(), total1);
}

// kexec into the same 7.3 with the same command line (events after
// trace_instance=): the new boot takes the range over. CPU 0's ring holds
// the new boot only, CPU 1's both; the scratch area is the new boot's. Every
// record the new boot's own trace file shows is read, at the same times, and
// the two boots are told apart where CPU 1's time restarts.
TEST(Linux73KexecTest, TheNewBootTakesTheRangeOverAndBothBootsAreSplit) {
  const std::string dir = kDir + "kexec/";
  std::vector<std::byte> range = Unzstd(dir + "region.bin.zst");
  auto map = ReadBootMap(range, FixtureOptions(dir));
  ASSERT_TRUE(map.ok()) << map.error().message;
  EXPECT_EQ(map->layout, "linux-6.15");
  EXPECT_EQ(map->boots, 2u);
  for (const BootMapIssue& issue : map->issues) {
    EXPECT_EQ(issue.check, BootMapCheck::kTimeWentBackwards) << issue.message;
  }
  const nlohmann::json meta = nlohmann::json::parse(ReadText(dir + "meta.json"));
  EXPECT_EQ(map->scratch.text_addr, std::stoull(meta["text_addr"].get<std::string>(), nullptr, 16));
  std::set<std::string> modules;
  for (const BootMapModule& m : map->scratch.modules) modules.insert(m.name);
  EXPECT_TRUE(modules.contains("tcp_htcp")) << "the new boot's module";
  EXPECT_FALSE(modules.contains("dummy")) << "the first boot's module";

  std::map<int, std::vector<uint64_t>> want;
  for (const TraceLine& l : GuestTrace(dir + "trace.txt.zst")) want[l.cpu].push_back(l.usecs);
  std::map<int, std::set<uint32_t>> boots;
  for (const BootMapCpu& cpu : map->cpu) {
    std::vector<uint64_t> got;
    for (const BootMapRecord& r : cpu.records) {
      got.push_back(Usecs(r.timestamp));
      boots[cpu.cpu].insert(r.boot);
    }
    EXPECT_EQ(got, want[cpu.cpu]) << "cpu " << cpu.cpu;
  }
  EXPECT_EQ(boots[0], (std::set<uint32_t>{1}));
  EXPECT_EQ(boots[1], (std::set<uint32_t>{0, 1}));
}

}  // namespace
}  // namespace hvtrace
