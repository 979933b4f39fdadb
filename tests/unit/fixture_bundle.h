// The real 6.12 boot_map fixture kernel (tests/fixtures/boot_map) as a
// harvest bundles it: release, header pages and every event format, sorted by
// system and name as ParseHarvestArchive gives them. Tests that need
// kallsyms, printk formats or modules set them on the result.
#ifndef HVTRACE_TESTS_UNIT_FIXTURE_BUNDLE_H_
#define HVTRACE_TESTS_UNIT_FIXTURE_BUNDLE_H_

#include <algorithm>
#include <filesystem>
#include <tuple>

#include "formats_bundle.h"
#include "test_support.h"

namespace hvtrace::test_support {

inline const std::filesystem::path kBootMapFixtures =
    std::filesystem::path(HVTRACE_FIXTURES_DIR) / "boot_map";

inline hostd::HarvestBundle BootMapFixtureBundle() {
  hostd::HarvestBundle b;
  b.release = "6.12.95+deb12-amd64";
  b.header_page = ReadText(kBootMapFixtures / "header_page");
  b.header_event = ReadText(kBootMapFixtures / "header_event");
  for (const auto& e :
       std::filesystem::recursive_directory_iterator(kBootMapFixtures / "formats")) {
    if (e.path().filename() != "format") continue;
    hostd::HarvestedEvent ev;
    ev.name = e.path().parent_path().filename().string();
    ev.system = e.path().parent_path().parent_path().filename().string();
    ev.text = ReadText(e.path());
    b.events.push_back(ev);
  }
  std::sort(b.events.begin(), b.events.end(), [](const auto& x, const auto& y) {
    return std::tie(x.system, x.name) < std::tie(y.system, y.name);
  });
  return b;
}

}  // namespace hvtrace::test_support

#endif  // HVTRACE_TESTS_UNIT_FIXTURE_BUNDLE_H_
