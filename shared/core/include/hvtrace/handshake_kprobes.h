// The guest's half of the virtio handshakes from before userspace, as one
// kernel parameter: the kprobe events that qemu-scripts/guest/hvtrace-boot-probes
// creates (the same definitions, ',' for ' ', ';' between them; a unit test
// keeps them equal). Here, in shared/, because both put it on a guest's
// command line: hvtraced for `hvtrace boot --trace-boot`
// (hostd/qemu/boot_request.cc) and the agent for `hvtrace-agent boot-buffer
// enable` (guest-agent/src/boot_buffer.cc); the static agent links no hostd.
//
// The kernel creates these events at fs_initcall, before the built-in
// virtio_pci and virtio_console probe, and enables them in the top-level
// buffer only; hvtrace-boot-probes (in the initramfs) enables them in the
// boot instance and copies the earlier top-level records there as
// "hvtrace-early:" markers. Needs BTF argument names (Debian 6.12); a kernel
// without them refuses the definitions ("Failed to add event") and the
// initramfs creates them without the index field.
#ifndef HVTRACE_HANDSHAKE_KPROBES_H_
#define HVTRACE_HANDSHAKE_KPROBES_H_

namespace hvtrace {

inline constexpr const char* kHandshakeKprobeParam =
    "kprobe_event="
    "p:kprobes/hvt_virtio_status,vp_modern_set_status,status=$arg2:u8,"
    "index=+0(mdev->pci_dev->dev.driver_data):s32;"
    "p:kprobes/hvt_virtio_status,vp_legacy_set_status,status=$arg2:u8,"
    "index=+0(ldev->pci_dev->dev.driver_data):s32;"
    "p:kprobes/hvt_virtio_features,vp_modern_set_features,features=$arg2:x64,"
    "index=+0(mdev->pci_dev->dev.driver_data):s32;"
    "p:kprobes/hvt_virtio_features,vp_legacy_set_features,features=$arg2:x64,"
    "index=+0(ldev->pci_dev->dev.driver_data):s32;"
    "p:kprobes/hvt_virtio_queue,vp_modern_set_queue_enable,queue=$arg2:u16,enable=$arg3:u8,"
    "index=+0(mdev->pci_dev->dev.driver_data):s32";

// Goes on the command line with kHandshakeKprobeParam. A kernel whose
// sched_clock is unstable (TSCs unsynchronized: a libvirt domain's default
// qemu64 CPU under TCG) switches the top-level buffer to the "global" clock
// at late_initcall_sync, and switching a clock resets that buffer: the
// built-in drivers' kprobe_event= records were gone when the initramfs came
// to copy them (Debian 12 under libvirt, 2026-11-29: "Unstable clock
// detected", 0 records left). "local" is the clock the boot instance already
// uses, so the copies also share its time base. The cost: on such a guest the
// top level orders events of different CPUs by unsynchronized clocks until
// someone sets another clock (which resets it, harmless after boot).
inline constexpr const char* kKeepLocalTraceClock = "trace_clock=local";

}  // namespace hvtrace

#endif  // HVTRACE_HANDSHAKE_KPROBES_H_
