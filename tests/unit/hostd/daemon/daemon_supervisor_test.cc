// VmSupervisor with test backends: the backends below stand in for a VM's
// QMP session (they deliver events and copy a real region file), so the
// supervisor's own logic — triggers, isolation, policy — runs for real.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "supervisor.h"
#include "test_support.h"

namespace hvtrace::hostd {
namespace {

using test_support::TempDir;

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

// Names a raw region file for the capture service to copy, like a shmem
// region; can be told to throw from any entry point.
class FileRegionBackend : public VmBackend {
 public:
  FileRegionBackend(fs::path region, uint64_t size)
      : region_(std::move(region)),
        size_(size),
        file_(RegionFile::Adopt(::open(region_.c_str(), O_RDONLY | O_CLOEXEC), 0, size_)) {}
  std::string_view kind() const override { return "test-file"; }
  void Start(VmEventSink& sink) override {
    if (throw_on_start) throw std::runtime_error("QMP greeting missing");
    sink_ = &sink;
  }
  void Stop() override { stopped = true; }
  void Release() override { released = true; }
  Result<CaptureInputs> PrepareCapture() override {
    if (before_capture) before_capture();
    if (throw_on_capture) throw std::runtime_error("decoder bug");
    CaptureInputs in;
    in.region_file = RegionFileSource{file_, region_, 0, size_, 0, /*boot_range=*/false, {}, {}};
    in.transport = {{"kind", "test-file"}};
    return in;
  }
  void ApplyPanicPolicy(PanicPolicy policy) override {
    std::lock_guard lock(mu);
    policies.push_back(policy);
  }

  VmEventSink* sink_ = nullptr;
  std::atomic<bool> throw_on_start{false};
  std::atomic<bool> throw_on_capture{false};
  std::atomic<bool> stopped{false};
  std::atomic<bool> released{false};
  std::function<void()> before_capture;  // Set before the capture is triggered.
  std::mutex mu;
  std::vector<PanicPolicy> policies;

 private:
  fs::path region_;
  uint64_t size_;
  std::shared_ptr<const RegionFile> file_;
};

struct Fixture {
  TempDir tmp;
  boost::asio::thread_pool pool{2};
  fs::path region = tmp.path() / "region";
  std::shared_ptr<CaptureService> captures = std::make_shared<CaptureService>(nullptr, 2);

  Fixture() {
    std::ofstream out(region, std::ios::binary);
    std::string data(65536, '\0');
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 13);
    out << data;
  }
  ~Fixture() { pool.join(); }

  std::shared_ptr<VmSupervisor> Make(const std::string& name, FileRegionBackend** out,
                                     PanicPolicy policy = PanicPolicy::kPause) {
    auto backend = std::make_unique<FileRegionBackend>(region, 65536);
    *out = backend.get();
    SupervisorOptions options;
    options.panic_policy = policy;
    options.capture_retention = 3;
    auto s = std::make_shared<VmSupervisor>(name, std::move(backend), pool.get_executor(),
                                            CaptureStore(tmp.path() / name / "captures"), captures,
                                            options);
    s->Start();
    return s;
  }

  // vm-a and vm-b, started and registered in |registry|.
  void AddTwo(SupervisorRegistry& registry, FileRegionBackend** a, FileRegionBackend** b) {
    ASSERT_TRUE(registry.Add(Make("vm-a", a)).ok());
    ASSERT_TRUE(registry.Add(Make("vm-b", b)).ok());
  }
};

template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds timeout = 5s) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return pred();
}

VmEvent Event(std::string name, json data = json::object()) {
  return VmEvent{std::move(name), std::move(data), HostTime::Now()};
}

