#include "requests.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "boot_request.h"

namespace hvtrace::hostd {
namespace {

using nlohmann::json;
using testing::HasSubstr;

// Through text, as the daemon receives it (a parsed number is unsigned).
template <class M>
Result<M> ThroughWire(const M& message) {
  return ParseMessage<M>(json::parse(MessageToJson(message).dump()));
}

template <class M>
std::string ErrorOf(const json& args) {
  auto r = ParseMessage<M>(args);
  return r.ok() ? std::string("(parsed)") : r.error().message;
}

// Each message with every field set away from its default comes back the
// same through the wire.
template <class M>
void ExpectRoundTrip(const M& message) {
  auto back = ThroughWire(message);
  ASSERT_TRUE(back.ok()) << M::kCommand << ": " << back.error().message;
  EXPECT_EQ(MessageToJson(*back), MessageToJson(message)) << M::kCommand;
}

TEST(Requests, EachRoundTrips) {
  ExpectRoundTrip(PingRequest{});
  ExpectRoundTrip(VersionRequest{});
  ExpectRoundTrip(ListRequest{});
  ExpectRoundTrip(ShutdownRequest{});
  ExpectRoundTrip(FormatsListRequest{});
  StatusRequest status;
  status.name = "vm1";
  ExpectRoundTrip(status);
  const json spelled = status;  // nlohmann's spelling writes the same mapping.
  EXPECT_EQ(spelled, MessageToJson(status));
  CapturesRequest captures;
  captures.name = "vm1";
  ExpectRoundTrip(captures);
  ManualCaptureRequest capture;
  capture.name = "vm1";
  ExpectRoundTrip(capture);
  StopRequest stop;
  stop.name = "vm1";
  ExpectRoundTrip(stop);
  ExpectRoundTrip(CaptureFilesRequest{.capture = "20260101-x", .name = "vm1"});
  ExpectRoundTrip(StreamRequest{.name = "vm1", .format = "json", .from = "start"});
  ExpectRoundTrip(AttachRequest{.name = "vm-2",
                                .qmp = "/run/x.qmp",
                                .size_mib = 4,
                                .events = "sched:sched_switch",
                                .pump_interval_ms = 20,
                                .wait_ms = 0});
  ExpectRoundTrip(DetachRequest{.name = "vm1", .timeout_ms = 500});
  ExpectRoundTrip(AdoptRequest{.name = "vm1",
                               .qmp = "/run/vm1.qmp",
                               .boot_region = "/dev/shm/f@0x1000:16M",
                               .boot_region_fd = 0,
                               .domain = std::nullopt});
  ExpectRoundTrip(AdoptRequest{.name = "web1",
                               .qmp = std::nullopt,
                               .boot_region = std::nullopt,
                               .boot_region_fd = std::nullopt,
                               .domain = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"});
  FormatsHarvestRequest harvest;
  harvest.kernel = "/boot/vmlinuz";
  harvest.kernel_fd = 0;
  harvest.timeout_ms = 5000;
  ExpectRoundTrip(harvest);
  ExpectRoundTrip(SetupRequest{
      .domain = "web1", .range = 32u << 20, .events = "sched:*", .dry_run = true, .undo = false});
  BootRequest boot;
  boot.name = "g1";
  boot.kernel = "/k";
  boot.initrd = "/i";
  boot.cpus = 4;
  boot.trace_boot = true;
  boot.devices = {"virtio-net"};
  boot.kernel_fd = 0;
  ExpectRoundTrip(boot);
}

// The defaults live in the structs' initializers; this is the one place a
// test states them.
TEST(Requests, Defaults) {
  auto attach = ParseMessage<AttachRequest>({{"name", "vm1"}});
  ASSERT_TRUE(attach.ok()) << attach.error().message;
  EXPECT_FALSE(attach->qmp);
  EXPECT_EQ(attach->size_mib, 16u);
  EXPECT_EQ(attach->events, "");
  EXPECT_EQ(attach->pump_interval_ms, 50u);
  EXPECT_EQ(attach->wait_ms, 30000u);
  auto detach = ParseMessage<DetachRequest>({{"name", "vm1"}});
  ASSERT_TRUE(detach.ok());
  EXPECT_EQ(detach->timeout_ms, 10000u);
  auto stream = ParseMessage<StreamRequest>({{"name", "vm1"}});
  ASSERT_TRUE(stream.ok());
  EXPECT_FALSE(stream->json());
  EXPECT_FALSE(stream->from_start());
  auto harvest = ParseMessage<FormatsHarvestRequest>({{"kernel", "/k"}, {"kernel_fd", 0}});
  ASSERT_TRUE(harvest.ok()) << harvest.error().message;
  EXPECT_EQ(harvest->timeout_ms, 180000u);
  auto setup = ParseMessage<SetupRequest>({{"domain", "d"}});
  ASSERT_TRUE(setup.ok());
  EXPECT_FALSE(setup->range);
  EXPECT_FALSE(setup->events);
  EXPECT_FALSE(setup->dry_run);
  EXPECT_FALSE(setup->undo);
  auto boot = ParseMessage<BootRequest>({{"name", "g1"}, {"kernel", "/k"}});
  ASSERT_TRUE(boot.ok()) << boot.error().message;
  EXPECT_EQ(boot->cpus, 2);
  EXPECT_EQ(boot->memory_mib, 1088u);
  EXPECT_EQ(boot->trace_size_mib, 16u);
  EXPECT_EQ(boot->events, kDefaultBootEvents);
  EXPECT_EQ(boot->accel, "auto");
  EXPECT_FALSE(boot->trace_boot);
  EXPECT_TRUE(boot->devices.empty());
  // A null is an absent key: the default.
  auto null_wait = ParseMessage<AttachRequest>({{"name", "vm1"}, {"wait_ms", nullptr}});
  ASSERT_TRUE(null_wait.ok());
  EXPECT_EQ(null_wait->wait_ms, AttachRequest{}.wait_ms);
}

template <class M>
void ExpectUnknownKeyRefused(json args) {
  args["bogus"] = 1;
  EXPECT_THAT(ErrorOf<M>(args),
              HasSubstr(std::string(M::kCommand) + ": unknown argument args.bogus"));
}

TEST(Requests, Malicious_UnknownKeysAreRefusedNamingCommandAndKey) {
  ExpectUnknownKeyRefused<PingRequest>(json::object());
  ExpectUnknownKeyRefused<FormatsListRequest>(json::object());
  ExpectUnknownKeyRefused<StatusRequest>({{"name", "vm1"}});
  ExpectUnknownKeyRefused<ManualCaptureRequest>({{"name", "vm1"}});
  ExpectUnknownKeyRefused<CaptureFilesRequest>({{"capture", "c"}});
  ExpectUnknownKeyRefused<StreamRequest>({{"name", "vm1"}});
  ExpectUnknownKeyRefused<AttachRequest>({{"name", "vm1"}});
  ExpectUnknownKeyRefused<DetachRequest>({{"name", "vm1"}});
  ExpectUnknownKeyRefused<AdoptRequest>({{"name", "vm1"}});
  ExpectUnknownKeyRefused<FormatsHarvestRequest>({{"kernel", "/k"}});
  ExpectUnknownKeyRefused<SetupRequest>({{"domain", "d"}});
  ExpectUnknownKeyRefused<BootRequest>({{"name", "g1"}, {"kernel", "/k"}});
  // The message lists what the command takes.
  EXPECT_EQ(ErrorOf<DetachRequest>({{"name", "vm1"}, {"timeout", 5}}),
            "detach: unknown argument args.timeout (detach takes: name, timeout_ms)");
  EXPECT_EQ(ErrorOf<PingRequest>({{"x", 1}}), "ping: unknown argument args.x (ping takes: none)");
}

TEST(Requests, Malicious_WrongTypesAreRefusedNamingTheKey) {
  EXPECT_EQ(ErrorOf<StatusRequest>({{"name", 5}}), "status: args.name must be a string");
  EXPECT_EQ(ErrorOf<StatusRequest>(json::object()), "status: args.name is required");
  EXPECT_EQ(ErrorOf<AttachRequest>(json::array()), "attach: args must be an object");
  EXPECT_EQ(ErrorOf<AttachRequest>({{"name", "vm1"}, {"size_mib", "16M"}}),
            "attach: args.size_mib must be a non-negative integer");
  EXPECT_EQ(ErrorOf<AttachRequest>({{"name", "vm1"}, {"size_mib", -4}}),
            "attach: args.size_mib must be a non-negative integer");
  EXPECT_EQ(ErrorOf<AttachRequest>({{"name", "vm1"}, {"pump_interval_ms", 0}}),
            "attach: args.pump_interval_ms = 0 is outside 1..60000");
  EXPECT_EQ(ErrorOf<AttachRequest>({{"name", "vm1"}, {"qmp", json::array()}}),
            "attach: args.qmp must be a string");
  EXPECT_EQ(ErrorOf<SetupRequest>({{"domain", "d"}, {"dry_run", "yes"}}),
            "setup: args.dry_run must be true or false");
  EXPECT_EQ(ErrorOf<FormatsHarvestRequest>({{"kernel", "k"}, {"timeout_ms", 1.5e4}}),
            "formats-harvest: args.timeout_ms must be a non-negative integer");
  EXPECT_EQ(ErrorOf<FormatsHarvestRequest>({{"kernel", "k"}, {"timeout_ms", 999}}),
            "formats-harvest: args.timeout_ms = 999 is outside 1000..3600000");
  EXPECT_EQ(ErrorOf<BootRequest>({{"name", "g1"}, {"kernel", "/k"}, {"cpus", 99}}),
            "boot: args.cpus = 99 is outside 1..64");
  EXPECT_EQ(ErrorOf<BootRequest>({{"name", "g1"}, {"kernel", "/k"}, {"devices", "virtio-blk"}}),
            "boot: args.devices must be a list of at most 3 strings");
  EXPECT_EQ(ErrorOf<AdoptRequest>({{"name", "vm1"}, {"boot_region_fd", "0"}}),
            "adopt: args.boot_region_fd must be a non-negative integer");
}

TEST(Requests, Malicious_ValuesTheChecksRefuse) {
  EXPECT_THAT(ErrorOf<StatusRequest>({{"name", "../etc"}}), HasSubstr("status: "));
  EXPECT_THAT(ErrorOf<AttachRequest>({{"name", "vm1"}, {"events", std::string(5000, 'x')}}),
              HasSubstr("attach: args.events is 5000 bytes; at most 1984"));
  EXPECT_EQ(ErrorOf<StreamRequest>({{"name", "vm1"}, {"format", "xml"}}),
            "stream: format 'xml' is not text or json");
  EXPECT_EQ(ErrorOf<StreamRequest>({{"name", "vm1"}, {"from", "yesterday"}}),
            "stream: from 'yesterday' is not now or start");
  EXPECT_THAT(ErrorOf<CaptureFilesRequest>({{"capture", ""}}), HasSubstr("is empty"));
  EXPECT_THAT(ErrorOf<AdoptRequest>({{"name", "vm1"}, {"qmp", "/q"}, {"domain", "d"}}),
              HasSubstr("exclude each other"));
  EXPECT_THAT(ErrorOf<AdoptRequest>({{"name", "vm1"}, {"boot_region", "/f@0x1000:4096"}}),
              HasSubstr("args.boot_region needs args.qmp"));
  EXPECT_THAT(ErrorOf<SetupRequest>({{"domain", "d"}, {"range", 4097}}),
              HasSubstr("must be a multiple of 4 KiB"));
  EXPECT_THAT(ErrorOf<SetupRequest>({{"domain", "d"}, {"events", "a b"}}),
              HasSubstr("may only hold names"));
  EXPECT_THAT(ErrorOf<SetupRequest>({{"domain", ""}}), HasSubstr("setup needs args.domain"));
  EXPECT_THAT(ErrorOf<BootRequest>({{"name", "g1"}, {"kernel", "/k"}, {"accel", "xen"}}),
              HasSubstr("boot: accel 'xen' is not one of"));
}

// The harvest guest's report becomes the formats of every VM with that
// kernel: a client's initrd is refused with the reason and the way out.
TEST(Requests, Malicious_FormatsHarvestRefusesAClientInitrd) {
  const std::string m = ErrorOf<FormatsHarvestRequest>(
      {{"kernel", "/home/u/vmlinuz"}, {"initrd", "/home/u/evil.img"}, {"initrd_fd", 1}});
  EXPECT_THAT(m, HasSubstr("formats-harvest /home/u/vmlinuz"));
  EXPECT_THAT(m, HasSubstr("only with its own initramfs (harvest_initrd"));
  EXPECT_THAT(m, HasSubstr("--cache DIR --initrd I"));
  EXPECT_FALSE(ParseMessage<FormatsHarvestRequest>({{"kernel", "k"}, {"initrd", ""}}).ok());
  EXPECT_TRUE(ParseMessage<FormatsHarvestRequest>({{"kernel", "k"}, {"initrd", nullptr}}).ok());
  EXPECT_THAT(ErrorOf<FormatsHarvestRequest>({{"kernel", std::string(5000, 'k')}}),
              HasSubstr("longer than 4096 bytes"));
  EXPECT_THAT(ErrorOf<FormatsHarvestRequest>({{"kernel", ""}}),
              HasSubstr("args.kernel (the kernel image's path) is required"));
}

}  // namespace
}  // namespace hvtrace::hostd
