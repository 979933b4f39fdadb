// CaptureQueue: a panic (urgent lane) never waits for guest-triggered
// captures, which hold at most all but one slot; a promoted job leaves the
// guest lane; each job learns whether it waited for a slot. Jobs block on latches the test opens,
// so nothing depends on timing.
#include "capture_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <future>
#include <thread>

namespace hvtrace::hostd {
namespace {

using namespace std::chrono_literals;

template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds timeout = 5s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return pred();
}

TEST(CaptureQueueTest, PanicStartsWhileGuestCapturesHoldTheirSlot) {
  boost::asio::thread_pool pool(4);
  auto queue = std::make_shared<CaptureQueue>(pool.get_executor(), 2);
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<int> guest_started{0}, urgent_done{0};
  for (int i = 0; i < 3; ++i) {
    queue->Submit(CaptureQueue::Lane::kGuest, [&, gate](const CaptureQueue::Start& start) {
      // The first takes a free slot; the others wait for it.
      EXPECT_EQ(start.waited, guest_started != 0);
      ++guest_started;
      gate.wait();
    });
  }
  ASSERT_TRUE(WaitFor([&] { return guest_started == 1; }));
  // Only one of the two slots goes to guest captures.
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(guest_started, 1);
  EXPECT_EQ(queue->StatsJson()["guest"]["queued"], 2);

  // The panic's capture records that it waited for no other capture.
  std::atomic<bool> urgent_waited{true};
  queue->Submit(CaptureQueue::Lane::kUrgent, [&](const CaptureQueue::Start& start) {
    urgent_waited = start.waited;
    ++urgent_done;
  });
  EXPECT_TRUE(WaitFor([&] { return urgent_done == 1; }))
      << "a panic waited for a guest-triggered capture: " << queue->StatsJson().dump();
  EXPECT_FALSE(urgent_waited);
  EXPECT_EQ(guest_started, 1);
  release.set_value();
  EXPECT_TRUE(WaitFor([&] { return guest_started == 3; }));
  pool.join();
  const auto stats = queue->StatsJson();
  EXPECT_EQ(stats["guest"]["running"], 0);
  EXPECT_EQ(stats["urgent"]["running"], 0);
}

TEST(CaptureQueueTest, PromotedJobGoesAheadOfOtherGuestJobs) {
  boost::asio::thread_pool pool(2);
  auto queue = std::make_shared<CaptureQueue>(pool.get_executor(), 1);
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::mutex mu;
  std::vector<std::string> order;
  auto record = [&](std::string what) {
    std::lock_guard lock(mu);
    order.push_back(std::move(what));
  };
  queue->Submit(CaptureQueue::Lane::kGuest, [&, gate](const CaptureQueue::Start&) {
    record("a");
    gate.wait();
  });
  queue->Submit(CaptureQueue::Lane::kGuest, [&](const CaptureQueue::Start&) { record("b"); });
  const auto c = queue->Submit(CaptureQueue::Lane::kGuest, [&](const CaptureQueue::Start& start) {
    EXPECT_EQ(start.lane, CaptureQueue::Lane::kUrgent);  // Promoted.
    EXPECT_TRUE(start.waited);
    record("c");
  });
  queue->Promote(c);
  EXPECT_EQ(queue->StatsJson()["urgent"]["queued"], 1);
  release.set_value();
  pool.join();
  EXPECT_EQ(order, (std::vector<std::string>{"a", "c", "b"}));
}

TEST(CaptureQueueTest, AThrowingJobFreesItsSlot) {
  boost::asio::thread_pool pool(1);
  auto queue = std::make_shared<CaptureQueue>(pool.get_executor(), 1);
  std::atomic<bool> ran{false};
  queue->Submit(CaptureQueue::Lane::kUrgent,
                [](const CaptureQueue::Start&) { throw std::runtime_error("bug"); });
  queue->Submit(CaptureQueue::Lane::kUrgent, [&](const CaptureQueue::Start&) { ran = true; });
  pool.join();
  EXPECT_TRUE(ran);
}

}  // namespace
}  // namespace hvtrace::hostd