TEST(SupervisorTest, PanicEventCapturesRegionWithEventsAndAppliesPolicy) {
  Fixture f;
  FileRegionBackend* backend;
  auto vm = f.Make("vm1", &backend, PanicPolicy::kResume);
  ASSERT_TRUE(WaitFor([&] { return vm->state() == VmState::kRunning; }));
  backend->sink_->OnVmEvent(Event("GUEST_PANICKED", {{"action", "pause"}}));
  backend->sink_->OnVmEvent(Event("STOP"));
  ASSERT_TRUE(WaitFor([&] { return vm->StatusJson()["captures_taken"] == 1; }))
      << vm->StatusJson().dump();
  ASSERT_TRUE(WaitFor([&] { return vm->StatusJson()["events_seen"] == 2; }));
  json status = vm->StatusJson();
  EXPECT_EQ(status["state"], "panicked");
  EXPECT_EQ(status["last_capture"]["trigger"], "panic");
  EXPECT_GE(status["last_capture"]["trigger_to_disk_ms"].get<double>(), 0.0);

  auto list = vm->ListCaptures();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  const CaptureEntry& e = (*list)[0];
  EXPECT_EQ(fs::file_size(e.dir / "region.bin"), 65536u);
  std::ifstream in(e.dir / "manifest.json");
  json m = json::parse(in);
  EXPECT_EQ(m["vm"], "vm1");
  EXPECT_EQ(m["trigger"], "panic");
  ASSERT_EQ(m["qmp_events"].size(), 1u);  // STOP came after the capture began.
  EXPECT_EQ(m["qmp_events"][0]["event"], "GUEST_PANICKED");
  EXPECT_EQ(m["qmp_events"][0]["data"]["action"], "pause");
  EXPECT_EQ(m["region"]["kind"], "shmem");
  EXPECT_EQ(m["region"]["size"], 65536);
  EXPECT_EQ(m["extra"]["transport"]["kind"], "test-file");
  EXPECT_EQ(m["extra"]["consistency"]["vcpus_stopped"], true);
  std::lock_guard lock(backend->mu);
  EXPECT_EQ(backend->policies, std::vector<PanicPolicy>{PanicPolicy::kResume});
}

// A backend that finds the guest already panicked when its watch begins
// (daemon restart, late adopt) reports HVTRACE_FOUND_PANICKED: captured as
// "panic-while-away", the policy applied, the VM shown as panicked.
TEST(SupervisorTest, FoundPanickedIsCapturedAsPanicWhileAway) {
  Fixture f;
  FileRegionBackend* backend;
  auto vm = f.Make("vm1", &backend, PanicPolicy::kQuit);
  ASSERT_TRUE(WaitFor([&] { return vm->state() == VmState::kRunning; }));
  backend->sink_->OnVmEvent(Event("HVTRACE_FOUND_PANICKED", {{"status", "guest-panicked"}}));
  ASSERT_TRUE(WaitFor([&] { return vm->StatusJson()["captures_taken"] == 1; }))
      << vm->StatusJson().dump();
  json status = vm->StatusJson();
  EXPECT_EQ(status["state"], "panicked");
  EXPECT_EQ(status["last_capture"]["trigger"], "panic-while-away");
  // QEMU quitting afterwards is the same incident: no second capture.
  backend->sink_->OnVmGone("QMP EOF");
  // Captures run off the VM's strand (supervisor.h, Floods): wait for the
  // panic's to end too.
  ASSERT_TRUE(WaitFor([&] {
    const json st = vm->StatusJson();
    return st["state"] == "gone" && st["capture_queue"]["in_flight"] == false &&
           st["capture_queue"]["pending"].empty();
  }));
  EXPECT_EQ(vm->StatusJson()["captures_taken"], 1);
  std::lock_guard lock(backend->mu);
  EXPECT_EQ(backend->policies, std::vector<PanicPolicy>{PanicPolicy::kQuit});
}

