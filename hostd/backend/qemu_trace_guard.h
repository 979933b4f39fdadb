// Bounds what a guest can make QEMU write into its boot-handshake trace log
// (boot_trace.h). QEMU's `log` backend has no size limit, and a guest can
// make it write without end (a loop writing a virtio status or a PCI config
// register is one line per write). Every few seconds the guard looks at the
// file's size; past |limit| it turns hvtrace's trace events off through QMP
// (trace-event-set-state, one per event: "*" fails on QEMU 7.2's statically
// disabled events) and reports a VM event HVTRACE_QEMU_TRACE_OFF {bytes,
// limit} once, which the VM's captures list among their QMP events. The log
// keeps what it has; a new boot of the VM starts a new log.
#ifndef HVTRACE_HOSTD_QEMU_TRACE_GUARD_H_
#define HVTRACE_HOSTD_QEMU_TRACE_GUARD_H_

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>

#include "qmp_client.h"
#include "vm_backend.h"

namespace hvtrace::hostd {

inline constexpr uint64_t kQemuTraceLogLimit = 64ull << 20;
inline constexpr const char* kEventQemuTraceOff = "HVTRACE_QEMU_TRACE_OFF";

class QemuTraceGuard : public std::enable_shared_from_this<QemuTraceGuard> {
 public:
  using Report = std::function<void(const VmEvent&)>;
  QemuTraceGuard(boost::asio::any_io_executor io, std::filesystem::path log, uint64_t limit,
                 std::chrono::milliseconds period, std::shared_ptr<QmpClient> qmp, Report report);

  void Start();
  void Stop();  // Idempotent; no report after it returns.

 private:
  void Arm();
  void Check();

  boost::asio::steady_timer timer_;
  const std::filesystem::path log_;
  const uint64_t limit_;
  const std::chrono::milliseconds period_;
  std::shared_ptr<QmpClient> qmp_;
  std::mutex mu_;
  Report report_;  // Guarded by |mu_|; empty once stopped.
  bool tripped_ = false;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_QEMU_TRACE_GUARD_H_
