#include "domain_setup.h"

#include <libxml/tree.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <utility>

#include "boot_trace.h"
#include "domain_xml.h"
#include "hvtrace/meta_channel.h"
#include "vm_config.h"
#include "xml_tree.h"

namespace hvtrace::hostd {
namespace {

using xml::Child;
using xml::DocPtr;
using xml::Dump;
using xml::Named;
using xml::NewElement;
using xml::Prop;
using xml::SetProp;
using xml::Text;
using xml::X;

Result<DocPtr> ParseDoc(std::string_view text) { return xml::Parse(text, "domain"); }

int Depth(const xmlNode* node) {
  int depth = 0;
  for (const xmlNode* p = node->parent; p != nullptr && p->type == XML_ELEMENT_NODE; p = p->parent)
    ++depth;
  return depth;
}

// Indents a new subtree: libxml2 formats nothing below an element with text
// children, and libvirt's XML has whitespace text everywhere.
void IndentChildren(xmlNode* node, int depth) {
  bool any = false;
  for (xmlNode* c = node->children; c != nullptr; c = c->next) {
    if (c->type == XML_ELEMENT_NODE) any = true;
    if (c->type == XML_TEXT_NODE) return;  // Text content: leave it.
  }
  if (!any) return;
  const std::string inner = "\n" + std::string(2 * (depth + 1), ' ');
  for (xmlNode* c = node->children; c != nullptr; c = c->next) {
    IndentChildren(c, depth + 1);
    xmlAddPrevSibling(c, xmlNewDocText(node->doc, X(inner.c_str())));
  }
  xmlAddChild(node, xmlNewDocText(node->doc, X(("\n" + std::string(2 * depth, ' ')).c_str())));
}

// Inserts |node| into |parent| before |before| (or last), indented like its
// siblings so the diff a user reads shows only the new lines.
void Insert(xmlNode* parent, xmlNode* node, xmlNode* before = nullptr) {
  IndentChildren(node, Depth(parent) + 1);
  const std::string indent = "\n" + std::string(2 * (Depth(parent) + 1), ' ');
  xmlDoc* doc = parent->doc;
  // xmlAddPrevSibling merges a text node into a text neighbour, so the
  // indentation always goes in next to an element: |node| first.
  if (before == nullptr && parent->last != nullptr && parent->last->type == XML_TEXT_NODE) {
    xmlAddPrevSibling(parent->last, node);
    xmlAddPrevSibling(node, xmlNewDocText(doc, X(indent.c_str())));
  } else if (before != nullptr) {
    xmlAddPrevSibling(before, node);
    xmlAddPrevSibling(before, xmlNewDocText(doc, X(indent.c_str())));
  } else {
    const std::string close = "\n" + std::string(2 * Depth(parent), ' ');
    xmlAddChild(parent, xmlNewDocText(doc, X(indent.c_str())));
    xmlAddChild(parent, node);
    xmlAddChild(parent, xmlNewDocText(doc, X(close.c_str())));
  }
}

// Unlinks |node| and the indentation before it.
void Remove(xmlNode* node) {
  xmlNode* prev = node->prev;
  if (prev != nullptr && prev->type == XML_TEXT_NODE && xmlIsBlankNode(prev)) {
    xmlUnlinkNode(prev);
    xmlFreeNode(prev);
  }
  xmlUnlinkNode(node);
  xmlFreeNode(node);
}

xmlNode* FindSetup(xmlNode* root) {
  for (xmlNode* c = Child(root, "metadata") ? Child(root, "metadata")->children : nullptr;
       c != nullptr; c = c->next) {
    if (c->type == XML_ELEMENT_NODE && c->ns != nullptr && c->ns->href != nullptr &&
        xmlStrEqual(c->ns->href, X(kSetupNamespace)) && xmlStrEqual(c->name, X("setup"))) {
      return c;
    }
  }
  return nullptr;
}

// The setup record: one <hvtrace:added>/<hvtrace:changed> per piece.
class SetupRecord {
 public:
  explicit SetupRecord(xmlNode* setup) : setup_(setup) {}
  void Added(std::initializer_list<std::pair<const char*, std::string>> props) {
    Entry("added", props);
  }
  // |node| is the element before the change (null: it was absent).
  void Changed(const char* element, const xmlNode* node) {
    if (node == nullptr) {
      Entry("changed", {{"element", element}, {"present", "no"}});
    } else {
      xmlNode* e =
          Entry("changed", {{"element", element}, {"present", "yes"}, {"value", Text(node)}});
      if (!Prop(node, "unit").empty()) SetProp(e, "unit", Prop(node, "unit"));
    }
  }

