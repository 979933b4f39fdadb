// The host side of a VM's boot (`hvtrace boot NAME --trace-boot`): QEMU's own
// trace events for the boot handshakes, written by QEMU 7.2's `log` trace
// backend to a file (qemu_trace_log.h reads it), and the handshake devices a
// test or demo VM can be given (`--device virtio-blk`, ...), each with a
// backend that reaches nothing outside QEMU.
//
// The events (names checked against Debian QEMU 7.2's `-trace help`):
//   fw_cfg_select, fw_cfg_read     firmware (and the kernel) reading fw_cfg
//   virtio_set_status              every virtio device's status walk
//                                  (0 reset, 1 ACKNOWLEDGE, 3 +DRIVER,
//                                  11 +FEATURES_OK, 15 +DRIVER_OK)
//   pci_cfg_write                  PCI config writes (BAR sizing, enabling)
//   msix_write_config              MSI-X enabled/masked (interrupt setup)
//   virtio_serial_handle_control_message, virtio_serial_send_control_event,
//   virtio_console_chr_event       virtio-serial port handshakes
// QEMU 7.2 has no event for virtio feature negotiation or queue setup
// (FEATURES_OK in the status stands for the former) and none for pvpanic.
// Left out on purpose, as they fire per I/O or per probe read: virtio_notify,
// virtio_queue_notify, virtio_pci_notify*, virtqueue_*, virtio_blk_*
// requests, pci_cfg_read (~1,300 lines per boot).
#ifndef HVTRACE_HOSTD_BOOT_TRACE_H_
#define HVTRACE_HOSTD_BOOT_TRACE_H_

#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

inline constexpr std::string_view kQemuTraceLogName = "qemu-trace.log";

// The curated event list above, in that order.
const std::vector<std::string>& BootTraceEvents();

// QEMU's arguments for tracing |events| into |log_path|: -msg timestamp=on
// (TID@SEC.USEC: on every line), -D |log_path|, one -trace enable=E each.
// Errors name a bad event name or path.
Result<std::vector<std::string>> BootTraceArgs(const std::string& log_path,
                                               const std::vector<std::string>& events);

// The handshake devices a boot may ask for.
inline constexpr std::string_view kHandshakeDevices[] = {"virtio-blk", "virtio-net",
                                                         "virtio-serial"};

// Checks a device list: known names, each at most once.
Status CheckHandshakeDevices(const std::vector<std::string>& devices);

// QEMU arguments for |devices|, in that order:
//   virtio-blk     a 64 MiB null-co drive (reads zeroes, writes vanish; no
//                  host file) on virtio-blk-pci
//   virtio-net     a user-mode (slirp) netdev with restrict=on (the guest
//                  reaches neither the host nor the network) on virtio-net-pci
//   virtio-serial  a virtio-serial-pci controller with no ports (the
//                  metadata channel's controller is another one)
Result<std::vector<std::string>> HandshakeDeviceArgs(const std::vector<std::string>& devices);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_BOOT_TRACE_H_