// A restarted daemon finds the guest still in the panic the previous run
// captured: the region is byte-identical, so no second capture. Once the
// guest has written anything (rebooted, panicked again) it is a new panic.
TEST(SupervisorTest, FoundPanickedInTheSamePanicIsNotCapturedTwice) {
  Fixture f;
  FileRegionBackend* backend;
  std::string first_id;
  {
    auto vm = f.Make("vm1", &backend);
    ASSERT_TRUE(WaitFor([&] { return vm->state() == VmState::kRunning; }));
    backend->sink_->OnVmEvent(Event("GUEST_PANICKED", {{"action", "pause"}}));
    ASSERT_TRUE(WaitFor([&] { return vm->StatusJson()["captures_taken"] == 1; }))
        << vm->StatusJson().dump();
    first_id = vm->StatusJson()["last_capture"]["id"];
    vm->Stop();
  }
  auto vm = f.Make("vm1", &backend);  // The next run, same captures.
  ASSERT_TRUE(WaitFor([&] { return vm->state() == VmState::kRunning; }));
  backend->sink_->OnVmEvent(Event("HVTRACE_FOUND_PANICKED", {{"status", "guest-panicked"}}));
  ASSERT_TRUE(WaitFor([&] {
    const json last = vm->StatusJson()["last_capture"];
    return last.is_object() && last.value("id", "") == first_id;
  })) << vm->StatusJson().dump();
  EXPECT_EQ(vm->StatusJson()["captures_taken"], 0);
  EXPECT_EQ(vm->StatusJson()["state"], "panicked");
  auto list = vm->ListCaptures();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 1u);
  EXPECT_EQ(std::distance(fs::directory_iterator(f.tmp.path() / "vm1" / "captures"),
                          fs::directory_iterator()),
            1);

  {
    std::fstream region(f.region, std::ios::in | std::ios::out | std::ios::binary);
    region.seekp(100);
    region.put('\x7f');
  }
  backend->sink_->OnVmEvent(Event("HVTRACE_FOUND_PANICKED", {{"status", "guest-panicked"}}));
  ASSERT_TRUE(WaitFor([&] { return vm->StatusJson()["captures_taken"] == 1; }))
      << vm->StatusJson().dump();
  EXPECT_EQ(vm->StatusJson()["last_capture"]["trigger"], "panic-while-away");
}

TEST(SupervisorTest, FoundPausedIsCapturedAsPausedWhileAway) {
  Fixture f;
  FileRegionBackend* backend;
  auto vm = f.Make("vm1", &backend);
  ASSERT_TRUE(WaitFor([&] { return vm->state() == VmState::kRunning; }));
  backend->sink_->OnVmEvent(Event("HVTRACE_FOUND_PAUSED", {{"status", "paused"}}));
  ASSERT_TRUE(WaitFor([&] { return vm->StatusJson()["captures_taken"] == 1; }))
      << vm->StatusJson().dump();
  EXPECT_EQ(vm->StatusJson()["state"], "paused");
  EXPECT_EQ(vm->StatusJson()["last_capture"]["trigger"], "paused-while-away");
  std::lock_guard lock(backend->mu);
  EXPECT_TRUE(backend->policies.empty());  // Not a panic: nothing to let go.
}

// An adopted libvirt domain that is shut off reads "shut off", not
// "running", takes no capture, and runs again once libvirt starts it.
TEST(SupervisorTest, FoundShutOffIsShownAsShutOffUntilItStarts) {
  Fixture f;
  FileRegionBackend* backend;
  auto vm = f.Make("vm1", &backend);
  ASSERT_TRUE(WaitFor([&] { return vm->state() == VmState::kRunning; }));
  backend->sink_->OnVmEvent(Event("HVTRACE_FOUND_SHUTOFF", {{"status", "shut off"}}));
  ASSERT_TRUE(WaitFor([&] { return vm->state() == VmState::kShutOff; })) << vm->StatusJson().dump();
  EXPECT_EQ(vm->StatusJson()["state"], "shut off");
  backend->sink_->OnVmEvent(Event("RESUME", {{"libvirt_event", "STARTED/BOOTED"}}));
  ASSERT_TRUE(WaitFor([&] { return vm->state() == VmState::kRunning; })) << vm->StatusJson().dump();
  EXPECT_EQ(vm->StatusJson()["captures_taken"], 0);
}