 private:
  xmlNode* Entry(const char* kind,
                 std::initializer_list<std::pair<const char*, std::string>> props) {
    xmlNode* e = xmlNewDocNode(setup_->doc, setup_->ns, X(kind), nullptr);
    for (const auto& [k, v] : props) SetProp(e, k, v);
    Insert(setup_, e);
    return e;
  }
  xmlNode* setup_;
};

// The <metadata><hvtrace:setup> element, made (and <metadata> too, recorded)
// for a domain that has none.
xmlNode* MakeSetup(xmlNode* root) {
  xmlDoc* doc = root->doc;
  xmlNode* metadata = Child(root, "metadata");
  const bool new_metadata = metadata == nullptr;
  if (new_metadata) {
    metadata = NewElement(doc, "metadata");
    xmlNode* after = Child(root, "description") ? Child(root, "description") : Child(root, "uuid");
    if (after == nullptr) after = Child(root, "name");
    Insert(root, metadata, after != nullptr ? xmlNextElementSibling(after) : nullptr);
  }
  xmlNode* setup = xmlNewDocNode(doc, nullptr, X("setup"), nullptr);
  xmlSetNs(setup, xmlNewNs(setup, X(kSetupNamespace), X("hvtrace")));
  Insert(metadata, setup);
  if (new_metadata) SetupRecord(setup).Added({{"element", "metadata"}});
  return setup;
}

std::string Mib(uint64_t bytes) { return std::to_string(bytes / kMiB) + " MiB"; }

std::string Hex(uint64_t v) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(v));
  return text;
}

// Where new top-level elements go: before <devices>, as libvirt orders them.
xmlNode* BeforeDevices(xmlNode* root) { return Child(root, "devices"); }

