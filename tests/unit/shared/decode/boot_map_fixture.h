// What the boot_map fixtures' tests share (tests/fixtures/boot_map/, and
// linux-7.3/ beside it): the guest's own trace file as lines, and the reader
// options a fixture directory's header_page gives.
#ifndef HVTRACE_TESTS_BOOT_MAP_FIXTURE_H_
#define HVTRACE_TESTS_BOOT_MAP_FIXTURE_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "hvtrace/boot_map.h"
#include "hvtrace/page.h"
#include "test_support.h"

namespace hvtrace::boot_map_fixture {

// One event line of the guest's trace file.
struct TraceLine {
  int cpu;
  uint64_t usecs;
  std::string event;  // "tracing_mark_write: hvtrace-marker-m-0", ...
};

// The event lines of a zstd-compressed `trace` file the guest printed.
inline std::vector<TraceLine> GuestTrace(const std::string& file) {
  std::vector<std::byte> bytes = test_support::Unzstd(file);
  std::istringstream in(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  static const std::regex kLine(R"(^\s*.+-\d+\s+\[(\d+)\]\s+\S+\s+(\d+)\.(\d{6}): (.*)$)");
  std::vector<TraceLine> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::smatch m;
    if (!std::regex_match(line, m, kLine)) {
      ADD_FAILURE() << "unparsed trace line: " << line;
      continue;
    }
    lines.push_back({std::stoi(m[1]), std::stoull(m[2]) * 1000000 + std::stoull(m[3]), m[4]});
  }
  return lines;
}

// The kernel prints time stamps rounded to the microsecond (ns2usecs).
inline uint64_t Usecs(uint64_t ns) { return (ns + 500) / 1000; }

// Reader options with the page layout of |dir|'s header_page ("dir/").
inline BootMapOptions FixtureOptions(const std::string& dir) {
  BootMapOptions options;
  auto layout = PageLayout::FromHeaderPage(test_support::ReadText(dir + "header_page"), 4096);
  EXPECT_TRUE(layout.ok()) << dir;
  if (layout.ok()) options.layout = *layout;
  return options;
}

}  // namespace hvtrace::boot_map_fixture

#endif  // HVTRACE_TESTS_BOOT_MAP_FIXTURE_H_
