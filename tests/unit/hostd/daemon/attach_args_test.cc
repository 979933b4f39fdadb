#include "attach_args.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "live_region.h"

namespace hvtrace::hostd {
namespace {

using nlohmann::json;

TEST(AttachArgs, Defaults) {
  auto a = ParseAttachArgs({{"name", "vm1"}});
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->name, "vm1");
  EXPECT_TRUE(a->qmp.empty());
  EXPECT_EQ(a->options.size_bytes, 16ull << 20);
  EXPECT_EQ(a->options.pump_interval_ms, 50u);
  EXPECT_EQ(a->options.wait.count(), 30000);
  EXPECT_EQ(a->options.events, "");
}

TEST(AttachArgs, AllFields) {
  auto a = ParseAttachArgs({{"name", "vm-2"},
                            {"qmp", "/run/x.qmp"},
                            {"size_mib", 4},
                            {"events", "sched:sched_switch"},
                            {"pump_interval_ms", 20},
                            {"wait_ms", 0}});
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->qmp, "/run/x.qmp");
  EXPECT_EQ(a->options.size_bytes, 4ull << 20);
  EXPECT_EQ(a->options.events, "sched:sched_switch");
  EXPECT_EQ(a->options.pump_interval_ms, 20u);
  EXPECT_EQ(a->options.wait.count(), 0);
}

TEST(AttachArgs, SizeThatQemuCannotMapIsRefusedWithTheReason) {
  auto a = ParseAttachArgs({{"name", "vm1"}, {"size_mib", 12}});
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.error().message.find("power of two"), std::string::npos) << a.error().message;
  EXPECT_NE(a.error().message.find("QEMU"), std::string::npos) << a.error().message;
  EXPECT_FALSE(ParseAttachArgs({{"name", "vm1"}, {"size_mib", 0}}).ok());
  EXPECT_TRUE(ParseAttachArgs({{"name", "vm1"}, {"size_mib", 1}}).ok());
}

TEST(AttachArgs, Malicious_WrongTypesAndNames) {
  EXPECT_FALSE(ParseAttachArgs(json::array()).ok());
  EXPECT_FALSE(ParseAttachArgs(json::object()).ok());
  EXPECT_FALSE(ParseAttachArgs({{"name", 5}}).ok());
  EXPECT_FALSE(ParseAttachArgs({{"name", "../etc"}}).ok());
  EXPECT_FALSE(ParseAttachArgs({{"name", "vm1"}, {"size_mib", -4}}).ok());
  EXPECT_FALSE(ParseAttachArgs({{"name", "vm1"}, {"size_mib", "16M"}}).ok());
  EXPECT_FALSE(ParseAttachArgs({{"name", "vm1"}, {"pump_interval_ms", 0}}).ok());
  EXPECT_FALSE(ParseAttachArgs({{"name", "vm1"}, {"events", std::string(5000, 'x')}}).ok());
  EXPECT_FALSE(ParseAttachArgs({{"name", "vm1"}, {"qmp", json::array()}}).ok());
}

TEST(DetachArgs, DefaultsAndErrors) {
  auto d = ParseDetachArgs({{"name", "vm1"}});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->timeout.count(), 10000);
  EXPECT_EQ(ParseDetachArgs({{"name", "vm1"}, {"timeout_ms", 500}})->timeout.count(), 500);
  EXPECT_FALSE(ParseDetachArgs({{"name", "vm1"}, {"timeout_ms", 0}}).ok());
  EXPECT_FALSE(ParseDetachArgs(json::object()).ok());
}

TEST(StreamArgs, FormatAndFrom) {
  auto s = ParseStreamArgs({{"name", "vm1"}});
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->json);
  EXPECT_FALSE(s->from_start);
  s = ParseStreamArgs({{"name", "vm1"}, {"format", "json"}, {"from", "start"}});
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->json);
  EXPECT_TRUE(s->from_start);
  EXPECT_FALSE(ParseStreamArgs({{"name", "vm1"}, {"format", "xml"}}).ok());
  EXPECT_FALSE(ParseStreamArgs({{"name", "vm1"}, {"from", "yesterday"}}).ok());
}

TEST(LiveRegion, CreateWritesTheHeaderAndRefusesAnExistingFile) {
  const std::string path = "/tmp/attach_args_test_region_" + std::to_string(::getpid());
  std::filesystem::remove(path);
  LiveRegionOptions o;
  o.path = path;
  o.size_bytes = 1 << 20;
  o.max_cpus = 2;
  o.events = "sched:sched_switch";
  o.pump_interval_ms = 25;
  auto r = LiveRegion::Create(o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(std::filesystem::file_size(path), 1u << 20);
  EXPECT_EQ((*r)->geometry().max_cpus, 2u);
  auto* req =
      reinterpret_cast<const region::HostRequests*>((*r)->data() + region::kHostRequestsOffset);
  EXPECT_EQ(req->pump_interval_ms, 25u);
  EXPECT_EQ(std::string(req->events, req->events_len), "sched:sched_switch");
  const uint64_t seq = req->request_seq;
  (*r)->SetEvents("irq:*");
  EXPECT_EQ(req->request_seq, seq + 1);
  EXPECT_EQ(std::string(req->events, req->events_len), "irq:*");

  // A second region on the same path is refused unless asked to replace.
  auto again = LiveRegion::Create(o);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.error().message.find(path), std::string::npos);
  auto reopened = LiveRegion::OpenExisting(path);
  ASSERT_TRUE(reopened.ok()) << reopened.error().message;
  EXPECT_EQ((*reopened)->geometry(), (*r)->geometry());
  o.replace_existing = true;
  auto replaced = LiveRegion::Create(o);
  ASSERT_TRUE(replaced.ok()) << replaced.error().message;
  EXPECT_NE((*replaced)->geometry().region_id, (*r)->geometry().region_id);
  std::filesystem::remove(path);

  o.size_bytes = 3 << 20;
  auto odd = LiveRegion::Create(o);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.error().message.find("power of two"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace hvtrace::hostd
