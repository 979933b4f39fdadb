// Attach mode, once for every backend: the state machine that hot-plugs a
// region into a running VM, waits for the guest agent, and unplugs it.
//
//   Attach:  refuse when busy or attached → transport Probe (is the VM
//            ready, how many vCPUs, whose file) → LiveRegion::Create (the
//            header written before the guest can see it) → transport Plug →
//            attached → poll the header until the agent announces itself or
//            |wait| passes → reply.
//   Detach:  transport Unplug, which answers only once the VM let go of the
//            device → the region is marked detached (kept mapped, so streams
//            and captures still read it) → reply.
//   Gone:    the transport saw the device leave, asked for or not (a guest
//            may eject it): DeviceGone.
//
// A backend (QMP, libvirt) supplies only the RegionTransport steps. The
// replies are AttachReply and DetachReply (vm/attach_reply.h). Thread-safe; transports may call
// back on any thread.
#ifndef HVTRACE_HOSTD_ATTACH_SESSION_H_
#define HVTRACE_HOSTD_ATTACH_SESSION_H_

#include <sys/types.h>

#include <boost/asio/any_io_executor.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "hvtrace/result.h"
#include "live_region.h"
#include "vm_backend.h"

namespace hvtrace::hostd {

// What the transport learnt before the plug: how to make the region.
struct PlugTarget {
  uint32_t cpus = 1;
  std::optional<uid_t> owner_uid;  // QEMU's user, when not the daemon's.
  std::optional<gid_t> owner_gid;
  // QEMU dropped root (-runas) and opens the daemon's file through its group.
  std::optional<gid_t> qemu_group;
  std::string bus;                                      // q35: the root port to plug into.
  nlohmann::json transport = nlohmann::json::object();  // {kind, …} for the reply.
};

// The device that carries the region in the VM.
struct PluggedDevice {
  std::string id;      // QMP device id, or libvirt alias.
  std::string memdev;  // Its memory backend (QMP object id, "shmem NAME").
  std::string bus;     // q35: the root port; empty otherwise.
  nlohmann::json transport = nlohmann::json::object();  // Merged into the reply's.
};

template <typename T>
using Then = std::function<void(Result<T>)>;

class RegionTransport {
 public:
  virtual ~RegionTransport() = default;
  // Checks that the VM can take a region of |options| now.
  virtual void Probe(const AttachOptions& options, Then<PlugTarget> done) = 0;
  // Plugs |region| (created, header written) into the VM.
  virtual void Plug(const LiveRegion& region, const PlugTarget& target,
                    Then<PluggedDevice> done) = 0;
  // Unplugs |device|; answers once the VM let go of it (or not within
  // |timeout|), with what went wrong after it did (QMP: object-del's error;
  // empty when nothing did).
  virtual void Unplug(const PluggedDevice& device, std::chrono::milliseconds timeout,
                      Then<std::string> done) = 0;
};

class AttachSession {
 public:
  // |timers| runs the agent wait; |transport| outlives the session.
  AttachSession(boost::asio::any_io_executor timers, RegionTransport& transport);
  ~AttachSession();
  AttachSession(const AttachSession&) = delete;
  AttachSession& operator=(const AttachSession&) = delete;

  void Attach(const AttachOptions& options, AttachDone done);
  void Detach(std::chrono::milliseconds timeout, DetachDone done);
  // The device |id| left the VM. False when it is not ours.
  bool DeviceGone(const std::string& id);
  // A region plugged before this daemon started, found again; or why it
  // could not be (shown in `status`).
  void Adopt(std::shared_ptr<LiveRegion> region, PluggedDevice device);
  void AdoptFailed(std::string message);

  std::shared_ptr<LiveRegion> region() const;
  // The plugged device; none when detached.
  std::optional<PluggedDevice> device() const;
  // For `status`: null when the VM never had a region.
  nlohmann::json Status() const;

 private:
  struct Job;
  void Plug(std::shared_ptr<Job> job, PlugTarget target);
  void AwaitAgent(std::shared_ptr<Job> job);
  void Finish(std::shared_ptr<Job> job, Result<AttachReply> result);

  boost::asio::any_io_executor timers_;
  RegionTransport& transport_;
  // Callbacks still queued when the session goes check this first.
  std::shared_ptr<int> life_ = std::make_shared<int>(0);

  mutable std::mutex mu_;               // Guards the fields below.
  std::shared_ptr<LiveRegion> region_;  // Kept after detach.
  std::optional<PluggedDevice> device_;
  bool busy_ = false;
  nlohmann::json last_;  // Last attach/detach reply or error.
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_ATTACH_SESSION_H_
