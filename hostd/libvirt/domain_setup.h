// `hvtrace setup DOMAIN`: the edit of a libvirt domain's persistent
// definition that gives it what hvtrace needs, and its exact undo. No I/O:
// the XML in and out is libvirt's (virDomainGetXMLDesc with
// VIR_DOMAIN_XML_INACTIVE, virDomainDefineXML); libvirt_setup.h does the calls.
//
// The edit is done with libxml2 (the library libvirt itself parses with), so
// every element, attribute and comment hvtrace does not add stays as it was.
// It adds, when missing:
//   <cpu><numa>   cell 0 = the domain's memory and all its vCPUs, cell 1 =
//                 the shared, file-backed boot range cell sized as
//                 `hvtrace domain-xml --numa` sizes it (FindDomainBootCell
//                 finds the same layout); <memory>/<currentMemory> grow by
//                 cell 1
//   <channel>     unix, source mode='bind' (libvirt picks the path), target
//                 virtio org.hvtrace.agent.0 (meta::kMetaPortName)
//   <panic model='isa'/>   isa-pvpanic; libvirt 9.0 has no 'pvpanic' (PCI)
//                 model and isa-pvpanic works on q35 too (its LPC bridge)
//   <on_crash>preserve</on_crash>  when it is libvirt's default 'destroy'
//   a pcie-root-port on q35 when none is free (FinishDomainSetup)
//   <qemu:commandline>  "-trace enable=E" for QEMU's boot-handshake trace
//                 events (boot_trace.h), which QEMU then writes to the
//                 domain's libvirt log: the boot timeline's host side
//                 (docs/boot-timeline.md)
// and records what it added and every previous value it changed in
//   <metadata><hvtrace:setup xmlns:hvtrace='https://hvtrace.dev/setup/1'>
// so that RemoveDomainSetup removes exactly those and restores the values.
#ifndef HVTRACE_HOSTD_DOMAIN_SETUP_H_
#define HVTRACE_HOSTD_DOMAIN_SETUP_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpa_layout.h"
#include "hvtrace/result.h"

namespace hvtrace::hostd {

inline constexpr char kSetupNamespace[] = "https://hvtrace.dev/setup/1";

struct DomainSetupRequest {
  uint64_t range_bytes = 16 * kMiB;
  std::string instance = "boot_map";
  std::string events;  // After the commas of trace_instance=.
};

struct DomainSetupEdit {
  bool already_set_up = false;       // Nothing changed: |xml| is the input.
  bool changed = false;              // |xml| differs from the input.
  std::string xml;                   // The new definition.
  std::vector<std::string> changes;  // One line per piece added or value changed.
};

// Whether |xml| carries hvtrace's setup record.
bool HasDomainSetup(std::string_view xml);

// Adds what is missing (see above). A domain already set up comes back with
// |already_set_up|; one with a NUMA topology that is not hvtrace's is refused.
Result<DomainSetupEdit> AddDomainSetup(std::string_view xml, const DomainSetupRequest& request);

// After libvirt defined AddDomainSetup's XML and gave back |defined_xml|:
// records the controllers libvirt added for the new devices (they are not in
// |original_xml|), and on q35 adds a pcie-root-port when none is free. Call
// again on libvirt's next answer until |changed| is false.
Result<DomainSetupEdit> FinishDomainSetup(std::string_view original_xml,
                                          std::string_view defined_xml);

// Removes what the setup record lists and restores the previous values.
Result<DomainSetupEdit> RemoveDomainSetup(std::string_view xml);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_DOMAIN_SETUP_H_
