// Vm: owns one QEMU process started from a VmConfig.
//
// Start() plans the command line (vm_config.h), spawns QEMU in its own process
// group and returns once QEMU listens on its QMP socket (or reports why it
// died). Every wait has a deadline. Stop() asks QEMU to quit over QMP when the
// caller hands in the connection it owns (QEMU 7.2 serves one QMP client, so
// the Vm does not open its own), then escalates to SIGTERM and SIGKILL.
// Cleanup() removes the sockets and the backing files this Vm created; the
// destructor stops and cleans up too, so a failing test leaves nothing behind.
//
// The child gets PR_SET_PDEATHSIG(SIGKILL): if the process that started it
// dies, QEMU dies too. Linux ties that to the *thread* that forked, so start
// VMs from a thread that lives as long as the VM (the main thread, or the
// daemon's I/O thread).
#ifndef HVTRACE_HOSTD_VM_PROCESS_H_
#define HVTRACE_HOSTD_VM_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hvtrace/result.h"
#include "vm_config.h"

namespace hvtrace::hostd {

class QmpSyncClient;

class Vm {
 public:
  // |kvm_usable| resolves Accel::kAuto; pass KvmUsable() normally.
  static Result<std::unique_ptr<Vm>> Start(const VmConfig& config, bool kvm_usable,
                                           std::chrono::milliseconds ready_timeout = std::chrono::seconds(15));
  ~Vm();
  Vm(const Vm&) = delete;
  Vm& operator=(const Vm&) = delete;

  pid_t pid() const { return pid_; }
  const VmConfig& config() const { return config_; }
  const QemuPlan& plan() const { return plan_; }
  bool kvm() const;  // Whether the plan uses KVM.

  // Non-blocking: reaps QEMU if it exited.
  bool Running();
  // Waits up to |timeout| for QEMU to exit; true when it has.
  bool WaitForExit(std::chrono::milliseconds timeout);
  // "exited with status N" / "killed by signal N" / "running".
  std::string DescribeExit() const;
  std::optional<int> wait_status() const { return wait_status_; }

  // QMP quit through |qmp| (if given and connected), then SIGTERM, then
  // SIGKILL, each given |grace| to work. Fails only if QEMU cannot be reaped.
  Status Stop(QmpSyncClient* qmp = nullptr, std::chrono::milliseconds grace = std::chrono::seconds(3));
  // SIGKILL to the process group, as if QEMU crashed; does not wait.
  void Kill();

  // Removes the QMP/console sockets and the backing files this Vm created
  // (those that did not exist before Start and are marked remove_on_cleanup).
  // Call after QEMU exited; the destructor does both.
  void Cleanup();
  // Paths Cleanup() removes, for tests that check them.
  std::vector<std::string> OwnedPaths() const;

  // The last |max_bytes| of QEMU's own stderr (config.qemu_log).
  std::string QemuLogTail(size_t max_bytes = 2048) const;

 private:
  Vm() = default;

  VmConfig config_;
  QemuPlan plan_;
  pid_t pid_ = -1;
  std::optional<int> wait_status_;
  std::vector<std::string> owned_files_;  // Sockets + created backing files.
  bool cleaned_ = false;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_VM_PROCESS_H_
