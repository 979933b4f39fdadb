// setup DOMAIN [--range SIZE] [--events LIST] [--dry-run] [--undo]: edits a
// libvirt domain's persistent definition for hvtrace (libvirt_setup.h). The
// reply carries both definitions; the CLI shows their diff.
#include <boost/asio/post.hpp>
#include <cctype>

#include "boot_request.h"
#include "daemon.h"
#include "daemon_libvirt.h"
#include "daemon_log.h"
#include "libvirt_setup.h"

namespace hvtrace::hostd {

namespace asio = boost::asio;
using nlohmann::json;

namespace {

constexpr uint64_t kMaxSetupRangeBytes = 1ull << 30;

Result<DomainSetupRequest> SetupRequest(const json& args) {
  DomainSetupRequest request;
  request.events = kDefaultBootEvents;
  if (auto it = args.find("range"); it != args.end() && !it->is_null()) {
    if (!it->is_number_unsigned()) return Error{"setup: args.range must be a byte count"};
    request.range_bytes = it->get<uint64_t>();
    if (request.range_bytes == 0 || request.range_bytes % kGuestPageSize != 0 ||
        request.range_bytes > kMaxSetupRangeBytes) {
      return Error{"setup: --range " + std::to_string(request.range_bytes) +
                   " must be a multiple of 4 KiB of at most 1 GiB"};
    }
  }
  if (auto it = args.find("events"); it != args.end() && !it->is_null()) {
    if (!it->is_string()) return Error{"setup: args.events must be a string"};
    request.events = it->get<std::string>();
    // They end up on the guest's kernel command line.
    for (char c : request.events) {
      if (!(std::isalnum(static_cast<unsigned char>(c)) ||
            std::string_view(":,_*^-").find(c) != std::string_view::npos)) {
        return Error{"setup: events '" + request.events +
                     "' may only hold names, ':', ',', '*', '^'"};
      }
    }
  }
  return request;
}

json OutcomeJson(const LibvirtSetupOutcome& out, bool undo, bool dry_run) {
  json reply = {{"domain", out.domain},   {"undo", undo},
                {"dry_run", dry_run},     {"already_set_up", out.already_set_up},
                {"defined", out.defined}, {"active", out.active},
                {"old_xml", out.old_xml}, {"new_xml", out.new_xml},
                {"changes", out.changes}};
  if (!undo) {
    reply["kernel_params"] = out.kernel_params;
    reply["boot_range"] = {{"gpa", out.layout.range_gpa}, {"size", out.layout.range_bytes}};
  }
  return reply;
}

}  // namespace

void Daemon::HandleSetup(const Request& request, const std::shared_ptr<Responder>& responder) {
  auto domain = request.args.find("domain");
  if (domain == request.args.end() || !domain->is_string() || domain->get<std::string>().empty()) {
    responder->Fail(kErrBadRequest, "setup needs args.domain (a libvirt domain name or UUID)");
    return;
  }
  if (!libvirt_) {
    responder->Fail(kErrBadRequest,
                    "setup edits libvirt domains: set libvirt_uri in hvtraced.conf first");
    return;
  }
  const bool undo = request.args.value("undo", false);
  const bool dry_run = request.args.value("dry_run", false);
  Result<DomainSetupRequest> setup = SetupRequest(request.args);
  if (!setup.ok()) {
    responder->Fail(kErrBadRequest, setup.error().message);
    return;
  }
  const std::string name = domain->get<std::string>();
  // libvirt calls block (and must not run on the event loop's thread).
  asio::post(pool_, [this, name, undo, dry_run, setup = *setup, responder] {
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
    responder->Reply(OutcomeJson(*out, undo, dry_run));
  });
}

}  // namespace hvtrace::hostd
