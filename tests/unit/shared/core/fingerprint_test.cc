#include "hvtrace/fingerprint.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

namespace hvtrace {
namespace {

EventFormat SchedSwitch() {
  std::ifstream in(std::string(HVTRACE_FIXTURES_DIR) + "/fuzz/format/sched_sched_switch.format");
  std::stringstream ss;
  ss << in.rdbuf();
  auto ev = ParseEventFormat("sched", ss.str());
  EXPECT_TRUE(ev.ok());
  return ev.ok() ? *ev : EventFormat{};
}

// The value is part of the on-disk contract (agents publish it, captures keep
// it; computed independently with a few lines of Python over the documented
// byte string): if this test fails, the canonical string changed and every stored
// fingerprint is invalid. Bump the version prefix instead.
TEST(FingerprintTest, GoldenValue) {
  EventFormat ev;
  ev.system = "sched";
  ev.name = "sched_switch";
  ev.id = 372;
  ev.fields = {
      {"common_type", "unsigned short", 0, 2, false, FieldKind::kScalar, 0, true},
      {"prev_comm", "char[16]", 8, 16, false, FieldKind::kArray, 16, false},
      {"prev_pid", "pid_t", 24, 4, true, FieldKind::kScalar, 0, false},
  };
  std::string bytes = FingerprintBytes(ev);
  std::string expected("hvtrace-event-fp-v1\0sched\0sched_switch\0\x03\0\0\0", 41);
  ASSERT_EQ(bytes.substr(0, expected.size()), expected);
  EXPECT_EQ(EventFingerprint(ev), 0xbb3088f2304fa840ULL) << std::hex << EventFingerprint(ev);
}

TEST(FingerprintTest, StableAcrossIdAndPrintFormat) {
  EventFormat a = SchedSwitch();
  EventFormat b = a;
  b.id = 9999;
  b.print_fmt = "\"different\"";
  EXPECT_EQ(EventFingerprint(a), EventFingerprint(b));
}

TEST(FingerprintTest, EveryLayoutPropertyChangesIt) {
  const EventFormat base = SchedSwitch();
  ASSERT_GT(base.fields.size(), 5u);
  std::set<uint64_t> seen = {EventFingerprint(base)};
  auto expect_new = [&](const EventFormat& changed, const char* what) {
    EXPECT_TRUE(seen.insert(EventFingerprint(changed)).second) << what;
  };
  EventFormat e = base;
  e.system = "sched2";
  expect_new(e, "system");
  e = base;
  e.name = "sched_switch2";
  expect_new(e, "name");
  e = base;
  e.fields[5].name = "prev_pid2";
  expect_new(e, "field name");
  e = base;
  e.fields[5].type = "int";
  expect_new(e, "field type");
  e = base;
  e.fields[5].offset += 4;
  expect_new(e, "field offset");
  e = base;
  e.fields[5].size = 8;
  expect_new(e, "field size");
  e = base;
  e.fields[5].is_signed = !e.fields[5].is_signed;
  expect_new(e, "signedness");
  e = base;
  std::swap(e.fields[5], e.fields[6]);
  expect_new(e, "field order");
  e = base;
  e.fields.pop_back();
  expect_new(e, "field removed");
  // Moving a byte between adjacent strings must not collide.
  e = base;
  e.system = "sche";
  e.name = "dsched_switch";
  expect_new(e, "system/name boundary");
}

}  // namespace
}  // namespace hvtrace
