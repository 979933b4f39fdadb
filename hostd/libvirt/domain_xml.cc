#include "domain_xml.h"

#include <cctype>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "hvtrace/meta_channel.h"
#include "units.h"
#include "vm_config.h"
#include "xml_tree.h"

namespace hvtrace::hostd {
namespace {

std::string Trim(std::string s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  size_t e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// libvirt's scaled integers (virScaleInteger): unit names and their factors.
Result<uint64_t> ScaledBytes(const std::string& value, const std::string& unit_in,
                             const std::string& default_unit, const std::string& what) {
  static const std::map<std::string, uint64_t> kUnits = {{"b", 1},
                                                         {"bytes", 1},
                                                         {"k", 1ull << 10},
                                                         {"kib", 1ull << 10},
                                                         {"kb", 1000},
                                                         {"m", 1ull << 20},
                                                         {"mib", 1ull << 20},
                                                         {"mb", 1000000},
                                                         {"g", 1ull << 30},
                                                         {"gib", 1ull << 30},
                                                         {"gb", 1000000000ull},
                                                         {"t", 1ull << 40},
                                                         {"tib", 1ull << 40},
                                                         {"tb", 1000000000000ull}};
  std::string unit = unit_in.empty() ? default_unit : unit_in;
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  auto it = kUnits.find(unit);
  if (it == kUnits.end()) return Error{what + ": unknown unit '" + unit_in + "'"};
  std::string v = Trim(value);
  if (v.empty() || v.size() > 20 || v.find_first_not_of("0123456789") != std::string::npos) {
    return Error{what + ": '" + v + "' is not a number"};
  }
  uint64_t n = std::stoull(v);
  if (n > UINT64_MAX / it->second) return Error{what + ": " + v + " " + unit_in + " overflows"};
  return n * it->second;
}

// "0x0a" or "10" → 10; -1 when malformed.
long ParseIndex(const std::string& s) {
  if (s.empty() || s.size() > 10) return -1;
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 0);
  return end && *end == '\0' && v >= 0 ? v : -1;
}

void AnalyzeHotplug(xmlNode* devices, DomainXmlInfo& info) {
  if (!info.q35) {
    bool pc = info.machine.find("i440fx") != std::string::npos || info.machine == "pc" ||
              info.machine.rfind("pc-", 0) == 0;
    if (!pc) {
      info.hotplug_reason =
          "machine '" + info.machine +
          "': hvtrace knows PCI hot-plug only for the pc (i440fx) and q35 machines";
      return;
    }
    if (!info.acpi) {
      info.hotplug_reason = "machine '" + info.machine +
                            "' without <features><acpi/>: the pc machine hot-plugs PCI devices "
                            "through ACPI, so the guest would never see the device";
      return;
    }
    info.hotplug_ok = true;
    return;
  }
  // q35: pcie.0 takes no hot-plugged devices; a device needs an empty
  // pcie-root-port (or downstream port), or a pci-bridge with a free slot.
  std::map<long, std::string> ports;  // index → model
  std::map<long, int> used;           // bus → devices on it
  for (xmlNode* node = devices ? devices->children : nullptr; node != nullptr; node = node->next) {
    if (node->type != XML_ELEMENT_NODE) continue;
    if (xml::Named(node, "controller") && xml::Prop(node, "type") == "pci") {
      std::string model = xml::Prop(node, "model");
      if (model == "pcie-root-port" || model == "pcie-switch-downstream-port" ||
          model == "pci-bridge") {
        long index = ParseIndex(xml::Prop(node, "index"));
        if (index >= 0) ports[index] = model;
      }
    }
    xmlNode* addr = xml::Child(node, "address");
    if (addr != nullptr && xml::Prop(addr, "type") == "pci") {
      long bus = ParseIndex(xml::Prop(addr, "bus"));
      if (bus >= 0) ++used[bus];
    }
  }
  int root_ports = 0;
  for (const auto& [index, model] : ports) {
    int n = used.count(index) ? used[index] : 0;
    bool free = model == "pci-bridge" ? n < 31 : n == 0;
    if (model != "pci-bridge") ++root_ports;
    if (free) {
      info.hotplug_ok = true;
      return;
    }
  }
  info.hotplug_reason =
      "q35 machine '" + info.machine + "' has no free pcie-root-port (" +
      std::to_string(root_ports) +
      " root ports, all in use; pcie.0 is not hot-pluggable): add "
      "<controller type='pci' model='pcie-root-port'/> to the domain and restart it";
}

}  // namespace

namespace {

bool InQemuNamespace(const xmlNode* node, const char* name) {
  return node->type == XML_ELEMENT_NODE && node->ns != nullptr && node->ns->href != nullptr &&
         xmlStrEqual(node->ns->href, xml::X(kQemuNamespace)) &&
         xmlStrEqual(node->name, xml::X(name));
}

// "-trace" "enable=E" pairs of <qemu:commandline>, whatever prefix the
// definition binds libvirt's QEMU namespace to.
std::vector<std::string> QemuCommandlineTraceEvents(xmlNode* dom) {
  std::vector<std::string> events;
  for (xmlNode* c = dom->children; c != nullptr; c = c->next) {
    if (!InQemuNamespace(c, "commandline")) continue;
    bool after_trace = false;
    for (xmlNode* arg = c->children; arg != nullptr; arg = arg->next) {
      if (!InQemuNamespace(arg, "arg")) continue;
      const std::string value = xml::Prop(arg, "value");
      if (after_trace && value.rfind("enable=", 0) == 0) events.push_back(value.substr(7));
      after_trace = value == "-trace";
    }
  }
  return events;
}

// The metadata channel: <channel type='unix'> with <target type='virtio'
// name='org.hvtrace.agent.0'/> and the socket QEMU listens on (libvirt names
// it when the definition gives no path: the live XML has it).
void ReadMetaChannel(xmlNode* channel, DomainXmlInfo& info) {
  if (xml::Prop(channel, "type") != "unix") return;
  xmlNode* target = xml::Child(channel, "target");
  if (target == nullptr || xml::Prop(target, "type") != "virtio" ||
      xml::Prop(target, "name") != meta::kMetaPortName) {
    return;
  }
  info.meta_channel = true;
  xmlNode* source = xml::Child(channel, "source");
  if (source != nullptr && xml::Prop(source, "mode") == "bind") {
    info.meta_channel_path = xml::Prop(source, "path");
  }
}

Status ReadShmem(xmlNode* node, const std::string& ctx, DomainXmlInfo& info) {
  DomainShmem s;
  s.name = xml::Prop(node, "name");
  s.model = xml::Prop(xml::Child(node, "model"), "type");
  if (xmlNode* size = xml::Child(node, "size")) {
    // libvirt's default unit for <shmem><size> is bytes... it writes "M".
    Result<uint64_t> bytes = ScaledBytes(xml::Text(size), xml::Prop(size, "unit"), "b",
                                         ctx + "shmem '" + s.name + "' size");
    if (!bytes.ok()) return bytes.error();
    s.size_bytes = *bytes;
  }
  s.alias = xml::Prop(xml::Child(node, "alias"), "name");
  info.shmems.push_back(s);
  return {};
}

Status ReadMemory(xmlNode* dom, const std::string& ctx, DomainXmlInfo& info) {
  if (xmlNode* mem = xml::Child(dom, "memory")) {
    Result<uint64_t> bytes =
        ScaledBytes(xml::Text(mem), xml::Prop(mem, "unit"), "KiB", ctx + "<memory>");
    if (!bytes.ok()) return bytes.error();
    info.memory_bytes = *bytes;
  }
  info.memory_backing_source =
      xml::Prop(xml::Child(xml::Child(dom, "memoryBacking"), "source"), "type");
  for (xmlNode* cell : xml::Children(xml::Child(xml::Child(dom, "cpu"), "numa"), "cell")) {
    DomainNumaCell c;
    c.id = static_cast<int>(ParseIndex(xml::Prop(cell, "id")));
    Result<uint64_t> bytes = ScaledBytes(xml::Prop(cell, "memory"), xml::Prop(cell, "unit"), "KiB",
                                         ctx + "NUMA cell memory");
    if (!bytes.ok()) return bytes.error();
    c.memory_bytes = *bytes;
    c.mem_access = xml::Prop(cell, "memAccess");
    info.numa_cells.push_back(c);
  }
  return {};
}

}  // namespace

Result<DomainXmlInfo> ParseDomainXml(std::string_view text) {
  Result<xml::DocPtr> doc = xml::Parse(text, "domain");
  if (!doc.ok()) return doc.error();
  xmlNode* dom = xmlDocGetRootElement(doc->get());
  DomainXmlInfo info;
  info.type = xml::Prop(dom, "type");
  info.id = static_cast<int>(ParseIndex(xml::Prop(dom, "id")));
  info.name = xml::Text(xml::Child(dom, "name"));
  info.uuid = xml::Text(xml::Child(dom, "uuid"));
  if (info.name.empty()) return Error{"domain XML has no <name>"};
  const std::string ctx = "domain '" + info.name + "': ";
  xmlNode* os = xml::Child(dom, "os");
  info.machine = xml::Prop(xml::Child(os, "type"), "machine");
  info.cmdline = xml::Text(xml::Child(os, "cmdline"));
  info.kernel = xml::Text(xml::Child(os, "kernel"));
  info.initrd = xml::Text(xml::Child(os, "initrd"));
  info.q35 = info.machine.find("q35") != std::string::npos;
  info.acpi = xml::Child(xml::Child(dom, "features"), "acpi") != nullptr;
  info.on_crash = xml::Text(xml::Child(dom, "on_crash"));
  if (Status s = ReadMemory(dom, ctx, info); !s.ok()) return s.error();
  xmlNode* devices = xml::Child(dom, "devices");
  for (xmlNode* node = devices ? devices->children : nullptr; node != nullptr; node = node->next) {
    if (xml::Named(node, "panic")) info.panic_models.push_back(xml::Prop(node, "model"));
    if (xml::Named(node, "channel")) ReadMetaChannel(node, info);
    if (!xml::Named(node, "shmem")) continue;
    if (Status s = ReadShmem(node, ctx, info); !s.ok()) return s.error();
  }
  AnalyzeHotplug(devices, info);
  info.qemu_trace_events = QemuCommandlineTraceEvents(dom);
  return info;
}

Status ValidateShmName(std::string_view name) {
  if (name.empty() || name.size() > 64) {
    return Error{"shm name '" + std::string(name) + "' must be 1..64 characters"};
  }
  if (name[0] == '.') return Error{"shm name '" + std::string(name) + "' must not start with '.'"};
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) {
      return Error{"shm name '" + std::string(name) + "' may only hold [A-Za-z0-9_.-]"};
    }
  }
  return {};
}

