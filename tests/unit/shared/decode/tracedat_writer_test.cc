#include "hvtrace/tracedat_writer.h"

#include <event-parse.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "hvtrace/boot_map.h"
#include "hvtrace/page.h"
#include "test_support.h"

// trace-cmd.h pulls in tracefs.h, which does not compile as C++; declare the
// few libtracecmd calls used here (trace-cmd.h, libtracecmd 1.3).
extern "C" {
struct tracecmd_input;
tracecmd_input* tracecmd_open(const char* file, int flags);
void tracecmd_close(tracecmd_input* handle);
tep_handle* tracecmd_get_tep(tracecmd_input* handle);
tep_record* tracecmd_read_cpu_first(tracecmd_input* handle, int cpu);
tep_record* tracecmd_read_data(tracecmd_input* handle, int cpu);
void tracecmd_free_record(tep_record* record);
}
constexpr int kTracecmdNoPlugins = 1 << 0;  // TRACECMD_FL_LOAD_NO_PLUGINS

// libtracecmd's own leak is suppressed for LeakSanitizer in
// tests/unit/lsan_suppressions.cc.
namespace hvtrace {
namespace {

using test_support::ReadText;
using test_support::RunCommand;
using test_support::Unzstd;

namespace fs = std::filesystem;

constexpr uint64_t kPageByPageBytes = 888832;
constexpr const char* kPageByPageSha256 =
    "e632ea40d28766b52eb322c4a9e519988d3a167c10680806aed67c69358a5499";
const std::string kDir = std::string(HVTRACE_FIXTURES_DIR) + "/boot_map/";

// The guest's markers: (cpu, usecs, "tracing_mark_write: text").
using Marker = std::tuple<int, std::string, std::string>;
std::multiset<Marker> Markers(const std::string& text, const std::regex& line_re) {
  std::multiset<Marker> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, line_re)) out.insert({std::stoi(m[1]), m[2], m[3]});
  }
  return out;
}

class TraceDatWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("hvtrace-tdw-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    range_ = Unzstd(kDir + "region.bin.zst");
    ASSERT_EQ(range_.size(), 16u << 20);
    auto layout = PageLayout::FromHeaderPage(ReadText(kDir + "header_page"), 4096);
    ASSERT_TRUE(layout.ok());
    BootMapOptions options;
    options.layout = *layout;
    auto map = ReadBootMap(range_, options);
    ASSERT_TRUE(map.ok()) << map.error().message;
    map_ = std::move(*map);

    input_.page_size = 4096;
    input_.header_page = ReadText(kDir + "header_page");
    input_.header_event = ReadText(kDir + "header_event");
    for (const auto& entry : fs::recursive_directory_iterator(kDir + "formats")) {
      if (entry.path().filename() != "format") continue;
      const std::string system = entry.path().parent_path().parent_path().filename();
      input_.formats.push_back({system, ReadText(entry.path())});
    }
    input_.kallsyms = ReadText(kDir + "kallsyms");
    input_.trace_clock = "local";
    for (const BootMapCpu& cpu : map_.cpu) {
      auto& pages = input_.cpus.emplace_back();
      for (const BootMapPage& page : cpu.pages) {
        if (page.skipped || page.records == 0) continue;
        pages.push_back(std::span<const std::byte>(range_).subspan(page.offset, 4096));
      }
    }
  }
  void TearDown() override {
    if (std::getenv("HVTRACE_KEEP_TMP") == nullptr) fs::remove_all(dir_);
  }

  fs::path dir_;
  std::vector<std::byte> range_;
  BootMap map_;
  TraceDatWriterInput input_;
};

