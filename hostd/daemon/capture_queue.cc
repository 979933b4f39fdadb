#include "capture_queue.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <exception>

#include "daemon_log.h"

namespace hvtrace::hostd {

CaptureQueue::CaptureQueue(boost::asio::any_io_executor pool, size_t slots)
    : pool_(std::move(pool)), slots_(std::max<size_t>(slots, 1)) {}

CaptureQueue::Ticket CaptureQueue::Submit(Lane lane, std::function<void(const Start&)> job) {
  std::lock_guard lock(mu_);
  const Ticket ticket = next_ticket_++;
  (lane == Lane::kUrgent ? urgent_ : guest_).push_back(Job{ticket, std::move(job)});
  submitting_ = ticket;
  StartReadyLocked();
  submitting_ = 0;
  return ticket;
}

void CaptureQueue::Promote(Ticket ticket) {
  std::lock_guard lock(mu_);
  auto it =
      std::find_if(guest_.begin(), guest_.end(), [&](const Job& j) { return j.ticket == ticket; });
  if (it == guest_.end()) return;
  urgent_.push_back(std::move(*it));
  guest_.erase(it);
  StartReadyLocked();
}

void CaptureQueue::StartReadyLocked() {
  // Guest-lane jobs leave one slot free for a panic (when there are two).
  const size_t guest_slots = std::max<size_t>(slots_ - 1, 1);
  while (running_urgent_ + running_guest_ < slots_) {
    Lane lane;
    if (!urgent_.empty()) {
      lane = Lane::kUrgent;
    } else if (!guest_.empty() && running_guest_ < guest_slots) {
      lane = Lane::kGuest;
    } else {
      return;
    }
    auto& q = lane == Lane::kUrgent ? urgent_ : guest_;
    Job job = std::move(q.front());
    q.pop_front();
    ++(lane == Lane::kUrgent ? running_urgent_ : running_guest_);
    const Start start{lane, job.ticket != submitting_};
    boost::asio::post(pool_,
                      [self = shared_from_this(), start, run = std::move(job.run)]() mutable {
                        self->Run(start, std::move(run));
                      });
  }
}

void CaptureQueue::Run(Start start, std::function<void(const Start&)> job) {
  try {
    job(start);
  } catch (const std::exception& e) {
    // Jobs report their own errors; this only keeps the slot accounting right.
    LogErr(std::string("capture job threw: ") + e.what());
  } catch (...) {
    LogErr("capture job threw an exception of unknown type");
  }
  std::lock_guard lock(mu_);
  --(start.lane == Lane::kUrgent ? running_urgent_ : running_guest_);
  StartReadyLocked();
}

nlohmann::json CaptureQueue::StatsJson() const {
  std::lock_guard lock(mu_);
  return {{"slots", slots_},
          {"urgent", {{"queued", urgent_.size()}, {"running", running_urgent_}}},
          {"guest", {{"queued", guest_.size()}, {"running", running_guest_}}}};
}

}  // namespace hvtrace::hostd