Result<std::string> ShmemDeviceXml(std::string_view name, uint64_t size_bytes,
                                   std::string_view alias) {
  if (Status s = ValidateShmName(name); !s.ok()) return s.error();
  if (size_bytes < kMiB || (size_bytes & (size_bytes - 1)) != 0) {
    return Error{"shmem '" + std::string(name) + "': size " + std::to_string(size_bytes) +
                 " bytes is not a power of two of at least 1 MiB (QEMU aborts on such a BAR)"};
  }
  if (alias.rfind("ua-", 0) != 0 || alias.size() > 64) {
    return Error{"shmem alias '" + std::string(alias) +
                 "' must start with 'ua-' (libvirt user alias)"};
  }
  for (char c : alias) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) {
      return Error{"shmem alias '" + std::string(alias) + "' may only hold [A-Za-z0-9_-]"};
    }
  }
  xml::DocPtr doc(xmlNewDoc(xml::X("1.0")));
  xmlNode* shmem = xml::NewElement(doc.get(), "shmem", {{"name", std::string(name)}});
  xmlDocSetRootElement(doc.get(), shmem);
  xml::AddChild(shmem, "model", {{"type", "ivshmem-plain"}});
  xml::AddChild(shmem, "size", {{"unit", "M"}}, std::to_string(size_bytes / kMiB));
  xml::AddChild(shmem, "alias", {{"name", std::string(alias)}});
  return xml::DumpElement(doc.get(), shmem);
}

