// hvtrace setup DOMAIN: asks hvtraced to edit a libvirt domain's persistent
// definition for hvtrace (libvirt_setup.h), then shows the diff of the two
// definitions the reply carries and the kernel parameters the guest needs.
// The diff is computed here, as the user, not in the root daemon.
#include <cstdio>
#include <string>

#include "command.h"
#include "command_table.h"
#include "daemon_call.h"
#include "replies.h"
#include "requests.h"
#include "unified_diff.h"

namespace hvtrace::cli {
namespace {

using nlohmann::json;

// Defining a domain may wait for libvirtd's other work on it.
constexpr std::chrono::milliseconds kSetupReplyTimeout = std::chrono::seconds(60);

class SetupCommand final : public Command {
 public:
  void Define(CLI::App& app) override {
    app.add_option("DOMAIN", request_.domain, "the libvirt domain (name or UUID)")->required();
    AddSizeOption(
        app, "--range", 1, 4096, [this](uint64_t pages) { request_.range = pages * 4096; },
        "the boot trace range, default 16M (a bare number is bytes)");
    app.add_option("--events", request_.events,
                   "trace_instance events (default: the boot sequence)")
        ->type_name("LIST");
    app.add_flag("--dry-run", request_.dry_run, "show the diff, change nothing");
    app.add_flag("--undo", request_.undo, "remove exactly what `hvtrace setup` added");
    AddDaemonFlags(app, flags_);
    app.footer(
        "Edits the domain's persistent definition through libvirt: NUMA cell 1 (shared,\n"
        "file-backed) for the boot range, the channel org.hvtrace.agent.0 for the agent's\n"
        "metadata, a pvpanic device, <on_crash>preserve</on_crash> in place of libvirt's\n"
        "default, and on q35 a free pcie-root-port. The running domain is not touched: the\n"
        "changes apply at its next cold boot (shut it down, then start it). What was added is\n"
        "recorded in the definition's <metadata>, so --undo removes exactly that.");
  }
  std::optional<DaemonRequest> Request() const override {
    return ToDaemonRequest(request_, kSetupReplyTimeout);
  }
  int Run() override {
    json result;
    hostd::SetupReply reply;
    if (int rc = CallDaemon(name(), flags_.socket, *Request(), &result, &reply); rc != kExitOk)
      return rc;
    // Computed here, as the user; --json carries it too.
    Result<std::string> diff =
        UnifiedDiff(reply.old_xml, reply.new_xml, reply.domain + ".xml (before)",
                    reply.domain + ".xml (after)");
    const std::string diff_text = diff.ok() ? *diff : "(no diff: " + diff.error().message + ")";
    if (flags_.json) {
      result["diff"] = diff_text;
      PrintJson(result);
      return kExitOk;
    }
    Print(reply, diff_text);
    return kExitOk;
  }

 private:
  void Print(const hostd::SetupReply& reply, const std::string& diff) const {
    const std::string& domain = reply.domain;
    if (reply.already_set_up) {
      std::printf(
          "domain %s: already set up by `hvtrace setup`; nothing changed (another --range or "
          "--events: `hvtrace setup --undo %s` first)\n",
          domain.c_str(), domain.c_str());
    } else {
      for (const std::string& change : reply.changes) std::printf("  %s\n", change.c_str());
      std::fputs(diff.c_str(), stdout);
      if (reply.dry_run) {
        std::printf("dry run: domain %s not changed\n", domain.c_str());
      } else {
        std::printf("domain %s: persistent definition %s%s\n", domain.c_str(),
                    request_.undo ? "restored" : "updated",
                    reply.active
                        ? "; it is running with the old one: the change applies at its next "
                          "cold boot (shut it down, then start it)"
                        : "; it applies when the domain starts");
      }
    }
    if (request_.undo) {
      std::printf(
          "inside the guest: hvtrace-agent boot-buffer disable (removes the kernel parameters)\n");
      return;
    }
    const hostd::SetupBootRange range = reply.boot_range.value_or(hostd::SetupBootRange{});
    std::printf("boot range: %llu bytes at GPA 0x%llx (NUMA cell 1)\n",
                static_cast<unsigned long long>(range.size),
                static_cast<unsigned long long>(range.gpa));
    std::printf("kernel parameters the guest must add: %s\n",
                reply.kernel_params.value_or("").c_str());
    std::printf("inside the guest: hvtrace-agent boot-buffer enable\n");
  }

  hostd::SetupRequest request_;
  DaemonFlags flags_;
};

}  // namespace

void AddSetupCommand(CommandTable& table) {
  table.Add("setup", "edit a libvirt domain's definition for hvtrace (--undo reverts it)",
            std::make_unique<SetupCommand>());
}

}  // namespace hvtrace::cli
