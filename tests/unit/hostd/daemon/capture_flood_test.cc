// A guest that triggers captures as fast as it can (pvpanic crash-loaded,
// resets in a loop): the supervisor coalesces them (supervisor.h, Floods),
// counts every trigger into the manifest of the capture that stands for it,
// and the real panic afterwards is captured, named "panic" and told how many
// cheaper triggers it absorbed. The backend copies a real region file, as a
// shmem region, so the capture service runs for real.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>

#include "supervisor.h"
#include "test_support.h"

namespace hvtrace::hostd {
namespace {

using test_support::TempDir;
namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

class RegionFileBackend : public VmBackend {
 public:
  explicit RegionFileBackend(fs::path region)
      : region_(std::move(region)),
        file_(RegionFile::Adopt(::open(region_.c_str(), O_RDONLY | O_CLOEXEC), 0, 65536)) {}
  std::string_view kind() const override { return "test-file"; }
  void Start(VmEventSink& sink) override { sink_ = &sink; }
  void Stop() override {}
  void Release() override {}
  Result<CaptureInputs> PrepareCapture() override {
    CaptureInputs in;
    in.region_file = RegionFileSource{file_, region_, 0, 65536, 0, /*boot_range=*/false, {}, {}};
    return in;
  }
  void ApplyPanicPolicy(PanicPolicy policy) override {
    std::lock_guard lock(mu);
    policies.push_back(policy);
  }
  VmEventSink* sink_ = nullptr;
  std::mutex mu;
  std::vector<PanicPolicy> policies;

 private:
  fs::path region_;
  std::shared_ptr<const RegionFile> file_;
};

struct Fixture {
  TempDir tmp;
  boost::asio::thread_pool pool{2};
  fs::path region = tmp.path() / "region";
  std::shared_ptr<CaptureService> captures = std::make_shared<CaptureService>(nullptr, 2);

  Fixture() { std::ofstream(region, std::ios::binary) << std::string(65536, 'r'); }
  ~Fixture() { pool.join(); }

  std::shared_ptr<VmSupervisor> Make(const std::string& name, RegionFileBackend** out,
                                     std::chrono::milliseconds interval) {
    auto backend = std::make_unique<RegionFileBackend>(region);
    *out = backend.get();
    SupervisorOptions options;
    options.capture_retention = 0;  // Keep all: every capture is counted below.
    options.guest_capture_interval = interval;
    auto s = std::make_shared<VmSupervisor>(name, std::move(backend), pool.get_executor(),
                                            CaptureStore(tmp.path() / name / "captures"), captures,
                                            options);
    s->Start();
    return s;
  }
};

template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds timeout = 10s) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return pred();
}

bool Idle(const VmSupervisor& vm) {
  const json q = vm.StatusJson()["capture_queue"];
  return q.is_object() && !q.value("in_flight", true) && q["pending"].empty();
}

json ManifestOf(const CaptureEntry& e) {
  return json::parse(std::ifstream(e.dir / "manifest.json"));
}

uint64_t Coalesced(const json& manifest, const std::string& trigger) {
  const json c = manifest["extra"].value("coalesced", json::object());
  return c.value(trigger, uint64_t{0});
}

TEST(CaptureFloodTest, CrashloadedFloodThenPanicMakesTwoCapturesAndCountsEveryTrigger) {
  Fixture f;
  RegionFileBackend* backend;
  auto vm = f.Make("vm1", &backend, 1h);  // No second guest capture within the test.
  ASSERT_TRUE(WaitFor([&] { return vm->state() == VmState::kRunning; }));
  constexpr int kFlood = 500;
  for (int i = 0; i < kFlood; ++i)
    backend->sink_->OnVmEvent(VmEvent{"GUEST_CRASHLOADED", {}, HostTime::Now()});
  backend->sink_->OnVmEvent(VmEvent{"GUEST_PANICKED", {{"action", "pause"}}, HostTime::Now()});
  ASSERT_TRUE(WaitFor([&] { return vm->StatusJson()["captures_taken"] == 2 && Idle(*vm); }))
      << vm->StatusJson().dump();

  auto list = vm->ListCaptures();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u) << "a flood must not make a capture per trigger";
  const json first = ManifestOf((*list)[0]);
  const json panic = ManifestOf((*list)[1]);
  EXPECT_EQ(first["trigger"], "crashloaded");
  EXPECT_EQ(panic["trigger"], "panic") << "the panic keeps its name when it absorbs a flood";
  EXPECT_EQ(panic["extra"]["consistency"]["vcpus_stopped"], true);
  // Every trigger is accounted for: one captured, the rest counted.
  EXPECT_EQ(Coalesced(first, "crashloaded") + Coalesced(panic, "crashloaded"), kFlood - 1u);
  const json status = vm->StatusJson();
  EXPECT_EQ(status["captures_coalesced"]["crashloaded"], kFlood - 1);
  EXPECT_EQ(status["last_capture"]["trigger"], "panic");
  std::lock_guard lock(backend->mu);
  EXPECT_EQ(backend->policies.size(), 1u) << "the panic policy is applied once, after the capture";
}

