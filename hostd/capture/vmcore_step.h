// The capture step that dumps guest memory (vmcore = on-panic): while the
// guest is still paused after its panic, QEMU's dump-guest-memory writes a
// kdump-compressed dump (makedumpfile's and crash's format, with the
// guest's VMCOREINFO note when the VM has `-device vmcoreinfo` and the guest
// loaded qemu_fw_cfg), which becomes the capture's `vmcore`. It runs after
// the region copies are durable and the log is read; the guest is released
// only after Take returns, so after the dump is durable (Commit fsyncs it).
#ifndef HVTRACE_HOSTD_CAPTURE_VMCORE_STEP_H_
#define HVTRACE_HOSTD_CAPTURE_VMCORE_STEP_H_

#include "capture_inputs.h"
#include "capture_store.h"

namespace hvtrace::hostd {

inline constexpr const char* kVmcoreFileName = "vmcore";

// Dumps through |in.dump_guest_memory| into the capture as `vmcore` and
// records manifest extra.vmcore ({file, bytes, format, dump_ms, move_ms} or
// {error}) and extra.timing_ms.vmcore. Never fails the capture.
void VmcoreStep(const CaptureInputs& in, PendingCapture& pending, CaptureManifest& manifest);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CAPTURE_VMCORE_STEP_H_