Status AddNuma(xmlNode* root, const DomainXmlInfo& info, const DomainSetupRequest& request,
               SetupRecord& record, std::vector<std::string>& changes) {
  const std::string ctx = "domain '" + info.name + "': ";
  xmlDoc* doc = root->doc;
  unsigned long vcpus = 1;
  if (xmlNode* v = Child(root, "vcpu")) vcpus = std::strtoul(Text(v).c_str(), nullptr, 10);
  if (vcpus < 1 || vcpus > 4096) return Error{ctx + "<vcpu> is not a count of 1..4096"};
  const uint64_t memory = info.memory_bytes;
  if (memory == 0 || memory % kNodeAlignment != 0) {
    return Error{ctx + "<memory> of " + std::to_string(memory) +
                 " bytes is not a multiple of 2 MiB, which NUMA cell 0 needs"};
  }
  // Cell 1 as `hvtrace domain-xml --numa` sizes it, so FindDomainBootCell,
  // which inverts that sizing, finds this very range.
  const uint64_t node1 = (request.range_bytes + kBootRangeHeadroom + kNodeAlignment - 1) /
                         kNodeAlignment * kNodeAlignment;
  BootRangeRequest req;
  req.machine = info.q35 ? MachineType::kQ35 : MachineType::kPc;
  req.memory_bytes = memory + node1;
  req.range_bytes = request.range_bytes;
  req.node0_bytes = memory;
  Result<BootRangeLayout> layout = ComputeBootRangeLayout(req);
  if (!layout.ok()) return Error{ctx + layout.error().message};
  if (layout->range_bytes / vcpus < 16 * kGuestPageSize) {
    return Error{ctx + "a boot range of " + KernelSize(layout->range_bytes) + " is too small for " +
                 std::to_string(vcpus) + " vCPUs (--range)"};
  }
  xmlNode* cpu = Child(root, "cpu");
  if (cpu == nullptr) {
    cpu = NewElement(doc, "cpu");
    Insert(root, cpu, BeforeDevices(root));
    record.Added({{"element", "cpu"}});
  }
  xmlNode* numa = NewElement(doc, "numa");
  const std::string cpus = vcpus == 1 ? "0" : "0-" + std::to_string(vcpus - 1);
  xmlAddChild(numa, NewElement(doc, "cell",
                               {{"id", "0"},
                                {"cpus", cpus},
                                {"memory", std::to_string(layout->node0_bytes / 1024)},
                                {"unit", "KiB"}}));
  xmlAddChild(numa, NewElement(doc, "cell",
                               {{"id", "1"},
                                {"memory", std::to_string(layout->node1_bytes / 1024)},
                                {"unit", "KiB"},
                                {"memAccess", "shared"}}));
  Insert(cpu, numa);
  record.Added({{"element", "numa"}});
  changes.push_back("add <cpu><numa>: cell 0 = the domain's " + Mib(layout->node0_bytes) +
                    " with vCPUs " + cpus + "; cell 1 = " + Mib(layout->node1_bytes) +
                    ", shared and file-backed: the boot range (" + KernelSize(layout->range_bytes) +
                    " at GPA " + Hex(layout->range_gpa) + ") and " + Mib(kBootRangeHeadroom) +
                    " headroom");
  const std::string total = std::to_string((layout->node0_bytes + layout->node1_bytes) / 1024);
  for (const char* name : {"memory", "currentMemory"}) {
    xmlNode* m = Child(root, name);
    if (m == nullptr) continue;
    record.Changed(name, m);
    changes.push_back("change <" + std::string(name) + "> from " + Text(m) + " " +
                      (Prop(m, "unit").empty() ? "KiB" : Prop(m, "unit")) + " to " + total +
                      " KiB (the cells' sum)");
    xmlNodeSetContent(m, X(total.c_str()));
    SetProp(m, "unit", "KiB");
  }
  return {};
}

void AddDevices(xmlNode* root, const DomainXmlInfo& info, SetupRecord& record,
                std::vector<std::string>& changes) {
  xmlDoc* doc = root->doc;
  xmlNode* devices = Child(root, "devices");
  if (devices == nullptr) {
    devices = NewElement(doc, "devices");
    Insert(root, devices);
  }
  bool have_channel = false;
  for (xmlNode* c = devices->children; c != nullptr; c = c->next) {
    if (Named(c, "channel") && Prop(Child(c, "target"), "name") == meta::kMetaPortName) {
      have_channel = true;
    }
  }
  if (have_channel) {
    changes.push_back(std::string("keep the channel ") + meta::kMetaPortName + " already there");
  } else {
    xmlNode* channel = NewElement(doc, "channel", {{"type", "unix"}});
    xmlAddChild(channel, NewElement(doc, "source", {{"mode", "bind"}}));
    xmlAddChild(channel,
                NewElement(doc, "target", {{"type", "virtio"}, {"name", meta::kMetaPortName}}));
    Insert(devices, channel);
    record.Added({{"element", "channel"}, {"name", meta::kMetaPortName}});
    changes.push_back(std::string("add the virtio-serial channel ") + meta::kMetaPortName +
                      " (the agent's metadata; libvirt picks the socket path)");
  }
  if (info.panic_models.empty()) {
    Insert(devices, NewElement(doc, "panic", {{"model", "isa"}}));
    record.Added({{"element", "panic"}, {"model", "isa"}});
    changes.push_back("add <panic model='isa'/> (pvpanic: the guest's panic reaches hvtraced)");
  }
  if (info.q35 && !info.hotplug_ok) {
    // Recorded by FinishDomainSetup once libvirt gave it an index.
    Insert(devices, NewElement(doc, "controller", {{"type", "pci"}, {"model", "pcie-root-port"}}));
    changes.push_back("add a pcie-root-port (q35 hot-plugs only into a free one: hvtrace attach)");
  }
}