TEST(CaptureFloodTest, ResetLoopMakesAtMostOneCapturePerIntervalAndLosesNoCount) {
  Fixture f;
  RegionFileBackend* backend;
  const auto interval = 200ms;
  auto vm = f.Make("vm1", &backend, interval);
  ASSERT_TRUE(WaitFor([&] { return vm->state() == VmState::kRunning; }));
  const auto start = std::chrono::steady_clock::now();
  int resets = 0;
  while (std::chrono::steady_clock::now() - start < 1s) {
    backend->sink_->OnVmEvent(VmEvent{"RESET", {}, HostTime::Now()});
    ++resets;
    std::this_thread::sleep_for(1ms);
  }
  const auto flood = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(WaitFor([&] { return Idle(*vm); })) << vm->StatusJson().dump();
  auto list = vm->ListCaptures();
  ASSERT_TRUE(list.ok());
  uint64_t accounted = 0;
  for (const CaptureEntry& e : *list) {
    const json m = ManifestOf(e);
    EXPECT_EQ(m["trigger"], "reset");
    accounted += 1 + Coalesced(m, "reset");
  }
  EXPECT_EQ(accounted, static_cast<uint64_t>(resets));
  // One at the first reset, one per interval after it, one trailing.
  const auto bound = static_cast<size_t>(flood / interval) + 2;
  EXPECT_LE(list->size(), bound) << resets << " resets";
  EXPECT_GE(list->size(), 2u) << "the resets after the first are captured at the interval's end";
  std::printf("[flood] %d resets in %.0f ms -> %zu captures (interval %lld ms)\n", resets,
              std::chrono::duration<double, std::milli>(flood).count(), list->size(),
              static_cast<long long>(interval.count()));
}

// The kernel log watch's events (log_watch.h) during a WARN storm with one
// oops in it: guest triggers, rate-limited and counted like resets; the
// oops's name is kept when a pending capture holds WARNs too.
TEST(CaptureFloodTest, WarnStormWithAnOopsIsRateLimitedAndTheOopsKeepsItsName) {
  Fixture f;
  RegionFileBackend* backend;
  auto vm = f.Make("vm1", &backend, 1h);  // Only the first starts before the Stop flush.
  ASSERT_TRUE(WaitFor([&] { return vm->state() == VmState::kRunning; }));
  constexpr int kWarns = 100;
  for (int i = 0; i < kWarns; ++i) {
    backend->sink_->OnVmEvent(
        VmEvent{"HVTRACE_GUEST_WARN", {{"line", "WARNING: CPU: 0"}}, HostTime::Now()});
    if (i == 50) backend->sink_->OnVmEvent(VmEvent{"HVTRACE_GUEST_OOPS", {}, HostTime::Now()});
  }
  ASSERT_TRUE(WaitFor([&] { return vm->StatusJson()["captures_taken"] == 1; }));
  std::promise<void> stopped;
  vm->Stop([&] { stopped.set_value(); });
  stopped.get_future().wait();
  auto list = vm->ListCaptures();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  const json first = ManifestOf((*list)[0]);
  const json second = ManifestOf((*list)[1]);
  EXPECT_EQ(first["trigger"], "warn");
  EXPECT_EQ(first["extra"]["consistency"]["vcpus_stopped"], false);
  EXPECT_EQ(second["trigger"], "oops") << "an oops folded with WARNs stays an oops";
  EXPECT_EQ(Coalesced(first, "warn") + Coalesced(second, "warn"), kWarns - 1u);
}

// A guest that announces its leaving in a loop (a kLeaving flood on the
// metadata channel reaching the supervisor): captured as a guest trigger, one
// capture at the first and one when the interval (here: the Stop flush) ends,
// every announcement answered once, and of the cheap retention class.
TEST(CaptureFloodTest, Malicious_GuestLeavingLoopIsCoalescedAndEveryAnnouncementAnswered) {
  Fixture f;
  RegionFileBackend* backend;
  auto vm = f.Make("vm1", &backend, 1h);
  ASSERT_TRUE(WaitFor([&] { return vm->state() == VmState::kRunning; }));
  constexpr int kFlood = 300;
  std::atomic<int> copied{0}, refused{0};
  for (int i = 0; i < kFlood; ++i) {
    vm->OnGuestLeaving([&](bool ok) { ++(ok ? copied : refused); });
  }
  // The first capture's copy answers the first announcement before decoding.
  ASSERT_TRUE(WaitFor([&] { return copied.load() >= 1; })) << vm->StatusJson().dump();
  std::promise<void> stopped;
  vm->Stop([&] { stopped.set_value(); });
  ASSERT_EQ(stopped.get_future().wait_for(10s), std::future_status::ready);
  EXPECT_EQ(copied.load(), kFlood);
  EXPECT_EQ(refused.load(), 0);
  auto list = vm->ListCaptures();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u) << "a flood must not make a capture per announcement";
  uint64_t accounted = 0;
  for (const CaptureEntry& e : *list) {
    const json m = ManifestOf(e);
    EXPECT_EQ(m["trigger"], "guest-leaving");
    EXPECT_EQ(m["extra"]["consistency"]["vcpus_stopped"], false);
    accounted += 1 + Coalesced(m, "guest-leaving");
  }
  EXPECT_EQ(accounted, static_cast<uint64_t>(kFlood));
  EXPECT_FALSE(IsPanicTrigger("guest-leaving")) << "a guest's own trigger never evicts a panic";
}

// Stop (and Release) wait for the captures already triggered, and start a
// pending guest capture at once instead of at the interval's end.
TEST(CaptureFloodTest, StopFlushesThePendingGuestCapture) {
  Fixture f;
  RegionFileBackend* backend;
  auto vm = f.Make("vm1", &backend, 1h);
  ASSERT_TRUE(WaitFor([&] { return vm->state() == VmState::kRunning; }));
  for (int i = 0; i < 3; ++i)
    backend->sink_->OnVmEvent(VmEvent{"GUEST_CRASHLOADED", {}, HostTime::Now()});
  std::promise<size_t> stopped;
  vm->Stop([&] {
    auto list = vm->ListCaptures();
    stopped.set_value(list.ok() ? list->size() : 0);
  });
  auto future = stopped.get_future();
  ASSERT_EQ(future.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(future.get(), 2u);
}

}  // namespace
}  // namespace hvtrace::hostd
