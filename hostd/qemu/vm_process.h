// Vm: owns one QEMU process started from a VmConfig.
//
// Start() plans the command line (vm_config.h) for what the binary supports
// (qemu_caps.h, probed once per binary), spawns QEMU in its own process
// group and returns once QEMU listens on its QMP socket and has sized the
// memory-backend files it maps (or reports why it died). Every wait has a
// deadline. Stop() asks QEMU to quit over QMP when the
// caller hands in the connection it owns (QEMU 7.2 serves one QMP client, so
// the Vm does not open its own), then escalates to SIGTERM and SIGKILL.
// Cleanup() removes the sockets and the backing files this Vm created; the
// destructor stops and cleans up too, so a failing test leaves nothing behind.
//
// Lifetime (VmLifetime): a test harness wants QEMU to die with it
// (kDiesWithStarter: PR_SET_PDEATHSIG(SIGKILL); Linux ties that to the
// *thread* that forked, so start such VMs from a thread that lives as long as
// the VM). hvtraced wants the opposite (kIndependent): QEMU gets its own
// session and outlives a daemon restart; the daemon records pid + start time
// (ProcessStartTime) and a restarted daemon takes it back with Reattach().
// Release() forgets a VM without stopping it.
#ifndef HVTRACE_HOSTD_VM_PROCESS_H_
#define HVTRACE_HOSTD_VM_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hvtrace/result.h"
#include "vm_config.h"

namespace hvtrace::hostd {

class QmpSyncClient;

enum class VmLifetime {
  kDiesWithStarter,  // PDEATHSIG: QEMU dies when the starting thread's process does.
  kIndependent,      // Own session, no PDEATHSIG: survives its starter.
};

// The kernel's start time of |pid| (clock ticks since host boot, field 22 of
// /proc/PID/stat); with the pid it names one process for the host's uptime,
// so a reused pid is told apart. nullopt when the process does not exist.
std::optional<uint64_t> ProcessStartTime(pid_t pid);
// Whether |pid| is still the process that had |start_time| (ProcessStartTime
// when recorded; 0: not recorded, then only whether |pid| exists).
bool StillRunning(pid_t pid, uint64_t start_time);

// What a restarted daemon knows about a QEMU an earlier daemon started.
struct VmIdentity {
  pid_t pid = -1;
  uint64_t start_time = 0;               // ProcessStartTime at launch.
  std::string cmdline_mentions;          // A string QEMU's argv must contain (its QMP socket).
  std::vector<std::string> owned_paths;  // Removed by Cleanup (sockets, backing file).
};

class Vm {
 public:
  // |kvm_usable| resolves Accel::kAuto; pass KvmUsable() normally.
  static Result<std::unique_ptr<Vm>> Start(
      const VmConfig& config, bool kvm_usable,
      std::chrono::milliseconds ready_timeout = std::chrono::seconds(15),
      VmLifetime lifetime = VmLifetime::kDiesWithStarter);
  // Takes back a QEMU started by another process (an earlier hvtraced) after
  // checking that |identity.pid| still is that QEMU: same start time, and its
  // argv mentions |identity.cmdline_mentions|. Errors say which check failed.
  static Result<std::unique_ptr<Vm>> Reattach(const std::string& name, const VmIdentity& identity);
  // What is left of a QEMU that exited while nobody watched: not running;
  // Cleanup() removes |owned_paths| (after its region has been captured).
  static std::unique_ptr<Vm> Remnant(const std::string& name, std::vector<std::string> owned_paths);
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
  Status Stop(QmpSyncClient* qmp = nullptr,
              std::chrono::milliseconds grace = std::chrono::seconds(3));
  // SIGKILL to the process group, as if QEMU crashed; does not wait.
  void Kill();

  // Removes the QMP/console sockets and the backing files this Vm created
  // (those that did not exist before Start and are marked remove_on_cleanup).
  // Call after QEMU exited; the destructor does both.
  void Cleanup();
  // Paths Cleanup() removes, for tests that check them.
  std::vector<std::string> OwnedPaths() const;
  // Forgets the VM: it keeps running, its files stay, the destructor does
  // nothing (a daemon exiting with vm_on_shutdown = keep).
  void Release();
  // What a later Reattach() needs; start_time is 0 if it could not be read.
  VmIdentity Identity() const;

  // The last |max_bytes| of QEMU's own stderr (config.qemu_log).
  std::string QemuLogTail(size_t max_bytes = 2048) const;

 private:
  Vm() = default;
  void Signal(int signo);
  // Logs (once) that |pidfd_| no longer is a pidfd (vm_process.cc, IsPidfd).
  void NotePidfdLost();
  // The steps of Start(), in order.
  void TakeOwnedFiles();
  Status Spawn(VmLifetime lifetime);
  Status AwaitStartup(std::chrono::milliseconds ready_timeout);
  bool BackingFilesSized() const;

  VmConfig config_;
  QemuPlan plan_;
  pid_t pid_ = -1;
  uint64_t start_time_ = 0;
  bool child_ = true;              // false after Reattach: not ours to waitpid.
  int pidfd_ = -1;                 // Reattached VMs: pins the process, readable when it exits.
  bool pidfd_lost_noted_ = false;  // NotePidfdLost logged.
  bool released_ = false;
  std::optional<int> wait_status_;
  std::vector<std::string> owned_files_;  // Sockets + created backing files.
  bool cleaned_ = false;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_VM_PROCESS_H_