namespace {

// <cpu><numa>: cell 0 the guest's RAM with its vCPUs, cell 1 shared and
// file-backed (the boot range at its start).
xmlNode* AddNumaCells(xmlNode* parent, const BootRangeLayout& layout, int vcpus) {
  xmlNode* numa = xml::AddChild(xml::AddChild(parent, "cpu"), "numa");
  const std::string cpus = vcpus == 1 ? "0" : "0-" + std::to_string(vcpus - 1);
  xml::AddChild(numa, "cell",
                {{"id", "0"},
                 {"cpus", cpus},
                 {"memory", std::to_string(layout.node0_bytes / 1024)},
                 {"unit", "KiB"}});
  xml::AddChild(numa, "cell",
                {{"id", "1"},
                 {"memory", std::to_string(layout.node1_bytes / 1024)},
                 {"unit", "KiB"},
                 {"memAccess", "shared"}});
  return numa->parent;
}

// The serial console: a socket (and a log) when asked for, else a file or a pty.
void AddSerial(xmlNode* devices, const BootBufferDomainRequest& r) {
  if (!r.console_socket.empty()) {
    xmlNode* serial = xml::AddChild(devices, "serial", {{"type", "unix"}});
    xml::AddChild(serial, "source", {{"mode", "bind"}, {"path", r.console_socket}});
    if (!r.console_log.empty()) {
      xml::AddChild(serial, "log", {{"file", r.console_log}, {"append", "off"}});
    }
    xml::AddChild(serial, "target", {{"port", "0"}});
  } else if (!r.console_log.empty()) {
    xmlNode* serial = xml::AddChild(devices, "serial", {{"type", "file"}});
    xml::AddChild(serial, "source", {{"path", r.console_log}});
    xml::AddChild(serial, "target", {{"port", "0"}});
  } else {
    xml::AddChild(xml::AddChild(devices, "serial", {{"type", "pty"}}), "target", {{"port", "0"}});
  }
}

}  // namespace

