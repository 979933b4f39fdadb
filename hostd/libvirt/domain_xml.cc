#include "domain_xml.h"

#include <boost/property_tree/ptree.hpp>
#include <boost/property_tree/xml_parser.hpp>
#include <cctype>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "hvtrace/meta_channel.h"
#include "units.h"
#include "vm_config.h"

namespace hvtrace::hostd {
namespace {

namespace pt = boost::property_tree;

constexpr size_t kMaxDomainXmlBytes = 16u << 20;

std::string Attr(const pt::ptree& node, const char* name) {
  return node.get<std::string>(std::string("<xmlattr>.") + name, "");
}

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

void AnalyzeHotplug(const pt::ptree& devices, DomainXmlInfo& info) {
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
  for (const auto& [tag, node] : devices) {
    if (tag == "controller" && Attr(node, "type") == "pci") {
      std::string model = Attr(node, "model");
      if (model == "pcie-root-port" || model == "pcie-switch-downstream-port" ||
          model == "pci-bridge") {
        long index = ParseIndex(Attr(node, "index"));
        if (index >= 0) ports[index] = model;
      }
    }
    if (auto addr = node.get_child_optional("address")) {
      if (Attr(*addr, "type") == "pci") {
        long bus = ParseIndex(Attr(*addr, "bus"));
        if (bus >= 0) ++used[bus];
      }
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

std::string XmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '\'':
        out += "&apos;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

namespace {

// "-trace" "enable=E" pairs of <qemu:commandline>. libvirt writes the
// namespace with the prefix "qemu"; a definition not yet through libvirt may
// use another, declared on <domain>.
std::vector<std::string> QemuCommandlineTraceEvents(const pt::ptree& dom) {
  std::string prefix = "qemu";
  if (auto attrs = dom.get_child_optional("<xmlattr>")) {
    for (const auto& [name, value] : *attrs) {
      if (name.rfind("xmlns:", 0) == 0 &&
          value.data() == "http://libvirt.org/schemas/domain/qemu/1.0") {
        prefix = name.substr(6);
      }
    }
  }
  std::vector<std::string> events;
  auto commandline = dom.get_child_optional(pt::ptree::path_type(prefix + ":commandline", '/'));
  if (!commandline) return events;
  bool after_trace = false;
  for (const auto& [tag, arg] : *commandline) {
    if (tag != prefix + ":arg") continue;
    const std::string value = Attr(arg, "value");
    if (after_trace && value.rfind("enable=", 0) == 0) events.push_back(value.substr(7));
    after_trace = value == "-trace";
  }
  return events;
}

}  // namespace

Result<DomainXmlInfo> ParseDomainXml(std::string_view xml) {
  if (xml.size() > kMaxDomainXmlBytes) {
    return Error{"domain XML of " + std::to_string(xml.size()) + " bytes is larger than the " +
                 std::to_string(kMaxDomainXmlBytes) + "-byte limit"};
  }
  pt::ptree tree;
  try {
    std::istringstream in{std::string(xml)};
    pt::read_xml(in, tree);
  } catch (const pt::ptree_error& e) {
    return Error{std::string("domain XML does not parse: ") + e.what()};
  }
  auto dom = tree.get_child_optional("domain");
  if (!dom) return Error{"domain XML has no <domain> element"};
  DomainXmlInfo info;
  try {
    info.type = Attr(*dom, "type");
    info.id = static_cast<int>(ParseIndex(Attr(*dom, "id")));
    info.name = Trim(dom->get<std::string>("name", ""));
    info.uuid = Trim(dom->get<std::string>("uuid", ""));
    if (info.name.empty()) return Error{"domain XML has no <name>"};
    const std::string ctx = "domain '" + info.name + "': ";
    if (auto os_type = dom->get_child_optional("os.type")) {
      info.machine = Attr(*os_type, "machine");
    }
    info.cmdline = Trim(dom->get<std::string>("os.cmdline", ""));
    info.kernel = Trim(dom->get<std::string>("os.kernel", ""));
    info.initrd = Trim(dom->get<std::string>("os.initrd", ""));
    info.q35 = info.machine.find("q35") != std::string::npos;
    info.acpi = static_cast<bool>(dom->get_child_optional("features.acpi"));
    info.on_crash = Trim(dom->get<std::string>("on_crash", ""));
    if (auto mem = dom->get_child_optional("memory")) {
      Result<uint64_t> bytes =
          ScaledBytes(mem->data(), Attr(*mem, "unit"), "KiB", ctx + "<memory>");
      if (!bytes.ok()) return bytes.error();
      info.memory_bytes = *bytes;
    }
    if (auto mb = dom->get_child_optional("memoryBacking.source")) {
      info.memory_backing_source = Attr(*mb, "type");
    }
    if (auto numa = dom->get_child_optional("cpu.numa")) {
      for (const auto& [tag, cell] : *numa) {
        if (tag != "cell") continue;
        DomainNumaCell c;
        c.id = static_cast<int>(ParseIndex(Attr(cell, "id")));
        Result<uint64_t> bytes =
            ScaledBytes(Attr(cell, "memory"), Attr(cell, "unit"), "KiB", ctx + "NUMA cell memory");
        if (!bytes.ok()) return bytes.error();
        c.memory_bytes = *bytes;
        c.mem_access = Attr(cell, "memAccess");
        info.numa_cells.push_back(c);
      }
    }
    static const pt::ptree kEmpty;
    const pt::ptree& devices = dom->get_child("devices", kEmpty);
    for (const auto& [tag, node] : devices) {
      if (tag == "panic") info.panic_models.push_back(Attr(node, "model"));
      if (tag == "channel" && Attr(node, "type") == "unix") {
        // The metadata channel: <target type='virtio' name='org.hvtrace.agent.0'/>
        // with the socket QEMU listens on (libvirt names it when the
        // definition gives no path: the live XML has it).
        auto target = node.get_child_optional("target");
        auto source = node.get_child_optional("source");
        if (target && Attr(*target, "type") == "virtio" &&
            Attr(*target, "name") == meta::kMetaPortName) {
          info.meta_channel = true;
          if (source && Attr(*source, "mode") == "bind") {
            info.meta_channel_path = Attr(*source, "path");
          }
        }
      }
      if (tag != "shmem") continue;
      DomainShmem s;
      s.name = Attr(node, "name");
      if (auto model = node.get_child_optional("model")) s.model = Attr(*model, "type");
      if (auto size = node.get_child_optional("size")) {
        // libvirt's default unit for <shmem><size> is bytes... it writes "M".
        Result<uint64_t> bytes = ScaledBytes(size->data(), Attr(*size, "unit"), "b",
                                             ctx + "shmem '" + s.name + "' size");
        if (!bytes.ok()) return bytes.error();
        s.size_bytes = *bytes;
      }
      if (auto alias = node.get_child_optional("alias")) s.alias = Attr(*alias, "name");
      info.shmems.push_back(s);
    }
    AnalyzeHotplug(devices, info);
    info.qemu_trace_events = QemuCommandlineTraceEvents(*dom);
  } catch (const pt::ptree_error& e) {
    return Error{"domain '" + info.name + "' XML: " + e.what()};
  }
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
  return "<shmem name='" + XmlEscape(name) + "'><model type='ivshmem-plain'/><size unit='M'>" +
         std::to_string(size_bytes / kMiB) + "</size><alias name='" + XmlEscape(alias) +
         "'/></shmem>";
}

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
  const std::string cpus = r.vcpus == 1 ? "0" : "0-" + std::to_string(r.vcpus - 1);
  out.numa_xml = "<cpu>\n    <numa>\n      <cell id='0' cpus='" + cpus + "' memory='" +
                 std::to_string(layout->node0_bytes / 1024) +
                 "' unit='KiB'/>\n      <cell id='1' memory='" +
                 std::to_string(layout->node1_bytes / 1024) +
                 "' unit='KiB' memAccess='shared'/>\n    </numa>\n  </cpu>";
  std::string cmdline =
      r.extra_cmdline.empty() ? out.kernel_params : r.extra_cmdline + " " + out.kernel_params;
  std::string serial;
  if (!r.console_socket.empty()) {
    serial = "    <serial type='unix'>\n      <source mode='bind' path='" +
             XmlEscape(r.console_socket) + "'/>\n" +
             (r.console_log.empty()
                  ? ""
                  : "      <log file='" + XmlEscape(r.console_log) + "' append='off'/>\n") +
             "      <target port='0'/>\n    </serial>\n";
  } else if (!r.console_log.empty()) {
    serial = "    <serial type='file'>\n      <source path='" + XmlEscape(r.console_log) +
             "'/>\n      <target port='0'/>\n    </serial>\n";
  } else {
    serial = "    <serial type='pty'>\n      <target port='0'/>\n    </serial>\n";
  }
  out.domain_xml = "<!-- hvtrace boot buffer: node 1 (" + KernelSize(layout->node1_bytes) +
                   ", file-backed, shared) starts at GPA " + where +
                   "; the kernel's persistent ring buffer '" + r.instance_name + "' (" +
                   KernelSize(layout->range_bytes) +
                   ") lives at its start. -->\n"
                   "<domain type='qemu'>\n"
                   "  <name>" +
                   XmlEscape(r.name) +
                   "</name>\n"
                   "  <memory unit='KiB'>" +
                   std::to_string((layout->node0_bytes + layout->node1_bytes) / 1024) +
                   "</memory>\n"
                   "  <vcpu>" +
                   std::to_string(r.vcpus) +
                   "</vcpu>\n"
                   "  <os>\n"
                   "    <type arch='x86_64' machine='pc'>hvm</type>\n"
                   "    <kernel>" +
                   XmlEscape(r.kernel) + "</kernel>\n" +
                   (r.initrd.empty() ? "" : "    <initrd>" + XmlEscape(r.initrd) + "</initrd>\n") +
                   "    <cmdline>" + XmlEscape(cmdline) +
                   "</cmdline>\n"
                   "  </os>\n"
                   "  <features><acpi/></features>\n"
                   "  " +
                   out.numa_xml +
                   "\n"
                   "  <on_poweroff>destroy</on_poweroff>\n"
                   "  <on_reboot>restart</on_reboot>\n"
                   "  <on_crash>" +
                   r.on_crash +
                   "</on_crash>\n"
                   "  <devices>\n" +
                   serial +
                   "    <panic model='isa'/>\n"
                   "    <memballoon model='none'/>\n"
                   "  </devices>\n"
                   "</domain>\n";
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
