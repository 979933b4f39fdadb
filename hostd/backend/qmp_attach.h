// The QMP half of attach mode (attach_session.h has the state machine): how
// a region reaches a QEMU guest over QMP.
//
//   Probe:  waits (bounded) for the QMP connection, reads the machine type
//           and the vCPU count; on q35 finds a free pcie-root-port whose
//           firmware-assigned 64-bit prefetchable window holds the BAR
//           (pcie.0 takes no hot-plug, and without the window the guest
//           "can't assign; no space" while device_add still answers {}).
//   Plug:   object-add memory-backend-file (share=on) + device_add
//           ivshmem-plain.
//   Unplug: device_del, then QEMU's DEVICE_DELETED (the guest let go; only
//           then does QEMU release the backend) and object-del.
#ifndef HVTRACE_HOSTD_QMP_ATTACH_H_
#define HVTRACE_HOSTD_QMP_ATTACH_H_

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "attach_session.h"
#include "qmp_client.h"

namespace hvtrace::hostd {

class QmpRegionTransport : public RegionTransport {
 public:
  // |connected| says whether QMP is up now; |qmp_socket| is for messages;
  // |remember| is told the region and device once plugged (null once gone),
  // so a restarted daemon finds them again.
  using Remember = std::function<void(const LiveRegion*, const PluggedDevice*)>;
  QmpRegionTransport(boost::asio::any_io_executor io, std::string qmp_socket,
                     std::function<bool()> connected, Remember remember);
  ~QmpRegionTransport() override;
  // The VM's one QMP session, once the backend opened it.
  void SetClient(std::shared_ptr<QmpClient> qmp);
  // QEMU's pid, when known (a QEMU hvtraced booted or adopted with one): a
  // QEMU that runs as another user than the daemon (-runas) gets the region
  // through its group (PlugTarget::qemu_group).
  void SetQemuPid(pid_t pid) { qemu_pid_ = pid; }

  void Probe(const AttachOptions& options, Then<PlugTarget> done) override;
  void Plug(const LiveRegion& region, const PlugTarget& target, Then<PluggedDevice> done) override;
  void Unplug(const PluggedDevice& device, std::chrono::milliseconds timeout,
              Then<std::string> done) override;
  // QEMU said DEVICE_DELETED for |device| (ours, asked for or not): drops
  // its backend and answers a pending Unplug.
  void Unplugged(const PluggedDevice& device);

 private:
  struct Probing;
  pid_t qemu_pid_ = 0;
  void WhenConnected(std::shared_ptr<Probing> probe);
  void CheckMachine(std::shared_ptr<Probing> probe);
  void FindRootPort(std::shared_ptr<Probing> probe);
  void CountCpus(std::shared_ptr<Probing> probe);

  boost::asio::any_io_executor io_;
  const std::string qmp_socket_;
  std::function<bool()> connected_;
  Remember remember_;
  std::shared_ptr<QmpClient> qmp_;
  std::shared_ptr<int> life_ = std::make_shared<int>(0);

  std::mutex mu_;  // Guards pending_.
  struct PendingUnplug {
    std::string device;
    Then<std::string> done;
    std::shared_ptr<boost::asio::steady_timer> timer;
  };
  std::optional<PendingUnplug> pending_;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_QMP_ATTACH_H_