Result<BootBufferDomainXml> MakeBootBufferDomainXml(const BootBufferDomainRequest& r) {
  const std::string ctx = "domain '" + r.name + "': ";
  if (Status s = ValidateShmName(r.name); !s.ok()) {
    return Error{ctx + "name must be a plain name: " + s.error().message};
  }
  if (r.vcpus < 1 || r.vcpus > 255) return Error{ctx + "vcpus must be 1..255"};
  if (r.kernel.empty()) return Error{ctx + "a kernel path is needed (direct kernel boot)"};
  if (r.instance_name.empty() || ValidateShmName(r.instance_name).ok() == false) {
    return Error{ctx + "instance name '" + r.instance_name + "' must be [A-Za-z0-9_.-]"};
  }
  for (char c : r.events) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) ||
          std::string_view(":,_*^-").find(c) != std::string_view::npos)) {
      return Error{ctx + "events '" + r.events + "' may only hold names, ':', ',', '*', '^'"};
    }
  }
  if (r.on_crash != "preserve" && r.on_crash != "destroy" && r.on_crash != "restart" &&
      r.on_crash != "coredump-destroy" && r.on_crash != "coredump-restart" &&
      r.on_crash != "rename-restart") {
    return Error{ctx + "on_crash '" + r.on_crash + "' is not a libvirt action"};
  }
  BootRangeRequest req;
  req.machine = MachineType::kPc;
  req.memory_bytes = r.memory_bytes;
  req.range_bytes = r.range_bytes;
  Result<BootRangeLayout> layout = ComputeBootRangeLayout(req);
  if (!layout.ok()) return Error{ctx + layout.error().message};
  if (layout->range_bytes / static_cast<uint64_t>(r.vcpus) < 16 * kGuestPageSize) {
    return Error{ctx + "boot range of " + KernelSize(r.range_bytes) + " is too small for " +
                 std::to_string(r.vcpus) + " vCPUs"};
  }

  BootBufferDomainXml out;
  out.layout = *layout;
  char where[32];
  std::snprintf(where, sizeof where, "0x%llx", static_cast<unsigned long long>(layout->range_gpa));
  out.kernel_params = BootRangeKernelParams(*layout, r.instance_name, r.events);
  const std::string cmdline =
      r.extra_cmdline.empty() ? out.kernel_params : r.extra_cmdline + " " + out.kernel_params;
  xml::DocPtr doc(xmlNewDoc(xml::X("1.0")));
  const std::string note = " hvtrace boot buffer: node 1 (" + KernelSize(layout->node1_bytes) +
                           ", file-backed, shared) starts at GPA " + where +
                           "; the kernel's persistent ring buffer '" + r.instance_name + "' (" +
                           KernelSize(layout->range_bytes) + ") lives at its start. ";
  xmlAddChild(reinterpret_cast<xmlNode*>(doc.get()),
              xmlNewDocComment(doc.get(), xml::X(note.c_str())));
  xmlNode* dom = xml::NewElement(doc.get(), "domain", {{"type", "qemu"}});
  xmlAddChild(reinterpret_cast<xmlNode*>(doc.get()), dom);
  xml::AddChild(dom, "name", {}, r.name);
  xml::AddChild(dom, "memory", {{"unit", "KiB"}},
                std::to_string((layout->node0_bytes + layout->node1_bytes) / 1024));
  xml::AddChild(dom, "vcpu", {}, std::to_string(r.vcpus));
  xmlNode* os = xml::AddChild(dom, "os");
  xml::AddChild(os, "type", {{"arch", "x86_64"}, {"machine", "pc"}}, "hvm");
  xml::AddChild(os, "kernel", {}, r.kernel);
  if (!r.initrd.empty()) xml::AddChild(os, "initrd", {}, r.initrd);
  xml::AddChild(os, "cmdline", {}, cmdline);
  xml::AddChild(xml::AddChild(dom, "features"), "acpi");
  xmlNode* cpu = AddNumaCells(dom, *layout, r.vcpus);
  xml::AddChild(dom, "on_poweroff", {}, "destroy");
  xml::AddChild(dom, "on_reboot", {}, "restart");
  xml::AddChild(dom, "on_crash", {}, r.on_crash);
  xmlNode* devices = xml::AddChild(dom, "devices");
  AddSerial(devices, r);
  xml::AddChild(devices, "panic", {{"model", "isa"}});
  xml::AddChild(devices, "memballoon", {{"model", "none"}});
  out.numa_xml = xml::DumpElement(doc.get(), cpu, /*indent=*/true);
  out.domain_xml = xml::Dump(doc.get());
  return out;
}