// Daemon exit with vm_on_shutdown = keep releases backends instead of
// stopping them, and says when the last is released.
TEST(SupervisorTest, ReleaseAllReleasesWithoutStopping) {
  Fixture f;
  FileRegionBackend *a = nullptr, *b = nullptr;
  SupervisorRegistry registry;
  f.AddTwo(registry, &a, &b);
  ASSERT_TRUE(a && b);
  std::atomic<bool> all_released{false};
  registry.ReleaseAll([&] { all_released = a->released && b->released; });
  ASSERT_TRUE(WaitFor([&] { return all_released.load(); }));
  EXPECT_FALSE(a->stopped);
  EXPECT_FALSE(b->stopped);
}

// vm_on_shutdown = stop: the daemon keeps its I/O thread until StopAll says
// every VM is stopped, and that comes only after the capture in flight has
// finished (it may still need QMP, which that thread serves).
TEST(SupervisorTest, StopAllSaysDoneOnlyAfterTheCaptureInFlightAndEveryStop) {
  Fixture f;
  FileRegionBackend *a = nullptr, *b = nullptr;
  SupervisorRegistry registry;
  f.AddTwo(registry, &a, &b);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(WaitFor([&] { return registry.Find("vm-a")->state() == VmState::kRunning; }));
  std::promise<void> go;
  std::shared_future<void> gate = go.get_future().share();
  std::atomic<bool> capture_waiting{false};
  a->before_capture = [&] {
    capture_waiting = true;
    gate.wait();
  };
  a->sink_->OnVmEvent(Event("GUEST_PANICKED"));
  ASSERT_TRUE(WaitFor([&] { return capture_waiting.load(); }));
  std::atomic<int> done_calls{0};
  std::atomic<bool> stopped_before_done{false};
  registry.StopAll([&] {
    stopped_before_done = a->stopped && b->stopped;
    ++done_calls;
  });
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(done_calls, 0) << "StopAll said done while vm-a's capture was in flight";
  EXPECT_FALSE(a->stopped);
  go.set_value();
  ASSERT_TRUE(WaitFor([&] { return done_calls == 1; }));
  EXPECT_TRUE(stopped_before_done);
  EXPECT_EQ(registry.Find("vm-a")->StatusJson()["captures_taken"], 1);
  // No VMs at all: done at once.
  SupervisorRegistry empty;
  bool empty_done = false;
  empty.StopAll([&] { empty_done = true; });
  EXPECT_TRUE(empty_done);
}

TEST(SupervisorTest, OneIncidentYieldsOneCaptureUntilTheVmRunsAgain) {
  Fixture f;
  FileRegionBackend* backend;
  auto vm = f.Make("vm1", &backend);
  ASSERT_TRUE(WaitFor([&] { return vm->state() == VmState::kRunning; }));
  backend->sink_->OnVmEvent(Event("GUEST_PANICKED"));
  backend->sink_->OnVmEvent(Event("SHUTDOWN"));
  backend->sink_->OnVmGone("QMP EOF");
  // Captures run off the VM's strand (supervisor.h, Floods): wait for the
  // panic's to end too.
  ASSERT_TRUE(WaitFor([&] {
    const json st = vm->StatusJson();
    return st["state"] == "gone" && st["capture_queue"]["in_flight"] == false &&
           st["capture_queue"]["pending"].empty();
  }));
  EXPECT_EQ(vm->StatusJson()["captures_taken"], 1);
  EXPECT_NE(vm->StatusJson()["last_error"].get<std::string>().find("QMP EOF"), std::string::npos);

  Fixture g;
  FileRegionBackend* b2;
  auto vm2 = g.Make("vm2", &b2);
  ASSERT_TRUE(WaitFor([&] { return vm2->state() == VmState::kRunning; }));
  b2->sink_->OnVmEvent(Event("RESET"));
  b2->sink_->OnVmEvent(Event("RESUME"));
  b2->sink_->OnVmGone("killed");
  ASSERT_TRUE(WaitFor([&] { return vm2->StatusJson()["captures_taken"] == 2; }));
  auto list = vm2->ListCaptures();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].summary["trigger"], "reset");
  EXPECT_EQ((*list)[1].summary["trigger"], "qemu-gone");
}

