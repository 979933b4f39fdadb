#include "libvirt_setup.h"

#include "domain_xml.h"

namespace hvtrace::hostd {
namespace {

// The inactive definition. With |secure| it keeps what libvirt otherwise
// leaves out (graphics passwords, ...): that one is edited and defined, or
// defining would drop them. The one without is what the reply shows.
Result<std::string> InactiveXml(virDomainPtr domain, const std::string& name, bool secure) {
  char* xml = virDomainGetXMLDesc(
      domain, secure ? VIR_DOMAIN_XML_INACTIVE | VIR_DOMAIN_XML_SECURE : VIR_DOMAIN_XML_INACTIVE);
  if (xml == nullptr) {
    return Error{"libvirt: cannot read the persistent definition of domain '" + name +
                 "': " + LibvirtLastError()};
  }
  std::string out(xml);
  free(xml);
  return out;
}

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
  Result<std::string> xml = InactiveXml(domain->get(), out.domain, /*secure=*/false);
  if (!xml.ok()) return xml.error();
  out.old_xml = std::move(*xml);
  return domain;
}

// Defines |xml| and returns libvirt's own (secure) rendering of the new
// definition.
Result<std::string> Define(virDomainPtr domain, const std::string& name, const std::string& xml) {
  virDomainPtr defined = virDomainDefineXML(virDomainGetConnect(domain), xml.c_str());
  if (defined == nullptr) {
    return Error{"libvirt refused the new definition of domain '" + name +
                 "': " + LibvirtLastError()};
  }
  LibvirtDomainPtr hold(defined);
  return InactiveXml(defined, name, /*secure=*/true);
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
  out.new_xml = edit->xml;
  if (!out.already_set_up && !dry_run) {
    // The same edit on the secure definition is what gets defined.
    Result<std::string> secure = InactiveXml(domain->get(), out.domain, /*secure=*/true);
    if (!secure.ok()) return secure.error();
    Result<DomainSetupEdit> secure_edit = AddDomainSetup(*secure, request);
    if (!secure_edit.ok()) return secure_edit.error();
    // libvirt adds controllers for the new devices (and addresses); each
    // round records them, until its answer needs no more records.
    Result<std::string> defined = Define(domain->get(), out.domain, secure_edit->xml);
    for (int round = 0; defined.ok() && round < 4; ++round) {
      Result<DomainSetupEdit> finish = FinishDomainSetup(*secure, *defined);
      if (!finish.ok()) return Error{"domain '" + out.domain + "': " + finish.error().message};
      if (!finish->changed) break;
      out.changes.insert(out.changes.end(), finish->changes.begin(), finish->changes.end());
      defined = Define(domain->get(), out.domain, finish->xml);
    }
    if (!defined.ok()) return defined.error();
    Result<std::string> shown = InactiveXml(domain->get(), out.domain, /*secure=*/false);
    if (!shown.ok()) return shown.error();
    out.new_xml = std::move(*shown);
    out.defined = true;
  }
  const std::string& xml = out.new_xml;
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
    Result<std::string> secure = InactiveXml(domain->get(), out.domain, /*secure=*/true);
    if (!secure.ok()) return secure.error();
    Result<DomainSetupEdit> secure_edit = RemoveDomainSetup(*secure);
    if (!secure_edit.ok()) return secure_edit.error();
    Result<std::string> defined = Define(domain->get(), out.domain, secure_edit->xml);
    if (!defined.ok()) return defined.error();
    Result<std::string> shown = InactiveXml(domain->get(), out.domain, /*secure=*/false);
    if (!shown.ok()) return shown.error();
    out.new_xml = std::move(*shown);
    out.defined = true;
  }
  return out;
}

}  // namespace hvtrace::hostd
