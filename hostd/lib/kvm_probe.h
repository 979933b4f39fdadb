// Deciding whether KVM can run guests here, on a positive signal.
//
// A /dev/kvm that opens proves nothing: on this project's CI machines it
// opens, creates vCPUs and even runs a few real-mode instructions, yet a real
// guest prints nothing (or QEMU stops with "KVM internal error ... emulation
// failure"). So the probe boots a real QEMU with -accel kvm on a 512-byte boot
// sector that writes kKvmProbeBanner to the serial port and halts; KVM counts
// as usable only if that exact string arrives before the deadline and QEMU
// reports no KVM error. Anything else is "unusable", with the reason.
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
  // SeaBIOS plus the boot sector take well under a second under working KVM;
  // the deadline only bounds how long a broken host delays the decision.
  std::chrono::milliseconds deadline = std::chrono::seconds(4);
};

// Runs the probe now (spawns and always reaps one QEMU; blocks up to the
// deadline). Safe to call from any thread of a threaded process.
KvmProbeResult ProbeKvm(const KvmProbeOptions& options = {});

// The verdict for this process: HVTRACE_ACCEL=tcg → unusable without probing,
// HVTRACE_ACCEL=kvm → usable (the user insists), otherwise ProbeKvm() with
// $HVTRACE_QEMU as the binary, run once and cached.
const KvmProbeResult& KvmVerdict();

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_KVM_PROBE_H_
