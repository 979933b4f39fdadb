#include "unified_diff.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "test_support.h"

namespace hvtrace::cli {
namespace {

// What `diff -u` prints for the same texts, without its two header lines
// (they carry file times).
std::string SystemDiff(const std::string& a, const std::string& b) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("unified_diff_test." + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "a") << a;
  std::ofstream(dir / "b") << b;
  const std::string cmd = "diff -u " + (dir / "a").string() + " " + (dir / "b").string();
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    ::pclose(p);
  }
  std::filesystem::remove_all(dir);
  for (int i = 0; i < 2 && !out.empty(); ++i) out.erase(0, out.find('\n') + 1);
  return out;
}

std::string Ours(const std::string& a, const std::string& b) {
  std::string out = UnifiedDiff(a, b, "a", "b");
  for (int i = 0; i < 2 && !out.empty(); ++i) out.erase(0, out.find('\n') + 1);
  return out;
}

std::string Numbered(int from, int to, const std::string& tag = "") {
  std::string s;
  for (int i = from; i <= to; ++i) s += "line " + std::to_string(i) + tag + "\n";
  return s;
}

TEST(UnifiedDiff, EqualTextsGiveNothing) {
  EXPECT_EQ(UnifiedDiff("a\nb\n", "a\nb\n", "x", "y"), "");
}

TEST(UnifiedDiff, MatchesDiffU) {
  const std::string base = Numbered(1, 40);
  const std::string inserted = Numbered(1, 10) + "new A\nnew B\n" + Numbered(11, 40);
  const std::string removed = Numbered(1, 4) + Numbered(6, 30) + Numbered(32, 40);
  const std::string changed = Numbered(1, 19) + "line 20 changed\n" + Numbered(21, 38);
  const std::string head = "first\n" + base;
  for (const std::string* other : {&inserted, &removed, &changed, &head}) {
    EXPECT_EQ(Ours(base, *other), SystemDiff(base, *other)) << *other;
    EXPECT_EQ(Ours(*other, base), SystemDiff(*other, base)) << *other;
  }
  EXPECT_EQ(Ours("", "a\n"), SystemDiff("", "a\n"));
}

TEST(UnifiedDiff, SetupOfADomainMatchesDiffU) {
  const std::string before =
      test_support::ReadText(std::string(HVTRACE_FIXTURES_DIR) + "/libvirt/setup-pc.xml");
  const std::string after =
      test_support::ReadText(std::string(HVTRACE_FIXTURES_DIR) + "/libvirt/setup-pc-defined.xml");
  const std::string ours = Ours(before, after);
  EXPECT_EQ(ours, SystemDiff(before, after));
  EXPECT_NE(ours.find("+      <cell id='1'"), std::string::npos) << ours;
}

}  // namespace
}  // namespace hvtrace::cli
