// The attach state machine (hostd/backend/attach_session.h) against a fake
// RegionTransport: a real region file, a real agent announcement written
// through the guest-side GuestRegion, a fake VM.
#include "attach_session.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>

#include "hvtrace/region_writer.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

// What the fake VM answers; a step left unset is held (never answered)
// until the test answers it through the saved callback.
struct FakeTransport : RegionTransport {
  std::optional<Result<PlugTarget>> probe;
  std::optional<Result<PluggedDevice>> plug;
  std::optional<Result<std::string>> unplug;
  std::function<void(const LiveRegion&)> on_plug;  // e.g. the agent announces.
  Then<PlugTarget> held_probe;
  int plugs = 0, unplugs = 0;

  void Probe(const AttachOptions&, Then<PlugTarget> done) override {
    if (probe) return done(*probe);
    held_probe = std::move(done);
  }
  void Plug(const LiveRegion& region, const PlugTarget&, Then<PluggedDevice> done) override {
    ++plugs;
    if (on_plug) on_plug(region);
    done(*plug);
  }
  void Unplug(const PluggedDevice&, std::chrono::milliseconds, Then<std::string> done) override {
    ++unplugs;
    done(*unplug);
  }
};

// Plays the guest agent: maps the file and announces itself as running.
void Announce(const fs::path& path, uint32_t cpus) {
  Result<RegionMapping> map = RegionMapping::Map(path.string());
  ASSERT_TRUE(map.ok()) << map.error().message;
  Result<GuestRegion> guest = GuestRegion::Attach(map->data(), map->size());
  ASSERT_TRUE(guest.ok()) << guest.error().message;
  region::GuestIdentity id{};
  id.boot_generation = 1;
  std::strcpy(id.kernel_release, "6.12.0-test");
  id.nr_cpus = cpus;
  id.agent_pid = 4242;
  id.page_size = 4096;
  guest->WriteIdentity(id);
  __atomic_store_n(&guest->status()->state, region::kStateRunning, __ATOMIC_RELEASE);
}

class AttachSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("hvtrace-attach-session-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    options_.region_path = dir_ / "region";
    options_.size_bytes = 1 << 20;
    options_.wait = 0ms;
    fake_.probe = PlugTarget{2, std::nullopt, std::nullopt, std::nullopt, "", {{"kind", "fake"}}};
    fake_.plug = PluggedDevice{"dev0", "mem0", "", {{"plugged_by", "fake"}}};
    fake_.unplug = std::string("mem0: object in use");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs |call| and the I/O context until the reply comes, as hvtraced
  // sends it (MessageToJson).
  template <class Reply>
  Result<json> Run(const std::function<void(std::function<void(Result<Reply>)>)>& call) {
    std::optional<Result<json>> reply;
    call([&reply](Result<Reply> r) {
      reply = r.ok() ? Result<json>(MessageToJson(*r)) : Result<json>(r.error());
    });
    io_.restart();
    while (!reply && io_.run_one_for(5s) > 0) {
    }
    if (!reply) return Error{"no reply"};
    return *reply;
  }
  Result<json> Attach() {
    return Run<AttachReply>(
        [this](AttachDone done) { session_.Attach(options_, std::move(done)); });
  }
  Result<json> Detach() {
    return Run<DetachReply>([this](DetachDone done) { session_.Detach(1s, std::move(done)); });
  }

  fs::path dir_;
  AttachOptions options_;
  boost::asio::io_context io_;
  FakeTransport fake_;
  AttachSession session_{io_.get_executor(), fake_};
};

TEST_F(AttachSessionTest, PlugsWaitsForTheAgentAndRepliesInOneShape) {
  options_.wait = 10s;
  fake_.on_plug = [](const LiveRegion& region) { Announce(region.path(), 2); };
  Result<json> r = Attach();
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)["region"]["file"], options_.region_path.string());
  EXPECT_EQ((*r)["region"]["size"], options_.size_bytes);
  EXPECT_EQ((*r)["region"]["region_id"].get<std::string>().size(), 16u);
  EXPECT_EQ((*r)["device"], (json{{"id", "dev0"}, {"memdev", "mem0"}}));
  EXPECT_EQ((*r)["transport"], (json{{"kind", "fake"}, {"plugged_by", "fake"}}));
  EXPECT_GE((*r)["plug_ms"].get<double>(), 0.0);
  EXPECT_GE((*r)["announce_ms"].get<double>(), 0.0);
  EXPECT_EQ((*r)["guest"]["kernel_release"], "6.12.0-test");
  EXPECT_EQ((*r)["guest"]["nr_cpus"], 2);
  EXPECT_FALSE(r->contains("note"));
  ASSERT_NE(session_.region(), nullptr);
  EXPECT_EQ(session_.region()->geometry().max_cpus, 2u);  // From the probe.
  json status = session_.Status();
  EXPECT_EQ(status["attached"], true);
  EXPECT_EQ(status["busy"], false);
  EXPECT_EQ(status["guest"]["agent_pid"], 4242);
}

