#include "replies.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "attach_reply.h"
#include "formats_replies.h"
#include "upload_stats.h"

namespace hvtrace::hostd {
namespace {

using nlohmann::json;
using testing::HasSubstr;

// Through text, as the CLI receives it.
template <class M>
Result<M> ThroughWire(const M& reply) {
  return ParseMessage<M>(json::parse(MessageToJson(reply).dump()), "reply", "test");
}

template <class M>
void ExpectRoundTrip(const M& reply) {
  auto back = ThroughWire(reply);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(MessageToJson(*back), MessageToJson(reply));
}

template <class M>
std::string ErrorOf(const json& result) {
  auto r = ParseMessage<M>(result, "reply", "test");
  return r.ok() ? std::string("(parsed)") : r.error().message;
}

TEST(Replies, StatusRoundTripsWithNestedAndOpaqueFields) {
  VmStatusReply status;
  status.name = "vm1";
  status.kind = "qmp";
  status.state = "running";
  status.events_seen = 7;
  status.captures_taken = 2;
  status.captures_coalesced = json{{"panic", 3}};
  status.capture_queue = json{{"in_flight", true}, {"pending", json::array()}};
  status.meta = json{{"state", "connected"}, {"boots_accepted", 1}};
  status.last_error = "QMP EOF";
  status.last_capture = CaptureRef{{}, "20261129-1", "panic", 14.5};
  status.formats = "loaded";
  ExpectRoundTrip(status);
  ListReply list;
  list.vms = {status, VmStatusReply{}};
  ExpectRoundTrip(list);
}

// Every field is written, a count of 0 too (`--json` shows the same keys
// every time); an unset optional is left out, and null reads as unset.
TEST(Replies, WriteEveryFieldButUnsetOptionals) {
  const json j = MessageToJson(VmStatusReply{});
  EXPECT_EQ(j.at("captures_taken"), 0);
  EXPECT_EQ(j.at("captures_dir"), "");
  EXPECT_FALSE(j.contains("last_capture"));
  EXPECT_FALSE(j.contains("last_error"));
  EXPECT_TRUE(j.at("meta").is_null());  // A document: null when there is none.
  json attach = MessageToJson(AttachReply{});
  EXPECT_FALSE(attach.contains("guest"));
  EXPECT_FALSE(attach.at("device").contains("bus"));
  attach["guest"] = nullptr;
  auto back = ParseMessage<AttachReply>(attach, "reply");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_FALSE(back->guest.has_value());
}

TEST(Replies, AttachAndDetachRoundTrip) {
  AttachReply a;
  a.name = "vm1";
  a.region = AttachedRegion{{}, "/dev/shm/hvtrace-vm1-attach", 16u << 20, "00ab"};
  a.device.id = "hvtrace-region";
  a.device.memdev = "hvtrace-mem";
  a.device.bus = "hvtrace-port";
  a.transport = json{{"kind", "qmp"}, {"qemu_uid", 0}};
  a.plug_ms = 3.25;
  a.announce_ms = 120.5;
  AgentAnnouncement g;
  g.boot_id = "8c1d3c1e-0000-4000-8000-000000000001";
  g.kernel_release = "6.12.57";
  g.nr_cpus = 2;
  g.trace_clock = "mono";
  a.guest = g;
  ExpectRoundTrip(a);
  DetachReply d;
  d.name = "vm1";
  d.device = "hvtrace-region";
  d.device_deleted_ms = 40;
  d.region.file = a.region.file;
  d.object_del_error = "hvtrace-mem: in use";
  ExpectRoundTrip(d);
}

TEST(Replies, TheRestRoundTrip) {
  PingReply ping;
  ping.pid = 42;
  ping.uptime_ms = 1000;
  UploadStats upload;
  upload.enabled = true;
  upload.endpoint = "http://127.0.0.1:7480";
  UploadCaptureState row;
  row.vm = "vm1";
  row.state = "pending";
  row.objects = 4;
  upload.captures.push_back(row);
  ping.upload = MessageToJson(upload);
  ExpectRoundTrip(ping);
  auto parsed_upload = ParseMessage<UploadStats>(ThroughWire(ping)->upload, "reply.upload");
  ASSERT_TRUE(parsed_upload.ok()) << parsed_upload.error().message;
  EXPECT_EQ(parsed_upload->captures.at(0).objects, 4u);
  EXPECT_FALSE(parsed_upload->captures.at(0).objects_done.has_value());

  BootReply boot;
  boot.name = "g1";
  boot.argv = {"qemu-system-x86_64", "-m", "1024"};
  boot.region = BootRegionReply{{}, "/dev/shm/g1", 0, 16u << 20, 0x100000000};
  boot.kvm_probe = "no /dev/kvm";
  ExpectRoundTrip(boot);
  AdoptReply adopt;
  adopt.name = "d1";
  adopt.domain = "d1";
  adopt.boot_range = json{{"gpa", "0x100000000"}, {"note", "add memmap"}};
  ExpectRoundTrip(adopt);
  FormatsListReply formats;
  formats.kernels.push_back(
      FormatsKernelRow{{}, "k", "6.12", "/boot/vmlinuz", 1500, "t", "cached"});
  formats.harvests.push_back(FormatsHarvestRow{{}, "k2", "harvesting"});
  formats.problems = {"entry x: unreadable"};
  ExpectRoundTrip(formats);
  SetupReply setup;
  setup.domain = "d1";
  setup.changes = {"added NUMA cell 1"};
  setup.boot_range = SetupBootRange{{}, 0x100000000, 64u << 20};
  ExpectRoundTrip(setup);
  ExpectRoundTrip(StreamEndReply{{}, "vm gone", 10, 1});
  ExpectRoundTrip(CaptureFilesReply{{}, "vm1", "c1", "/var/lib/hvtrace/vms/vm1/captures/c1", 3});
  ExpectRoundTrip(ManualCaptureReply{{}, "c1", "manual", 9.5});
  ExpectRoundTrip(StopReply{{}, "vm1", "libvirt", true});
}

// The CLI reads strictly: a key the mapping does not list, a wrong type or
// a missing required field is refused, the error naming where it was.
TEST(Replies, AreReadStrictlyWithThePathInTheError) {
  EXPECT_THAT(ErrorOf<PingReply>({{"pong", true}, {"colour", "red"}}),
              HasSubstr("unknown key reply.colour"));
  EXPECT_THAT(ErrorOf<PingReply>({{"uptime_ms", -1}}),
              HasSubstr("reply.uptime_ms must be a non-negative integer"));
  EXPECT_THAT(ErrorOf<ManualCaptureReply>({{"trigger_to_disk_ms", "fast"}}),
              HasSubstr("reply.trigger_to_disk_ms must be a number"));
  EXPECT_THAT(ErrorOf<BootReply>({{"region", {{"size", "big"}}}}),
              HasSubstr("reply.region.size must be a non-negative integer"));
  EXPECT_THAT(ErrorOf<BootReply>({{"region", 5}}), HasSubstr("reply.region must be an object"));
  EXPECT_THAT(ErrorOf<ListReply>(json::parse(R"({"vms": [{"name": "a"}, {"state": 3}]})")),
              HasSubstr("reply.vms[1].state must be a string"));
  EXPECT_THAT(ErrorOf<ListReply>(json::parse(R"({"vms": ["a"]})")),
              HasSubstr("reply.vms[0] must be an object"));
  EXPECT_THAT(ErrorOf<ListReply>({{"vms", "none"}}), HasSubstr("reply.vms must be a list"));
  EXPECT_THAT(ErrorOf<AttachReply>({{"guest", {{"nr_cpus", 2}, {"extra", 1}}}}),
              HasSubstr("unknown key reply.guest.extra"));
  EXPECT_THAT(ErrorOf<CaptureFileItem>({{"file", "manifest.json"}}),
              HasSubstr("reply.bytes is required"));
  EXPECT_EQ(ErrorOf<CaptureFileItem>({{"file", "manifest.json"}, {"bytes", 10}}), "(parsed)");
}

}  // namespace
}  // namespace hvtrace::hostd