// <features><vmcoreinfo state='on'/>: QEMU's vmcoreinfo device, so a
// dump of the domain (vmcore = on-panic) carries the guest's VMCOREINFO.
void AddVmcoreinfo(xmlNode* root, SetupRecord& record, std::vector<std::string>& changes) {
  xmlNode* features = Child(root, "features");
  if (features != nullptr && Child(features, "vmcoreinfo") != nullptr) return;
  if (features == nullptr) {
    features = NewElement(root->doc, "features");
    Insert(root, features, BeforeDevices(root));
  }
  Insert(features, NewElement(root->doc, "vmcoreinfo", {{"state", "on"}}));
  record.Added({{"element", "vmcoreinfo"}});
  changes.push_back(
      "add <vmcoreinfo state='on'/> to <features> (a vmcore of the guest carries VMCOREINFO)");
}

void SetOnCrash(xmlNode* root, SetupRecord& record, std::vector<std::string>& changes) {
  xmlNode* on_crash = Child(root, "on_crash");
  const std::string value = on_crash != nullptr ? Text(on_crash) : std::string();
  if (on_crash != nullptr && value != "destroy") {
    if (value != "preserve") {
      changes.push_back("keep <on_crash>" + value +
                        "</on_crash> (set by you; 'preserve' keeps a crashed guest for "
                        "inspection)");
    }
    return;
  }
  // 'destroy' is libvirt's default, written even when the user never chose it.
  record.Changed("on_crash", on_crash);
  if (on_crash == nullptr) {
    Insert(root, NewElement(root->doc, "on_crash", {}, "preserve"), BeforeDevices(root));
  } else {
    xmlNodeSetContent(on_crash, X("preserve"));
  }
  changes.push_back("set <on_crash> from " + (value.empty() ? std::string("unset") : value) +
                    " (libvirt's default) to preserve: a panicked guest stays for its capture");
}

// The domain's <qemu:commandline> (any prefix), or null.
xmlNode* QemuCommandline(xmlNode* root) {
  for (xmlNode* c = root->children; c != nullptr; c = c->next) {
    if (c->type == XML_ELEMENT_NODE && c->ns != nullptr && c->ns->href != nullptr &&
        xmlStrEqual(c->ns->href, X(kQemuNamespace)) && xmlStrEqual(c->name, X("commandline"))) {
      return c;
    }
  }
  return nullptr;
}

// The "-trace" "enable=E" pair of <qemu:arg>s for |event| in |commandline|:
// its first element, or null.
xmlNode* TraceArgPair(xmlNode* commandline, const std::string& event) {
  xmlNode* trace = nullptr;
  for (xmlNode* a = commandline->children; a != nullptr; a = a->next) {
    if (a->type != XML_ELEMENT_NODE) continue;
    if (trace != nullptr && Prop(a, "value") == "enable=" + event) return trace;
    trace = Prop(a, "value") == "-trace" ? a : nullptr;
  }
  return nullptr;
}

// QEMU's boot-handshake trace events (boot_trace.h) from the domain's start:
// "-trace enable=E" through libvirt's QEMU namespace. There is no -D: QEMU's
// `log` trace backend then writes to stderr, which libvirt hands to virtlogd
// as the domain's log (/var/log/libvirt/qemu/DOMAIN.log), and libvirt itself
// passes `-msg timestamp=on`, so the lines are those of qemu-trace.log
// (docs/boot-timeline.md). A -D file would need a path QEMU's user and its
// security label may write; the log needs nothing new. Events the domain
// already enables are left to it and not recorded.
void AddQemuTrace(xmlNode* root, SetupRecord& record, std::vector<std::string>& changes) {
  xmlNode* commandline = QemuCommandline(root);
  const bool new_commandline = commandline == nullptr;
  bool new_ns = false;
  if (new_commandline) {
    xmlNs* ns = xmlSearchNsByHref(root->doc, root, X(kQemuNamespace));
    if (ns == nullptr) {
      ns = xmlNewNs(root, X(kQemuNamespace), X("qemu"));
      new_ns = true;
    }
    commandline = xmlNewDocNode(root->doc, ns, X("commandline"), nullptr);
    Insert(root, commandline);
  }
  std::string added;
  size_t count = 0;
  for (const std::string& event : BootTraceEvents()) {
    if (TraceArgPair(commandline, event) != nullptr) continue;
    for (const std::string& value : {std::string("-trace"), "enable=" + event}) {
      xmlNode* arg = xmlNewDocNode(root->doc, commandline->ns, X("arg"), nullptr);
      SetProp(arg, "value", value);
      Insert(commandline, arg);
    }
    added += (added.empty() ? "" : ",") + event;
    ++count;
  }
  if (count == 0) {
    changes.push_back("keep <qemu:commandline>: it enables QEMU's boot-handshake trace events");
    return;
  }
  record.Added({{"element", "qemu:commandline"},
                {"events", added},
                {"commandline", new_commandline ? "added" : "existing"},
                {"namespace", new_ns ? "added" : "existing"}});
  changes.push_back("add " + std::to_string(count) +
                    " QEMU trace events (-trace enable=E in <qemu:commandline>) for the boot "
                    "timeline: QEMU writes them to the domain's libvirt log");
}

