// `hvtrace setup DOMAIN` and `hvtrace setup --undo DOMAIN` against libvirt:
// reads the domain's persistent definition (VIR_DOMAIN_XML_INACTIVE), edits it
// with domain_setup.h and defines it (virDomainDefineXML). The running
// instance is never touched: the changes apply at the domain's next cold
// boot. The definition edited and defined is the secure one (graphics
// passwords and the like stay); the two shown in the outcome are not.
// Blocking: call it off the libvirt event loop's thread.
#ifndef HVTRACE_HOSTD_LIBVIRT_SETUP_H_
#define HVTRACE_HOSTD_LIBVIRT_SETUP_H_

#include <string>
#include <string_view>
#include <vector>

#include "domain_setup.h"
#include "gpa_layout.h"
#include "hvtrace/result.h"
#include "libvirt_client.h"

namespace hvtrace::hostd {

struct LibvirtSetupOutcome {
  std::string domain;
  bool already_set_up = false;
  bool defined = false;  // False for a dry run or when nothing changed.
  bool active = false;   // The domain runs now (with its old definition).
  std::string old_xml;   // The persistent definition before.
  std::string new_xml;   // After (libvirt's own rendering once defined).
  std::vector<std::string> changes;
  // For setup: the range FindDomainBootCell finds in |new_xml|, and the
  // parameters the guest's kernel command line needs for it.
  BootRangeLayout layout;
  std::string kernel_params;
};

Result<LibvirtSetupOutcome> SetUpLibvirtDomain(const LibvirtClient& client, std::string_view domain,
                                               const DomainSetupRequest& request, bool dry_run);

Result<LibvirtSetupOutcome> UndoLibvirtDomainSetup(const LibvirtClient& client,
                                                   std::string_view domain, bool dry_run);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_LIBVIRT_SETUP_H_
