// The Asio-backed libvirt event loop, driven through libvirt's own public
// entry points (virEventAddHandle & co. call the registered implementation),
// with pipes, so no daemon is needed.
#include "libvirt_event_loop.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <libvirt/libvirt.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace hvtrace::hostd {
namespace {

using namespace std::chrono_literals;

struct Recorder {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> events;  // Masks, in order.
  std::atomic<int> reads_per_call{1};
  std::atomic<bool> remove_self{false};  // Read on the loop's thread.
  int watch = -1;
  std::atomic<int> freed{0};
  std::thread::id free_thread;

  bool WaitFor(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, timeout, [&] { return events.size() >= n; });
  }
  size_t count() {
    std::lock_guard lock(mu);
    return events.size();
  }
};

void OnHandle(int watch, int fd, int events, void* opaque) {
  auto* r = static_cast<Recorder*>(opaque);
  if (events & VIR_EVENT_HANDLE_READABLE) {
    char c;
    for (int i = 0; i < r->reads_per_call; ++i) {
      if (read(fd, &c, 1) != 1) break;
    }
  }
  if (r->remove_self) virEventRemoveHandle(watch);
  std::lock_guard lock(r->mu);
  r->events.push_back(events);
  r->cv.notify_all();
}

void OnFree(void* opaque) {
  auto* r = static_cast<Recorder*>(opaque);
  r->free_thread = std::this_thread::get_id();
  r->freed.fetch_add(1);
}

void OnTimeout(int, void* opaque) { OnHandle(-1, -1, 0, opaque); }

class LibvirtEventLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(LibvirtEventLoop::EnsureInstalled().ok());
    ASSERT_EQ(pipe2(fds_, O_CLOEXEC | O_NONBLOCK), 0);
  }
  void TearDown() override {
    if (fds_[0] >= 0) close(fds_[0]);
    if (fds_[1] >= 0) close(fds_[1]);
  }
  int fds_[2] = {-1, -1};
};

TEST_F(LibvirtEventLoopTest, ReadableDispatchesAndStaysLevelTriggered) {
  Recorder r;
  int watch = virEventAddHandle(fds_[0], VIR_EVENT_HANDLE_READABLE, &OnHandle, &r, &OnFree);
  ASSERT_GT(watch, 0);
  // Nothing to read: no callback.
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(r.count(), 0u);
  // Three bytes, one read per callback: libvirt's loop is poll()-like, so
  // the handle must fire three times without new writes (an edge-triggered
  // reactor would fire once and stall).
  ASSERT_EQ(write(fds_[1], "abc", 3), 3);
  ASSERT_TRUE(r.WaitFor(3, 2s)) << "callbacks: " << r.count();
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(r.count(), 3u);
  for (int e : r.events) EXPECT_EQ(e, VIR_EVENT_HANDLE_READABLE);
  // Data written long after the loop went idle is still seen.
  std::this_thread::sleep_for(100ms);
  ASSERT_EQ(write(fds_[1], "d", 1), 1);
  ASSERT_TRUE(r.WaitFor(4, 2s));

  ASSERT_EQ(virEventRemoveHandle(watch), 0);
  // The free callback runs later, from the loop, never inside remove.
  for (int i = 0; i < 100 && r.freed.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(r.freed.load(), 1);
  EXPECT_NE(r.free_thread, std::this_thread::get_id());
  EXPECT_EQ(virEventRemoveHandle(watch), -1);
}

TEST_F(LibvirtEventLoopTest, UpdateToZeroSilencesAndHangupIsReported) {
  Recorder r;
  int watch = virEventAddHandle(fds_[0], VIR_EVENT_HANDLE_READABLE, &OnHandle, &r, nullptr);
  ASSERT_GT(watch, 0);
  virEventUpdateHandle(watch, 0);
  ASSERT_EQ(write(fds_[1], "x", 1), 1);
  std::this_thread::sleep_for(150ms);
  EXPECT_EQ(r.count(), 0u) << "a handle that wants no events must not fire";
  r.reads_per_call = 8;
  virEventUpdateHandle(watch, VIR_EVENT_HANDLE_READABLE);
  ASSERT_TRUE(r.WaitFor(1, 2s));
  // libvirt removes a hung-up handle from its callback. Armed before the
  // close: HANGUP is level-triggered, and a callback that ran before the flag
  // was set would leave the handle firing.
  r.remove_self = true;
  close(fds_[1]);
  fds_[1] = -1;
  ASSERT_TRUE(r.WaitFor(2, 2s));
  EXPECT_TRUE(r.events[1] & VIR_EVENT_HANDLE_HANGUP) << r.events[1];
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(r.count(), 2u);
}

TEST_F(LibvirtEventLoopTest, WritableFires) {
  Recorder r;
  r.remove_self = true;
  int watch = virEventAddHandle(fds_[1], VIR_EVENT_HANDLE_WRITABLE, &OnHandle, &r, nullptr);
  ASSERT_GT(watch, 0);
  ASSERT_TRUE(r.WaitFor(1, 2s));
  EXPECT_EQ(r.events[0], VIR_EVENT_HANDLE_WRITABLE);
}

TEST_F(LibvirtEventLoopTest, TimeoutsArePeriodicAndCanBeDisabled) {
  Recorder r;
  auto start = std::chrono::steady_clock::now();
  int id = virEventAddTimeout(20, &OnTimeout, &r, &OnFree);
  ASSERT_GT(id, 0);
  ASSERT_TRUE(r.WaitFor(3, 2s));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 55ms);
  virEventUpdateTimeout(id, -1);
  std::this_thread::sleep_for(30ms);  // Let a firing already queued land.
  size_t n = r.count();
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(r.count(), n) << "a disabled timeout fired";
  // Frequency 0: "as soon as possible", again and again until changed.
  virEventUpdateTimeout(id, 0);
  ASSERT_TRUE(r.WaitFor(n + 20, 2s));
  ASSERT_EQ(virEventRemoveTimeout(id), 0);
  for (int i = 0; i < 100 && r.freed.load() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(r.freed.load(), 1);
  std::this_thread::sleep_for(30ms);
  n = r.count();
  std::this_thread::sleep_for(60ms);
  EXPECT_EQ(r.count(), n) << "a removed timeout fired";
}

TEST_F(LibvirtEventLoopTest, IdleLoopDoesNotSpin) {
  Recorder r;
  int watch = virEventAddHandle(fds_[0], VIR_EVENT_HANDLE_READABLE, &OnHandle, &r, nullptr);
  ASSERT_GT(watch, 0);
  auto before = LibvirtEventLoop::GetStats();
  std::this_thread::sleep_for(200ms);
  auto after = LibvirtEventLoop::GetStats();
  EXPECT_EQ(after.wakeups, before.wakeups);
  EXPECT_EQ(after.handle_dispatches, before.handle_dispatches);
  EXPECT_EQ(virEventRemoveHandle(watch), 0);
}

TEST(LibvirtEventLoopInstall, SecondExecutorIsRefused) {
  ASSERT_TRUE(LibvirtEventLoop::EnsureInstalled().ok());
  boost::asio::io_context other;
  Status s = LibvirtEventLoop::Install(other.get_executor());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("one event implementation per process"), std::string::npos)
      << s.error().message;
  EXPECT_TRUE(LibvirtEventLoop::Install(LibvirtEventLoop::executor()).ok());
}

}  // namespace
}  // namespace hvtrace::hostd