// Undoes AddQemuTrace as |entry| records it.
void RemoveQemuTrace(xmlNode* root, const xmlNode* entry, std::vector<std::string>& changes) {
  xmlNode* commandline = QemuCommandline(root);
  if (commandline == nullptr) return;  // Removed by hand.
  const std::string events = Prop(entry, "events");
  for (size_t at = 0; at <= events.size();) {
    const size_t comma = std::min(events.find(',', at), events.size());
    if (xmlNode* trace = TraceArgPair(commandline, events.substr(at, comma - at))) {
      xmlNode* enable = xmlNextElementSibling(trace);
      Remove(trace);
      Remove(enable);
    }
    at = comma + 1;
  }
  changes.push_back("remove QEMU's boot-handshake trace events from <qemu:commandline>");
  if (Prop(entry, "commandline") != "added" || xmlFirstElementChild(commandline) != nullptr) return;
  Remove(commandline);
  if (Prop(entry, "namespace") != "added") return;
  // The xmlns:qemu declaration setup put on <domain>; nothing uses it now.
  for (xmlNs** ns = &root->nsDef; *ns != nullptr; ns = &(*ns)->next) {
    if ((*ns)->href != nullptr && xmlStrEqual((*ns)->href, X(kQemuNamespace))) {
      xmlNs* gone = *ns;
      *ns = gone->next;
      gone->next = nullptr;
      xmlFreeNs(gone);
      break;
    }
  }
}

}  // namespace

bool HasDomainSetup(std::string_view xml) {
  Result<DocPtr> doc = ParseDoc(xml);
  return doc.ok() && FindSetup(xmlDocGetRootElement(doc->get())) != nullptr;
}

Result<DomainSetupEdit> AddDomainSetup(std::string_view xml, const DomainSetupRequest& request) {
  Result<DomainXmlInfo> info = ParseDomainXml(xml);
  if (!info.ok()) return info.error();
  Result<DocPtr> doc = ParseDoc(xml);
  if (!doc.ok()) return Error{"domain '" + info->name + "': " + doc.error().message};
  xmlNode* root = xmlDocGetRootElement(doc->get());
  DomainSetupEdit edit;
  if (FindSetup(root) != nullptr) {
    edit.already_set_up = true;
    edit.xml = std::string(xml);
    return edit;
  }
  const std::string ctx = "domain '" + info->name + "': ";
  if (!info->numa_cells.empty()) {
    Result<DomainBootCell> cell = FindDomainBootCell(*info, request.instance, request.events);
    if (!cell.ok()) {
      return Error{ctx + "it already has a NUMA topology that is not hvtrace's (" +
                   cell.error().message +
                   "); hvtrace setup adds its two cells only to a domain without one: edit "
                   "<cpu><numa> by hand as `hvtrace domain-xml --numa` shows"};
    }
  }
  xmlNode* setup = MakeSetup(root);
  SetupRecord record(setup);
  if (info->numa_cells.empty()) {
    if (Status s = AddNuma(root, *info, request, record, edit.changes); !s.ok()) return s.error();
  } else {
    edit.changes.push_back("keep the NUMA cells already there: they place a boot range");
  }
  AddDevices(root, *info, record, edit.changes);
  SetOnCrash(root, record, edit.changes);
  AddVmcoreinfo(root, record, edit.changes);
  AddQemuTrace(root, record, edit.changes);
  edit.xml = Dump(doc->get());
  edit.changed = true;
  // What FindDomainBootCell will read back must be a boot range.
  Result<DomainXmlInfo> after = ParseDomainXml(edit.xml);
  if (!after.ok()) return Error{ctx + "the edited XML does not parse: " + after.error().message};
  Result<DomainBootCell> cell = FindDomainBootCell(*after, request.instance, request.events);
  if (!cell.ok()) return Error{ctx + "the edit places no boot range: " + cell.error().message};
  return edit;
}