TEST_F(TraceDatWriterTest, TraceCmdReportShowsTheGuestsMarkers) {
  const std::string path = dir_ / "trace.dat";
  Status s = WriteTraceDat(path, input_);
  ASSERT_TRUE(s.ok()) << s.error().message;

  const std::string report = RunCommand("trace-cmd report -i '" + path + "' 2>&1");
  ASSERT_NE(report.find("print:"), std::string::npos) << report.substr(0, 2000);

  // The oracle: trace-cmd's text of our file against the guest's own trace.
  std::vector<std::byte> guest_bytes = Unzstd(kDir + "trace.txt.zst");
  const std::string guest(reinterpret_cast<const char*>(guest_bytes.data()), guest_bytes.size());
  const auto want =
      Markers(guest, std::regex(R"(\[(\d+)\]\s+\S+\s+(\d+\.\d{6}): (tracing_mark_write: .*)$)"));
  const auto got = Markers(
      report,
      // trace-cmd 3.3 (Debian 13) prints a latency column after the CPU.
      std::regex(R"(\[(\d+)\]\s+(?:\S{5,6}\s+)?(\d+\.\d{6}): print:\s+(tracing_mark_write: .*)$)"));
  EXPECT_EQ(want.size(), 10u);
  EXPECT_EQ(got, want);

  // Every event, per CPU.
  std::map<int, size_t> guest_count, report_count;
  std::regex cpu_re(R"(\[(\d{3})\])");
  std::istringstream gin(guest), rin(report);
  std::string line;
  while (std::getline(gin, line)) {
    std::smatch m;
    if (line[0] != '#' && std::regex_search(line, m, cpu_re)) guest_count[std::stoi(m[1])]++;
  }
  while (std::getline(rin, line)) {
    std::smatch m;
    if (std::regex_search(line, m, cpu_re)) report_count[std::stoi(m[1])]++;
  }
  EXPECT_EQ(report_count, guest_count);
}

// trace-cmd 3.4 stores a persistent instance's last_boot_info as option 24;
// a trace-cmd that predates it (Debian's 3.1.6) must still open the file and
// print the same events, and our reader must skip it.
TEST_F(TraceDatWriterTest, LastBootInfoOptionKeepsTheFileReadable) {
  const std::string plain = dir_ / "plain.dat", with = dir_ / "with.dat";
  ASSERT_TRUE(WriteTraceDat(plain, input_).ok());
  input_.last_boot_info = "boot_map:ffffffff9a000000\t[kernel]\nffffffffc0746000\tpvpanic_pci\n";
  Status s = WriteTraceDat(with, input_);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_NE(ReadText(with).find(input_.last_boot_info), std::string::npos);
  const std::string a = RunCommand("trace-cmd report -i '" + plain + "' 2>&1");
  const std::string b = RunCommand("trace-cmd report -i '" + with + "' 2>&1");
  ASSERT_NE(b.find("print:"), std::string::npos) << b.substr(0, 2000);
  EXPECT_EQ(a.substr(a.find('\n')), b.substr(b.find('\n')));  // After the "cpus=" line.
  auto read = TraceDat::Open(with);
  ASSERT_TRUE(read.ok()) << read.error().message;
}

TEST_F(TraceDatWriterTest, LibTraceCmdReadsEveryRecordWithItsTime) {
  const std::string path = dir_ / "trace.dat";
  ASSERT_TRUE(WriteTraceDat(path, input_).ok());
  tracecmd_input* handle = tracecmd_open(path.c_str(), kTracecmdNoPlugins);
  ASSERT_NE(handle, nullptr);
  tep_handle* tep = tracecmd_get_tep(handle);
  ASSERT_NE(tep, nullptr);
  EXPECT_NE(tep_find_event_by_name(tep, "ftrace", "print"), nullptr);
  EXPECT_NE(tep_find_event_by_name(tep, "sched", "sched_switch"), nullptr);
  for (const BootMapCpu& cpu : map_.cpu) {
    SCOPED_TRACE("cpu " + std::to_string(cpu.cpu));
    std::vector<uint64_t> got;
    for (tep_record* r = tracecmd_read_cpu_first(handle, cpu.cpu); r != nullptr;
         r = tracecmd_read_data(handle, cpu.cpu)) {
      got.push_back(r->ts);
      tracecmd_free_record(r);
    }
    std::vector<uint64_t> want;
    for (const BootMapRecord& r : cpu.records) want.push_back(r.timestamp);
    EXPECT_EQ(got.size(), want.size());
    EXPECT_EQ(got, want);
  }
  tracecmd_close(handle);
}

