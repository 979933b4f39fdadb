// setup DOMAIN [--range SIZE] [--events LIST] [--dry-run] [--undo]: edits a
// libvirt domain's persistent definition for hvtrace (libvirt_setup.h). The
// reply carries both definitions; the CLI shows their diff.
#include <boost/asio/post.hpp>

#include "boot_request.h"
#include "daemon.h"
#include "daemon_libvirt.h"
#include "daemon_log.h"
#include "libvirt_setup.h"

namespace hvtrace::hostd {

namespace asio = boost::asio;
using nlohmann::json;

namespace {

// The libvirt layer's request from the control message; what the message
// leaves out keeps DomainSetupRequest's default, the events the boot
// sequence.
DomainSetupRequest DomainRequest(const SetupRequest& args) {
  DomainSetupRequest request;
  request.events = args.events.value_or(kDefaultBootEvents);
  if (args.range) request.range_bytes = *args.range;
  return request;
}

SetupReply OutcomeReply(const LibvirtSetupOutcome& out, bool undo, bool dry_run) {
  SetupReply reply;
  reply.domain = out.domain;
  reply.undo = undo;
  reply.dry_run = dry_run;
  reply.already_set_up = out.already_set_up;
  reply.defined = out.defined;
  reply.active = out.active;
  reply.old_xml = out.old_xml;
  reply.new_xml = out.new_xml;
  reply.changes = out.changes;
  if (!undo) {
    reply.kernel_params = out.kernel_params;
    reply.boot_range = SetupBootRange{{}, out.layout.range_gpa, out.layout.range_bytes};
  }
  return reply;
}

}  // namespace

void Daemon::HandleSetup(const Request&, const SetupRequest& args, const ResponderPtr& responder) {
  if (!libvirt_) {
    responder->Fail(kErrBadRequest,
                    "setup edits libvirt domains: set libvirt_uri in hvtraced.conf first");
    return;
  }
  const bool undo = args.undo;
  const bool dry_run = args.dry_run;
  const DomainSetupRequest setup = DomainRequest(args);
  const std::string name = args.domain;
  // libvirt calls block (and must not run on the event loop's thread).
  asio::post(pool_, [this, name, undo, dry_run, setup, responder] {
    Result<std::shared_ptr<LibvirtClient>> client = libvirt_->Connected();
    if (!client.ok()) {
      responder->Fail(kErrVmFailed, "setup " + name + ": " + client.error().message);
      return;
    }
    Result<LibvirtSetupOutcome> out = undo ? UndoLibvirtDomainSetup(**client, name, dry_run)
                                           : SetUpLibvirtDomain(**client, name, setup, dry_run);
    if (!out.ok()) {
      responder->Fail(kErrVmFailed, std::string(undo ? "setup --undo " : "setup ") + name + ": " +
                                        out.error().message);
      return;
    }
    if (out->defined) {
      LogNotice(std::string(undo ? "removed hvtrace's setup from" : "set up") + " libvirt domain " +
                out->domain + " (persistent definition; applies at its next cold boot)");
    }
    responder->Reply(OutcomeReply(*out, undo, dry_run));
  });
}

}  // namespace hvtrace::hostd