Result<DomainSetupEdit> FinishDomainSetup(std::string_view original_xml,
                                          std::string_view defined_xml) {
  Result<DocPtr> before = ParseDoc(original_xml);
  if (!before.ok()) return before.error();
  Result<DocPtr> doc = ParseDoc(defined_xml);
  if (!doc.ok()) return doc.error();
  xmlNode* root = xmlDocGetRootElement(doc->get());
  xmlNode* setup = FindSetup(root);
  if (setup == nullptr) return Error{"libvirt dropped hvtrace's <metadata> setup record"};
  std::set<std::pair<std::string, std::string>> known;
  if (xmlNode* old_devices = Child(xmlDocGetRootElement(before->get()), "devices")) {
    for (xmlNode* d = old_devices->children; d != nullptr; d = d->next) {
      if (Named(d, "controller")) known.insert({Prop(d, "type"), Prop(d, "index")});
    }
  }
  for (xmlNode* e = setup->children; e != nullptr; e = e->next) {
    if (e->type == XML_ELEMENT_NODE && Prop(e, "element") == "controller") {
      known.insert({Prop(e, "type"), Prop(e, "index")});
    }
  }
  DomainSetupEdit edit;
  SetupRecord record(setup);
  xmlNode* devices = Child(root, "devices");
  for (xmlNode* d = devices != nullptr ? devices->children : nullptr; d != nullptr; d = d->next) {
    if (!Named(d, "controller") || known.count({Prop(d, "type"), Prop(d, "index")}) != 0) continue;
    record.Added(
        {{"element", "controller"}, {"type", Prop(d, "type")}, {"index", Prop(d, "index")}});
    edit.changes.push_back("libvirt added <controller type='" + Prop(d, "type") + "' index='" +
                           Prop(d, "index") + "'" +
                           (Prop(d, "model").empty() ? "" : " model='" + Prop(d, "model") + "'") +
                           "> for the new devices (recorded, so undo removes it)");
    edit.changed = true;
  }
  Result<DomainXmlInfo> info = ParseDomainXml(defined_xml);
  if (!info.ok()) return info.error();
  if (info->q35 && !info->hotplug_ok && devices != nullptr) {
    Insert(devices,
           NewElement(doc->get(), "controller", {{"type", "pci"}, {"model", "pcie-root-port"}}));
    edit.changes.push_back(
        "add a pcie-root-port (q35 hot-plugs only into a free one: hvtrace attach)");
    edit.changed = true;
  }
  edit.xml = edit.changed ? Dump(doc->get()) : std::string(defined_xml);
  return edit;
}

namespace {

xmlNode* FindDevice(xmlNode* devices, const std::string& element, const char* attr,
                    const std::string& value, bool in_target) {
  for (xmlNode* d = devices != nullptr ? devices->children : nullptr; d != nullptr; d = d->next) {
    if (!Named(d, element.c_str())) continue;
    if (Prop(in_target ? Child(d, "target") : d, attr) == value) return d;
  }
  return nullptr;
}

Status Restore(xmlNode* root, xmlNode* entry) {
  const std::string element = Prop(entry, "element");
  if (element != "memory" && element != "currentMemory" && element != "on_crash") {
    return Error{"the setup record changed <" + element + ">, which hvtrace setup never changes"};
  }
  xmlNode* node = Child(root, element.c_str());
  if (Prop(entry, "present") == "no") {
    if (node != nullptr) Remove(node);
    return {};
  }
  if (node == nullptr) {
    node = NewElement(root->doc, element.c_str());
    Insert(root, node, BeforeDevices(root));
  }
  xmlNodeSetContent(node, nullptr);
  xmlNodeAddContent(node, X(Prop(entry, "value").c_str()));
  if (Prop(entry, "unit").empty()) {
    xmlUnsetProp(node, X("unit"));
  } else {
    SetProp(node, "unit", Prop(entry, "unit"));
  }
  return {};
}

}  // namespace

