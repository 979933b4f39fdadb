// libvirt domain XML: what hvtrace reads from a domain, and what it writes
// for one. No I/O; the XML comes from libvirtd (virDomainGetXMLDesc) or a
// file, and is parsed with size and shape checks, never trusted to be
// well-formed.
//
// Boot buffer for libvirt domains (DESIGN §4.2), as libvirt 9.0 does it
// natively, verified with `virsh domxml-to-native` and a running domain:
//   <cpu><numa>
//     <cell id='0' cpus='0-N' memory='NODE0' unit='KiB'/>
//     <cell id='1' memory='NODE1' unit='KiB' memAccess='shared'/>
//   </numa></cpu>
// gives node 0 `memory-backend-ram` and node 1
//   memory-backend-file,mem-path=<memory_backing_dir>/libvirt/qemu/<id>-<name>/ram-node1,share=on
// (memory_backing_dir is a qemu.conf setting, default /var/lib/libvirt/qemu/ram;
// put it on tmpfs). No <memoryBacking> element and no <qemu:commandline>
// passthrough are needed: <memoryBacking><source type='file'/> would put node
// 0 in a file too. libvirt chooses the file name (it includes the domain's
// run id) and deletes the directory when the domain stops, so hostd finds
// the file from QEMU's command line and keeps it open (libvirt_backend.h).
// The kernel parameters (memmap=, trace_instance=) go in <os><cmdline>, or,
// for a domain that boots from its own disk, in the guest's boot loader:
// hostd then finds the range from the cells alone (FindDomainBootCell).
#ifndef HVTRACE_HOSTD_DOMAIN_XML_H_
#define HVTRACE_HOSTD_DOMAIN_XML_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpa_layout.h"
#include "hvtrace/result.h"

namespace hvtrace::hostd {

// The XML namespace of libvirt's <qemu:commandline> (and <qemu:arg>).
inline constexpr char kQemuNamespace[] = "http://libvirt.org/schemas/domain/qemu/1.0";

struct DomainShmem {
  std::string name;
  std::string model;  // ivshmem-plain, ivshmem-doorbell, ivshmem.
  uint64_t size_bytes = 0;
  std::string alias;  // Empty for an inactive definition.
};

struct DomainNumaCell {
  int id = 0;
  uint64_t memory_bytes = 0;
  std::string mem_access;  // "", "shared", "private".
};

struct DomainXmlInfo {
  std::string name;
  std::string uuid;
  std::string type;     // qemu (TCG), kvm.
  std::string machine;  // pc-i440fx-7.2, pc-q35-7.2, pc, q35 ...
  int id = -1;          // Run id; -1 when not running.
  bool acpi = false;
  bool q35 = false;
  uint64_t memory_bytes = 0;
  std::string on_crash;
  std::vector<std::string> panic_models;
  std::vector<DomainShmem> shmems;
  std::vector<DomainNumaCell> numa_cells;
  std::string memory_backing_source;  // "", file, anonymous, memfd.
  std::string cmdline;                // <os><cmdline>.
  std::string kernel;                 // <os><kernel>: names the formats to decode with.
  std::string initrd;                 // <os><initrd>: with the kernel, what a harvest boots.
  // A <channel type='unix'> whose virtio target is hvtrace's metadata port
  // (hvtrace/meta_channel.h), and its socket (QEMU listens: source
  // mode='bind'); the path is empty in a definition that leaves it to libvirt.
  bool meta_channel = false;
  std::string meta_channel_path;
  // QEMU trace events the definition enables on QEMU's command line
  // (<qemu:commandline> "-trace" "enable=E" pairs; `hvtrace setup` adds the
  // boot-handshake ones, boot_trace.h), in order.
  std::vector<std::string> qemu_trace_events;

  // Whether a PCI device can be hot-plugged, and if not, why.
  bool hotplug_ok = false;
  std::string hotplug_reason;
};

// Parses a domain's XML. Errors say what is malformed.
Result<DomainXmlInfo> ParseDomainXml(std::string_view xml);

// A shm name libvirt and QEMU accept and that stays inside /dev/shm:
// 1..64 characters from [A-Za-z0-9_.-], not starting with '.'.
Status ValidateShmName(std::string_view name);

// The <shmem> element hvtrace hot-plugs. |size_bytes| must be a power of two
// of at least 1 MiB (QEMU aborts on other BAR sizes); |alias| must start with
// "ua-" (libvirt's rule for user aliases).
Result<std::string> ShmemDeviceXml(std::string_view name, uint64_t size_bytes,
                                   std::string_view alias);

struct BootBufferDomainRequest {
  std::string name;
  std::string kernel;
  std::string initrd;
  std::string extra_cmdline = "console=ttyS0";
  uint64_t memory_bytes = 1088 * kMiB;
  uint64_t range_bytes = 16 * kMiB;
  int vcpus = 2;
  std::string instance_name = "boot_map";
  std::string events;  // After the commas of trace_instance=, e.g. "sched:sched_switch,irq".
  std::string on_crash = "preserve";
  std::string console_socket;  // Serial console as a unix socket (optional).
  std::string console_log;     // Serial log file (optional).
};

struct BootBufferDomainXml {
  BootRangeLayout layout;
  std::string kernel_params;  // memmap=... trace_instance=...
  std::string numa_xml;       // The <cpu><numa> element, for editing another domain.
  std::string domain_xml;     // A whole TCG domain (type='qemu', pc machine, pvpanic).
};

// Lays out the range with gpa_layout.h and writes the XML.
Result<BootBufferDomainXml> MakeBootBufferDomainXml(const BootBufferDomainRequest& request);

// "memmap=SIZE$ADDR trace_instance=NAME@ADDR:SIZE[,EVENTS]" for |layout|.
std::string BootRangeKernelParams(const BootRangeLayout& layout, std::string_view instance,
                                  std::string_view events);

// The boot range a domain's NUMA cells place, as `hvtrace domain-xml --numa`
// writes them: exactly cells 0 and 1, cell 1 memAccess='shared' (its file is
// the range's host side). The range starts at node 1 (its GPA is node 0's
// size, checked against the machine's low-memory limit by gpa_layout.h) and
// is node 1 less kBootRangeHeadroom: the inverse of domain-xml's sizing, so
// the same layout comes back. <os><cmdline> is never used for the range; a
// memmap= there that disagrees is only reported in |cmdline_note|.
struct DomainBootCell {
  BootRangeLayout layout;
  std::string kernel_params;  // What the guest's kernel command line needs.
  std::string cmdline_note;   // Non-empty when <cmdline> names another range.
};
Result<DomainBootCell> FindDomainBootCell(const DomainXmlInfo& info, std::string_view instance,
                                          std::string_view events);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_DOMAIN_XML_H_
