// `hvtrace show CAPTURE --format perfetto -o FILE`, run as a user runs it,
// on a capture directory made of a real trace.dat.
#include "show_perfetto.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "hvtrace/perfetto_writer.h"
#include "shared/decode/perfetto_reader.h"
#include "test_support.h"

namespace hvtrace::cli {
namespace {

namespace fs = std::filesystem;
using test_support::RunCommandStatus;

std::string Hvtrace() { return std::string(HVTRACE_BIN_DIR) + "/hvtrace"; }

// `hvtrace show DIR FLAGS --format perfetto -o OUT`, stderr included.
test_support::CommandResult RunShowPerfetto(const fs::path& dir, const fs::path& out,
                                            const std::string& flags = "") {
  return RunCommandStatus(Hvtrace() + " show '" + dir.string() + "' " + flags +
                          " --format perfetto -o '" + out.string() + "' 2>&1");
}

void WriteFile(const fs::path& path, const std::string& text) {
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
}

// A capture directory: a manifest naming the kernel and a crash in boot 0,
// and boot-0.trace.dat (a real trace).
void MakeCapture(const fs::path& dir, const std::string& boot0) {
  const nlohmann::json manifest = {
      {"id", "c1"},
      {"vm", "vm1"},
      {"trigger", "panic"},
      {"kernel", {{"release", "6.12.9-test"}}},
      {"cpus", nlohmann::json::array({{{"cpu", 0}}, {{"cpu", 1}}})},
      {"crash",
       {{"boot", 0},
        {"kind", "panic"},
        {"panic_line", "Kernel panic - not syncing: sysrq triggered crash"},
        {"task", "sh"},
        {"pid", 1},
        {"cpu", 0},
        {"ts_ns", 1000}}}};
  WriteFile(dir / "manifest.json", manifest.dump());
  WriteFile(dir / "boot-0.trace.dat", boot0);
}

TEST(ShowPerfetto, WritesTheTraceWithTheCrashAsAnInstant) {
  test_support::TempDir dir;
  MakeCapture(dir.path(), test_support::ReadFixture("tracedat/real-v7.dat"));
  const fs::path out = dir.path() / "out.pftrace";
  const auto r = RunShowPerfetto(dir.path(), out);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_FALSE(fs::exists(out.string() + ".tmp"));
  const test::ReadTrace t = test::ReadPerfettoTrace(test_support::ReadText(out.string()));
  ASSERT_TRUE(t.ok) << t.error;
  EXPECT_TRUE(t.system_info_first);
  EXPECT_EQ(t.release, "6.12.9-test");
  EXPECT_EQ(t.num_cpus, 2u);
  ASSERT_EQ(t.track_names.size(), 1u);
  EXPECT_EQ(t.track_names[0], "guest vm1 boot 0 (6.12.9-test)");
  ASSERT_EQ(t.instant_names.size(), 1u);
  EXPECT_EQ(t.instant_names[0], "crash (panic): Kernel panic - not syncing: sysrq triggered crash");
  EXPECT_GT(t.events.size(), 1000u);
}

TEST(ShowPerfetto, Malicious_BadCaptureLeavesNoFile) {
  test_support::TempDir dir;
  MakeCapture(dir.path(), "\x17\x08\x44tracing6 and then nothing a trace.dat holds");
  const fs::path out = dir.path() / "out.pftrace";
  const auto r = RunShowPerfetto(dir.path(), out);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("boot-0.trace.dat"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("not written"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out.string() + ".tmp"));
}

TEST(ShowPerfetto, TimelineWithoutHostFilesSaysSo) {
  test_support::TempDir dir;
  MakeCapture(dir.path(), test_support::ReadFixture("tracedat/real-v7.dat"));
  const fs::path out = dir.path() / "out.pftrace";
  const auto r = RunShowPerfetto(dir.path(), out, "--timeline");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("has no timeline"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out));
}

TEST(ShowPerfetto, NeedsAnOutputFile) {
  test_support::TempDir dir;
  MakeCapture(dir.path(), test_support::ReadFixture("tracedat/real-v7.dat"));
  const auto r =
      RunCommandStatus(Hvtrace() + " show '" + dir.path().string() + "' --format perfetto 2>&1");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("needs -o FILE"), std::string::npos) << r.out;
}

TEST(ShowPerfetto, CrashInstantOnlyForItsBoot) {
  const nlohmann::json manifest = {{"crash", {{"boot", 1}, {"kind", "oops"}, {"ts_ns", 5}}}};
  test_support::TempDir dir;
  const fs::path out = dir.path() / "x";
  FILE* f = std::fopen(out.c_str(), "w");
  ASSERT_NE(f, nullptr);
  PerfettoTraceWriter w(fileno(f));
  EXPECT_FALSE(AddCrashInstant(manifest, 0, w));
  EXPECT_TRUE(AddCrashInstant(manifest, 1, w));
  EXPECT_FALSE(AddCrashInstant(nlohmann::json::object(), 1, w));
  EXPECT_TRUE(w.Finish().ok());
  std::fclose(f);
}

}  // namespace
}  // namespace hvtrace::cli