TEST_F(AttachSessionTest, NoAgentRepliesWithANoteAndTheRegionStaysPlugged) {
  Result<json> r = Attach();
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE((*r)["guest"].is_null());
  EXPECT_NE((*r)["note"].get<std::string>().find("no hvtrace-agent announced itself"),
            std::string::npos);
  EXPECT_TRUE(session_.device().has_value());
  Result<json> again = Attach();
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.error().message.find("already attached (device dev0)"), std::string::npos)
      << again.error().message;
  EXPECT_EQ(fake_.plugs, 1);
}

TEST_F(AttachSessionTest, AProbeErrorCreatesNothingAndIsShownInStatus) {
  fake_.probe = Error{"QMP /x is not connected"};
  Result<json> r = Attach();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "QMP /x is not connected");
  EXPECT_FALSE(fs::exists(options_.region_path));
  EXPECT_EQ(fake_.plugs, 0);
  EXPECT_EQ(session_.Status()["last"]["error"], "QMP /x is not connected");
  EXPECT_EQ(session_.region(), nullptr);
}

TEST_F(AttachSessionTest, APlugErrorRemovesTheFileAndAllowsAnotherAttempt) {
  fake_.plug = Error{"device_add hvtrace-ivs-1: Bus 'pcie.0' does not support hotplugging"};
  ASSERT_FALSE(Attach().ok());
  EXPECT_FALSE(fs::exists(options_.region_path));
  EXPECT_FALSE(session_.device().has_value());
  fake_.plug = PluggedDevice{"dev1", "mem1", "rp0", {}};
  Result<json> r = Attach();
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)["device"]["bus"], "rp0");
}

TEST_F(AttachSessionTest, ASecondRequestWhileOneIsUnderWayIsRefused) {
  fake_.probe.reset();  // Held: the VM has not answered yet.
  std::optional<Result<json>> first;
  session_.Attach(options_, [&first](Result<AttachReply> r) {
    first = r.ok() ? Result<json>(MessageToJson(*r)) : Result<json>(r.error());
  });
  Result<json> second = Attach();
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().message, "an attach or detach is already under way");
  Result<json> detach = Detach();
  ASSERT_FALSE(detach.ok());
  EXPECT_EQ(detach.error().message, "an attach or detach is already under way");
  ASSERT_TRUE(fake_.held_probe);
  fake_.held_probe(Error{"gone"});
  ASSERT_TRUE(first.has_value());
  EXPECT_FALSE(first->ok());
  EXPECT_FALSE(session_.Status()["busy"].get<bool>());
}

TEST_F(AttachSessionTest, DetachKeepsTheRegionMappedAndMarksItDetached) {
  ASSERT_TRUE(Attach().ok());
  Result<json> r = Detach();
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)["detached"], true);
  EXPECT_EQ((*r)["device"], "dev0");
  EXPECT_EQ((*r)["region"]["kept_open"], true);
  EXPECT_EQ((*r)["object_del_error"], "mem0: object in use");  // What the transport said after.
  ASSERT_NE(session_.region(), nullptr);
  EXPECT_TRUE(session_.region()->detached());
  EXPECT_FALSE(session_.device().has_value());
  ASSERT_FALSE(Detach().ok());  // Nothing attached now.
  EXPECT_EQ(fake_.unplugs, 1);
}

TEST_F(AttachSessionTest, AFailedDetachLeavesTheRegionAttached) {
  ASSERT_TRUE(Attach().ok());
  fake_.unplug = Error{"no DEVICE_DELETED for dev0 within 1000 ms"};
  Result<json> r = Detach();
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(session_.device().has_value());
  EXPECT_FALSE(session_.region()->detached());
  EXPECT_EQ(session_.Status()["last"]["error"], "no DEVICE_DELETED for dev0 within 1000 ms");
}

TEST_F(AttachSessionTest, TheGuestEjectingTheDeviceDetachesIt) {
  ASSERT_TRUE(Attach().ok());
  EXPECT_FALSE(session_.DeviceGone("someone-elses-device"));
  EXPECT_TRUE(session_.device().has_value());
  EXPECT_TRUE(session_.DeviceGone("dev0"));
  EXPECT_TRUE(session_.region()->detached());
  EXPECT_EQ(session_.Status()["last"]["by"], "the guest (nobody asked for it)");
  EXPECT_FALSE(session_.DeviceGone("dev0"));  // Once.
  EXPECT_TRUE(Attach().ok());                 // A new region may come.
}

TEST_F(AttachSessionTest, AnAdoptedRegionIsAttachedAndDetachable) {
  LiveRegionOptions ro;
  ro.path = options_.region_path;
  ro.size_bytes = options_.size_bytes;
  auto region = LiveRegion::Create(ro);
  ASSERT_TRUE(region.ok()) << region.error().message;
  session_.Adopt(*region, PluggedDevice{"old-dev", "old-mem", "", {}});
  EXPECT_EQ(session_.Status()["last"]["found"], true);
  EXPECT_EQ(session_.device()->id, "old-dev");
  Result<json> r = Detach();
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)["device"], "old-dev");
}

}  // namespace
}  // namespace hvtrace::hostd