std::string BootRangeKernelParams(const BootRangeLayout& layout, std::string_view instance,
                                  std::string_view events) {
  char where[32];
  std::snprintf(where, sizeof where, "0x%llx", static_cast<unsigned long long>(layout.range_gpa));
  const std::string size = KernelSize(layout.range_bytes);
  return "memmap=" + size + "$" + where + " trace_instance=" + std::string(instance) + "@" + where +
         ":" + size + (events.empty() ? "" : "," + std::string(events));
}

namespace {

// The memmap=SIZE$ADDR words of a kernel command line, as (size, addr); a
// word that does not parse is returned as an error naming it.
Result<std::vector<std::pair<uint64_t, uint64_t>>> MemmapWords(const std::string& cmdline) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  std::istringstream words(cmdline);
  std::string word;
  while (words >> word) {
    if (word.rfind("memmap=", 0) != 0) continue;
    const size_t dollar = word.find('$');
    if (dollar == std::string::npos) continue;
    Result<uint64_t> size = ParseKernelSize(word.substr(7, dollar - 7));
    Result<uint64_t> addr = ParseKernelSize(word.substr(dollar + 1));
    if (!size.ok() || !addr.ok()) return Error{"cannot parse '" + word + "'"};
    out.emplace_back(*size, *addr);
  }
  return out;
}

}  // namespace