TEST_F(TraceDatWriterTest, ReplacesAnExistingFileAndLeavesNoTemporary) {
  const std::string path = dir_ / "trace.dat";
  { std::ofstream(path) << "old"; }
  ASSERT_TRUE(WriteTraceDat(path, input_).ok());
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1u);
  auto encoded = EncodeTraceDat(input_);
  ASSERT_TRUE(encoded.ok());
  EXPECT_EQ(ReadText(path), *encoded);
  EXPECT_EQ(encoded->size() % 4096, 0u);
}

// The bytes of the fixture's file as the writer made them before it wrote the
// whole file with a few writev calls (one write per page before, 2026-11-25):
// the sha256 and size of that writer's output, with the formats sorted so the
// input does not depend on directory order. Both durability modes write them.
TEST_F(TraceDatWriterTest, WritesTheSameBytesAsThePageByPageWriter) {
  std::sort(input_.formats.begin(), input_.formats.end(), [](const auto& a, const auto& b) {
    return std::tie(a.system, a.text) < std::tie(b.system, b.text);
  });
  auto encoded = EncodeTraceDat(input_);
  ASSERT_TRUE(encoded.ok());
  for (const TraceDatSync sync : {TraceDatSync::kDurable, TraceDatSync::kCallerSyncs}) {
    const std::string path = dir_ / "trace.dat";
    ASSERT_TRUE(WriteTraceDat(path, input_, sync).ok());
    EXPECT_EQ(fs::file_size(path), kPageByPageBytes);
    const std::string sum = RunCommand("sha256sum '" + path + "' | cut -c1-64");
    EXPECT_EQ(sum, std::string(kPageByPageSha256) + "\n");
    EXPECT_EQ(ReadText(path), *encoded);
  }
}

// More pages apart in memory than one writev takes (IOV_MAX): the file is
// still every page in order.
TEST(TraceDatWriterManyPagesTest, PagesApartInMemoryAreWrittenInOrder) {
  const fs::path dir = fs::temp_directory_path() / ("hvtrace-tdw-many-" + std::to_string(getpid()));
  fs::create_directories(dir);
  constexpr size_t kPages = 2500;  // > 2 * IOV_MAX (1024): three writev calls at least.
  std::vector<std::byte> memory(2 * kPages * 4096);
  TraceDatWriterInput in;
  in.header_page = "header";
  in.header_event = "event";
  in.cpus.resize(2);
  for (size_t i = 0; i < kPages; ++i) {
    // Every other page of |memory|: no two pages adjacent, one span each.
    std::span<std::byte> page = std::span(memory).subspan(2 * i * 4096, 4096);
    std::fill(page.begin(), page.end(), std::byte(i % 251 + 1));
    in.cpus[i % 2].push_back(page);
  }
  auto encoded = EncodeTraceDat(in);
  ASSERT_TRUE(encoded.ok());
  const std::string path = dir / "trace.dat";
  ASSERT_TRUE(WriteTraceDat(path, in, TraceDatSync::kCallerSyncs).ok());
  const std::string written = ReadText(path);
  EXPECT_EQ(written.size(), encoded->size());
  EXPECT_TRUE(written == *encoded);
  // The last page of CPU 1 ends the file.
  EXPECT_EQ(static_cast<unsigned char>(written.back()), (kPages - 1) % 251 + 1);
  fs::remove_all(dir);
}

TEST_F(TraceDatWriterTest, MissingDirectoryIsReportedWithThePath) {
  const std::string path = dir_ / "no-such-dir" / "trace.dat";
  Status s = WriteTraceDat(path, input_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find(path), std::string::npos) << s.error().message;
}

