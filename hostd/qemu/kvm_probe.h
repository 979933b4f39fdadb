// Deciding whether KVM can run guests here, on a positive signal.
//
// A /dev/kvm that opens proves nothing: on this project's CI machines it
// opens, creates vCPUs and sometimes even runs a real-mode boot sector, yet a
// real kernel stops in its decompressor with "KVM internal error ...
// emulation failure" (KVM cannot emulate a VEX-encoded instruction there). So
// the probe runs two guests under -accel kvm, each until a positive signal:
//   1. a 512-byte boot sector that writes kKvmProbeBanner to the serial port
//      (cheap; catches a KVM that runs nothing at all), then
//   2. when a kernel is named, that very kernel, with no init to run: usable
//      only when it finishes booting (it asks for an init or a root fs).
// Any KVM error from QEMU, an early exit or silence until the deadline means
// "unusable", with the reason.
#ifndef HVTRACE_HOSTD_KVM_PROBE_H_
#define HVTRACE_HOSTD_KVM_PROBE_H_

#include <chrono>
#include <string>

namespace hvtrace::hostd {

inline constexpr const char* kKvmProbeBanner = "HVTRACE-KVM-PROBE-OK";

struct KvmProbeResult {
  bool usable = false;
  // Why not (or "probe guest wrote HVTRACE-KVM-PROBE-OK after N ms").
  std::string reason;
};

struct KvmProbeOptions {
  std::string qemu_binary = "qemu-system-x86_64";
  std::string device = "/dev/kvm";
  // The guest kernel to boot in stage 2 (a bzImage); empty skips stage 2.
  std::string kernel;
  // SeaBIOS plus the boot sector take well under a second under working KVM;
  // the deadline only bounds how long a broken host delays the decision.
  std::chrono::milliseconds deadline = std::chrono::seconds(4);
  // A kernel boots to its init in 1-2 s under KVM (minutes under TCG).
  std::chrono::milliseconds kernel_deadline = std::chrono::seconds(20);
};

// Runs the probe now (spawns and always reaps up to two QEMUs; blocks up to
// both deadlines). Safe to call from any thread of a threaded process.
KvmProbeResult ProbeKvm(const KvmProbeOptions& options = {});

// The verdict for guests of |kernel| in this process: HVTRACE_ACCEL=tcg →
// unusable without probing, HVTRACE_ACCEL=kvm → usable (the user insists),
// otherwise ProbeKvm() with $HVTRACE_QEMU as the binary, run once per kernel
// path and cached. An empty |kernel| runs stage 1 only.
KvmProbeResult KvmVerdict(const std::string& kernel);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_KVM_PROBE_H_