Result<DomainBootCell> FindDomainBootCell(const DomainXmlInfo& info, std::string_view instance,
                                          std::string_view events) {
  const std::string ctx = "domain '" + info.name + "' boot range: ";
  const std::vector<DomainNumaCell>& cells = info.numa_cells;
  if (cells.size() != 2 || cells[0].id != 0 || cells[1].id != 1 ||
      cells[1].mem_access != "shared") {
    return Error{
        ctx + "expected the NUMA cells of `hvtrace domain-xml --numa` (cell 0, and cell 1 " +
        "with memAccess='shared'); the domain has " + std::to_string(cells.size()) + " cell(s)"};
  }
  if (cells[0].mem_access == "shared") {
    return Error{ctx + "cell 0 is shared too; only cell 1 may be (its file is the range)"};
  }
  const uint64_t node0 = cells[0].memory_bytes, node1 = cells[1].memory_bytes;
  if (node1 <= kBootRangeHeadroom || node0 > UINT64_MAX - node1) {
    return Error{ctx + "cell 1 of " + std::to_string(node1) +
                 " bytes cannot hold a range and the " + std::to_string(kBootRangeHeadroom >> 20) +
                 " MiB headroom after it"};
  }
  // libvirt keeps <memory> equal to the cells' sum; a definition that says
  // otherwise is not one QEMU would lay out as the cells say.
  if (info.memory_bytes != 0 && info.memory_bytes != node0 + node1) {
    return Error{ctx + "<memory> (" + std::to_string(info.memory_bytes) +
                 " bytes) is not the sum of the NUMA cells (" + std::to_string(node0 + node1) +
                 " bytes)"};
  }
  BootRangeRequest request;
  request.machine = info.q35 ? MachineType::kQ35 : MachineType::kPc;
  request.memory_bytes = node0 + node1;
  request.range_bytes = (node1 - kBootRangeHeadroom) / kGuestPageSize * kGuestPageSize;
  request.node0_bytes = node0;
  Result<BootRangeLayout> layout = ComputeBootRangeLayout(request);
  if (!layout.ok()) return Error{ctx + layout.error().message};
  DomainBootCell cell;
  cell.layout = *layout;
  cell.kernel_params = BootRangeKernelParams(*layout, instance, events);
  Result<std::vector<std::pair<uint64_t, uint64_t>>> memmaps = MemmapWords(info.cmdline);
  if (!memmaps.ok()) {
    cell.cmdline_note =
        "<cmdline>: " + memmaps.error().message + "; the range is taken from the NUMA cell";
    return cell;
  }
  for (const auto& [size, addr] : *memmaps) {
    if (size == layout->range_bytes && addr == layout->range_gpa) continue;
    char text[96];
    std::snprintf(text, sizeof text, "memmap=%s$0x%llx", KernelSize(size).c_str(),
                  static_cast<unsigned long long>(addr));
    cell.cmdline_note = std::string("<cmdline> has ") + text +
                        ", which is not the range the NUMA cell places; the cell is used";
  }
  return cell;
}

}  // namespace hvtrace::hostd