TEST(SupervisorTest, FailingVmIsIsolatedAndReported) {
  Fixture f;
  FileRegionBackend* bad;
  FileRegionBackend* good;
  auto broken = std::make_unique<FileRegionBackend>(f.region, 65536);
  broken->throw_on_start = true;
  bad = broken.get();
  auto bad_vm = std::make_shared<VmSupervisor>("bad", std::move(broken), f.pool.get_executor(),
                                               CaptureStore(f.tmp.path() / "bad"), f.captures,
                                               SupervisorOptions{});
  SupervisorRegistry registry;
  ASSERT_TRUE(registry.Add(bad_vm).ok());
  bad_vm->Start();
  auto good_vm = f.Make("good", &good);
  ASSERT_TRUE(registry.Add(good_vm).ok());
  EXPECT_FALSE(registry.Add(good_vm).ok()) << "duplicate names must be refused";

  ASSERT_TRUE(WaitFor([&] { return bad_vm->state() == VmState::kFailed; }));
  EXPECT_NE(bad_vm->StatusJson()["last_error"].get<std::string>().find("QMP greeting missing"),
            std::string::npos);
  ASSERT_TRUE(WaitFor([&] { return good_vm->state() == VmState::kRunning; }));

  // A capture that throws is a failed capture, not a dead VM or daemon.
  good->throw_on_capture = true;
  good->sink_->OnVmEvent(Event("GUEST_PANICKED"));
  ASSERT_TRUE(WaitFor([&] { return good_vm->StatusJson()["captures_failed"] == 1; }));
  EXPECT_NE(good_vm->StatusJson()["last_error"].get<std::string>().find("decoder bug"),
            std::string::npos);
  auto none = good_vm->ListCaptures();
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty()) << "a failed capture must leave nothing behind";

  good->throw_on_capture = false;
  std::promise<Result<CaptureSummary>> done;
  good_vm->RequestCapture("manual",
                          [&](Result<CaptureSummary> r) { done.set_value(std::move(r)); });
  auto future = done.get_future();
  ASSERT_EQ(future.wait_for(5s), std::future_status::ready);
  auto result = future.get();
  ASSERT_TRUE(result.ok()) << result.error().message;
  EXPECT_EQ(result->trigger, "manual");
  EXPECT_EQ(registry.All().size(), 2u);
  EXPECT_EQ(registry.Find("good"), good_vm);
  EXPECT_EQ(registry.Find("nope"), nullptr);
  (void)bad;
}

TEST(SupervisorTest, RetentionKeepsNewestCaptures) {
  Fixture f;
  FileRegionBackend* backend;
  auto vm = f.Make("vm1", &backend);  // Retention 3.
  for (int i = 0; i < 5; ++i) {
    std::promise<void> done;
    vm->RequestCapture("manual", [&](Result<CaptureSummary>) { done.set_value(); });
    ASSERT_EQ(done.get_future().wait_for(5s), std::future_status::ready);
    std::this_thread::sleep_for(2ms);  // Distinct millisecond names.
  }
  auto list = vm->ListCaptures();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 3u);
  EXPECT_EQ(vm->StatusJson()["captures_taken"], 5);
}

TEST(SupervisorTest, OfflineVmCannotCapture) {
  Fixture f;
  auto vm = std::make_shared<VmSupervisor>("old", nullptr, f.pool.get_executor(),
                                           CaptureStore(f.tmp.path() / "old"), f.captures,
                                           SupervisorOptions{});
  vm->Start();
  std::promise<Result<CaptureSummary>> done;
  vm->RequestCapture("manual", [&](Result<CaptureSummary> r) { done.set_value(std::move(r)); });
  auto future = done.get_future();
  ASSERT_EQ(future.wait_for(5s), std::future_status::ready);
  auto r = future.get();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("'old' has no backend"), std::string::npos);
  EXPECT_EQ(vm->StatusJson()["state"], "offline");
}

}  // namespace
}  // namespace hvtrace::hostd