Result<DomainSetupEdit> RemoveDomainSetup(std::string_view xml) {
  Result<DomainXmlInfo> info = ParseDomainXml(xml);
  if (!info.ok()) return info.error();
  const std::string ctx = "domain '" + info->name + "': ";
  Result<DocPtr> doc = ParseDoc(xml);
  if (!doc.ok()) return Error{ctx + doc.error().message};
  xmlNode* root = xmlDocGetRootElement(doc->get());
  xmlNode* setup = FindSetup(root);
  if (setup == nullptr) {
    return Error{ctx + "not set up by `hvtrace setup` (no <hvtrace:setup> in its <metadata>)"};
  }
  DomainSetupEdit edit;
  xmlNode* devices = Child(root, "devices");
  bool remove_cpu = false, remove_metadata = false;
  for (xmlNode* e = setup->children; e != nullptr; e = e->next) {
    if (e->type != XML_ELEMENT_NODE) continue;
    const std::string kind = reinterpret_cast<const char*>(e->name);
    const std::string element = Prop(e, "element");
    if (kind == "changed") {
      if (Status s = Restore(root, e); !s.ok()) return Error{ctx + s.error().message};
      edit.changes.push_back("restore <" + element + ">");
      continue;
    }
    if (kind != "added") return Error{ctx + "unknown setup record entry <" + kind + ">"};
    xmlNode* node = nullptr;
    if (element == "cpu") {
      remove_cpu = true;
    } else if (element == "metadata") {
      remove_metadata = true;
    } else if (element == "qemu:commandline") {
      RemoveQemuTrace(root, e, edit.changes);
    } else if (element == "numa") {
      node = Child(Child(root, "cpu"), "numa");
    } else if (element == "channel") {
      node = FindDevice(devices, element, "name", Prop(e, "name"), true);
    } else if (element == "panic") {
      node = FindDevice(devices, element, "model", Prop(e, "model"), false);
    } else if (element == "vmcoreinfo") {
      xmlNode* features = Child(root, "features");
      if (xmlNode* v = Child(features, "vmcoreinfo"); v != nullptr) {
        Remove(v);
        edit.changes.push_back("remove <vmcoreinfo>");
      }
      bool empty = true;
      for (xmlNode* c = features != nullptr ? features->children : nullptr; c; c = c->next) {
        if (c->type == XML_ELEMENT_NODE) empty = false;
      }
      if (features != nullptr && empty) Remove(features);
    } else if (element == "controller") {
      for (xmlNode* d = devices != nullptr ? devices->children : nullptr; d != nullptr;
           d = d->next) {
        if (Named(d, "controller") && Prop(d, "type") == Prop(e, "type") &&
            Prop(d, "index") == Prop(e, "index")) {
          node = d;
        }
      }
    } else {
      return Error{ctx + "the setup record added <" + element +
                   ">, which hvtrace setup never adds"};
    }
    if (node != nullptr) {
      Remove(node);
      edit.changes.push_back("remove <" + element + ">");
    }
  }
  if (remove_cpu && Child(root, "cpu") != nullptr) {
    Remove(Child(root, "cpu"));
    edit.changes.push_back("remove <cpu>");
  }
  xmlNode* metadata = setup->parent;
  Remove(setup);
  bool metadata_empty = true;
  for (xmlNode* c = metadata->children; c != nullptr; c = c->next) {
    if (c->type == XML_ELEMENT_NODE) metadata_empty = false;
  }
  if (remove_metadata && metadata_empty) Remove(metadata);
  edit.xml = Dump(doc->get());
  edit.changed = true;
  return edit;
}

}  // namespace hvtrace::hostd
