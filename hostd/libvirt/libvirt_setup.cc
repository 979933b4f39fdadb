#include "libvirt_setup.h"

#include "domain_xml.h"

namespace hvtrace::hostd {
namespace {

// The domain and its persistent definition; a transient domain is refused,
// since defining it would make it persistent behind its owner's back.
Result<LibvirtDomainPtr> Persistent(const LibvirtClient& client, std::string_view name,
                                    LibvirtSetupOutcome& out) {
  Result<LibvirtDomainPtr> domain = client.FindDomain(name);
  if (!domain.ok()) return domain.error();
  const char* real_name = virDomainGetName(domain->get());
  out.domain = real_name != nullptr ? real_name : std::string(name);
  if (virDomainIsPersistent(domain->get()) != 1) {
    return Error{"domain '" + out.domain +
                 "' is transient (no persistent definition to edit): define it first "
                 "(virsh dumpxml " +
                 out.domain + " > d.xml; virsh define d.xml)"};
  }
  out.active = virDomainIsActive(domain->get()) == 1;
  Result<std::string> xml = LibvirtDomainXml(domain->get(), /*inactive=*/true);
  if (!xml.ok()) return xml.error();
  out.old_xml = std::move(*xml);
  return domain;
}

// Defines |xml| and returns libvirt's own rendering of the new definition.
Result<std::string> Define(virDomainPtr domain, const std::string& name, const std::string& xml) {
  virDomainPtr defined = virDomainDefineXML(virDomainGetConnect(domain), xml.c_str());
  if (defined == nullptr) {
    return Error{"libvirt refused the new definition of domain '" + name +
                 "': " + LibvirtLastError()};
  }
  LibvirtDomainPtr hold(defined);
  return LibvirtDomainXml(defined, /*inactive=*/true);
}

}  // namespace

Result<LibvirtSetupOutcome> SetUpLibvirtDomain(const LibvirtClient& client,
                                               std::string_view domain_name,
                                               const DomainSetupRequest& request, bool dry_run) {
  LibvirtSetupOutcome out;
  Result<LibvirtDomainPtr> domain = Persistent(client, domain_name, out);
  if (!domain.ok()) return domain.error();
  Result<DomainSetupEdit> edit = AddDomainSetup(out.old_xml, request);
  if (!edit.ok()) return edit.error();
  out.already_set_up = edit->already_set_up;
  out.changes = edit->changes;
  std::string xml = edit->xml;
  if (!out.already_set_up && !dry_run) {
    // libvirt adds controllers for the new devices (and addresses); each
    // round records them, until its answer needs no more records.
    Result<std::string> defined = Define(domain->get(), out.domain, xml);
    for (int round = 0; defined.ok() && round < 4; ++round) {
      Result<DomainSetupEdit> finish = FinishDomainSetup(out.old_xml, *defined);
      if (!finish.ok()) return Error{"domain '" + out.domain + "': " + finish.error().message};
      if (!finish->changed) break;
      out.changes.insert(out.changes.end(), finish->changes.begin(), finish->changes.end());
      defined = Define(domain->get(), out.domain, finish->xml);
    }
    if (!defined.ok()) return defined.error();
    xml = std::move(*defined);
    out.defined = true;
  }
  out.new_xml = xml;
  Result<DomainXmlInfo> info = ParseDomainXml(xml);
  if (!info.ok()) return Error{"domain '" + out.domain + "': " + info.error().message};
  Result<DomainBootCell> cell = FindDomainBootCell(*info, request.instance, request.events);
  if (!cell.ok()) return cell.error();
  out.layout = cell->layout;
  out.kernel_params = cell->kernel_params;
  return out;
}

Result<LibvirtSetupOutcome> UndoLibvirtDomainSetup(const LibvirtClient& client,
                                                   std::string_view domain_name, bool dry_run) {
  LibvirtSetupOutcome out;
  Result<LibvirtDomainPtr> domain = Persistent(client, domain_name, out);
  if (!domain.ok()) return domain.error();
  Result<DomainSetupEdit> edit = RemoveDomainSetup(out.old_xml);
  if (!edit.ok()) return edit.error();
  out.changes = edit->changes;
  out.new_xml = edit->xml;
  if (!dry_run) {
    Result<std::string> defined = Define(domain->get(), out.domain, edit->xml);
    if (!defined.ok()) return defined.error();
    out.new_xml = std::move(*defined);
    out.defined = true;
  }
  return out;
}

}  // namespace hvtrace::hostd
