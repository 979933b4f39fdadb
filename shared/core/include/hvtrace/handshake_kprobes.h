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

}  // namespace hvtrace

#endif  // HVTRACE_HANDSHAKE_KPROBES_H_