TEST_F(TraceDatWriterTest, ShortWriteIsReportedAndNothingIsLeft) {
  // A file size limit makes write(2) fail part way, like a full disk.
  const std::string path = dir_ / "trace.dat";
  struct sigaction ignore = {}, old = {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGXFSZ, &ignore, &old), 0);
  rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit small = saved;
  small.rlim_cur = 100 * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  Status s = WriteTraceDat(path, input_);
  setrlimit(RLIMIT_FSIZE, &saved);
  sigaction(SIGXFSZ, &old, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find(path), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("File too large"), std::string::npos) << s.error().message;
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(TraceDatWriterTest, Malicious_PageOfTheWrongSizeIsRefused) {
  std::vector<std::byte> half(2048);
  input_.cpus[1].push_back(half);
  Status s = WriteTraceDat(dir_ / "trace.dat", input_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("CPU 1"), std::string::npos) << s.error().message;
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(TraceDatWriterTest, Malicious_ClockNameCannotBreakTheClockLine) {
  input_.trace_clock = "local] [x";
  EXPECT_FALSE(WriteTraceDat(dir_ / "trace.dat", input_).ok());
}

// One trace.dat per boot from the real kexec fixture: each opens in trace-cmd
// and holds exactly its boot's records and markers.
TEST(TraceDatWriterKexecTest, OneFilePerBoot) {
  const std::string dir = kDir + "kexec/";
  std::vector<std::byte> range = Unzstd(dir + "region.bin.zst");
  ASSERT_EQ(range.size(), 16u << 20);
  BootMapOptions options;
  auto layout = PageLayout::FromHeaderPage(ReadText(dir + "header_page"), 4096);
  ASSERT_TRUE(layout.ok());
  options.layout = *layout;
  auto map = ReadBootMap(range, options);
  ASSERT_TRUE(map.ok()) << map.error().message;
  ASSERT_EQ(map->boots, 2u);
  const fs::path tmp =
      fs::temp_directory_path() / ("hvtrace-tdw-kexec-" + std::to_string(getpid()));
  fs::create_directories(tmp);
  for (uint32_t boot = 0; boot < map->boots; ++boot) {
    SCOPED_TRACE("boot " + std::to_string(boot));
    TraceDatWriterInput input;
    input.header_page = ReadText(dir + "header_page");
    input.header_event = ReadText(dir + "header_event");
    for (const auto& entry : fs::recursive_directory_iterator(dir + "formats")) {
      if (entry.path().filename() != "format") continue;
      input.formats.push_back(
          {entry.path().parent_path().parent_path().filename(), ReadText(entry.path())});
    }
    std::map<int, size_t> want;
    for (const BootMapCpu& cpu : map->cpu) {
      auto& pages = input.cpus.emplace_back();
      for (const BootMapPage& page : cpu.pages) {
        if (page.skipped || page.records == 0 || page.boot != boot) continue;
        pages.push_back(std::span<const std::byte>(range).subspan(page.offset, 4096));
      }
      for (const BootMapRecord& r : cpu.records) want[cpu.cpu] += r.boot == boot;
    }
    const std::string path = tmp / ("boot" + std::to_string(boot) + ".dat");
    ASSERT_TRUE(WriteTraceDat(path, input).ok());
    const std::string report = RunCommand("trace-cmd report -i '" + path + "' 2>&1");
    std::map<int, size_t> got;
    std::set<std::string> markers;
    std::istringstream in(report);
    std::string line;
    const std::regex cpu_re(R"(\[(\d{3})\])"), marker_re(R"(hvtrace-marker-(boot\d)-\d)");
    while (std::getline(in, line)) {
      std::smatch m;
      if (std::regex_search(line, m, cpu_re)) got[std::stoi(m[1])]++;
      if (std::regex_search(line, m, marker_re)) markers.insert(m[0]);
    }
    EXPECT_EQ(got, want);
    ASSERT_EQ(markers.size(), 6u);
    for (const std::string& marker : markers) {
      EXPECT_NE(marker.find("boot" + std::to_string(boot)), std::string::npos) << marker;
    }
  }
  fs::remove_all(tmp);
}

TEST(TraceDatWriterEmptyTest, NoCpusStillOpens) {
  TraceDatWriterInput input;
  input.header_page = ReadText(kDir + "header_page");
  input.header_event = ReadText(kDir + "header_event");
  input.cpus.resize(2);
  const fs::path path =
      fs::temp_directory_path() / ("hvtrace-tdw-empty-" + std::to_string(getpid()) + ".dat");
  ASSERT_TRUE(WriteTraceDat(path, input).ok());
  tracecmd_input* handle = tracecmd_open(path.c_str(), kTracecmdNoPlugins);
  EXPECT_NE(handle, nullptr);
  if (handle != nullptr) {
    EXPECT_EQ(tracecmd_read_cpu_first(handle, 0), nullptr);
    tracecmd_close(handle);
  }
  fs::remove(path);
}

}  // namespace
}  // namespace hvtrace
