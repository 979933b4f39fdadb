// Which VM's capture runs next on the daemon's few worker threads.
//
// Every VM's captures share the worker pool (two threads by default). A guest
// can trigger captures at will while it runs (pvpanic crash-loaded, resets);
// such captures must never keep another VM's panic waiting. So there are two
// lanes: the urgent lane (panics, a VM found stopped or gone, an operator's
// `capture`) and the guest lane (crashloaded, reset). Urgent jobs always start
// first, and guest-lane jobs hold at most |slots| - 1 of the |slots| (at least
// one), so with two or more slots a panic never waits for a guest-triggered
// capture to end. Within a lane, jobs start in submission order.
//
// Bounded: each VmSupervisor has at most one job here at a time (it coalesces
// the rest itself, supervisor.h), so the queue never holds more jobs than
// there are VMs.
#ifndef HVTRACE_HOSTD_CAPTURE_QUEUE_H_
#define HVTRACE_HOSTD_CAPTURE_QUEUE_H_

#include <boost/asio/any_io_executor.hpp>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

namespace hvtrace::hostd {

class CaptureQueue : public std::enable_shared_from_this<CaptureQueue> {
 public:
  enum class Lane { kUrgent, kGuest };
  using Ticket = uint64_t;

  // Jobs run on |pool|, at most |slots| at once.
  CaptureQueue(boost::asio::any_io_executor pool, size_t slots);

  // How a job got its slot; a capture keeps it in its manifest (extra.queue)
  // as the record that it was, or was not, kept waiting by other captures.
  struct Start {
    Lane lane;
    // False: a slot was free when it was submitted, so it ran behind no
    // other job. True: it waited for running jobs to end (or was promoted).
    bool waited;
  };

  // Runs |job| (blocking work: a whole capture) once a slot of |lane| is
  // free. Thread-safe.
  Ticket Submit(Lane lane, std::function<void(const Start&)> job);
  // Moves a guest-lane job that has not started yet to the urgent lane: its
  // VM has a panic waiting behind it. No effect once it started.
  void Promote(Ticket ticket);

  // {"urgent": {"queued", "running"}, "guest": {...}, "slots"} for `status`.
  nlohmann::json StatsJson() const;

 private:
  struct Job {
    Ticket ticket;
    std::function<void(const Start&)> run;
  };
  // Starts what may start now (|mu_| held); the jobs are posted to the pool.
  void StartReadyLocked();
  void Run(Start start, std::function<void(const Start&)> job);

  boost::asio::any_io_executor pool_;
  const size_t slots_;
  mutable std::mutex mu_;
  std::deque<Job> urgent_, guest_;
  size_t running_urgent_ = 0;
  size_t running_guest_ = 0;
  Ticket next_ticket_ = 1;
  Ticket submitting_ = 0;  // The job Submit is starting, if a slot is free.
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CAPTURE_QUEUE_H_
