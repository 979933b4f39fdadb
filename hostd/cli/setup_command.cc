// hvtrace setup DOMAIN: asks hvtraced to edit a libvirt domain's persistent
// definition for hvtrace (libvirt_setup.h), then shows the diff of the two
// definitions the reply carries and the kernel parameters the guest needs.
// The diff is computed here, as the user, not in the root daemon.
#include <cstdio>
#include <string>

#include "command.h"
#include "command_table.h"
#include "daemon_call.h"
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
    if (int rc = CallDaemon(name(), flags_.socket, *Request(), &result); rc != kExitOk) return rc;
    const std::string domain = result.value("domain", request_.domain);
    // Computed here, as the user; --json carries it too.
    Result<std::string> diff = UnifiedDiff(result.value("old_xml", ""), result.value("new_xml", ""),
                                           domain + ".xml (before)", domain + ".xml (after)");
    result["diff"] = diff.ok() ? *diff : "(no diff: " + diff.error().message + ")";
    if (flags_.json) {
      PrintJson(result);
      return kExitOk;
    }
    Print(result);
    return kExitOk;
  }

 private:
  void Print(const json& result) const {
    const std::string domain = result.value("domain", request_.domain);
    if (result.value("already_set_up", false)) {
      std::printf(
          "domain %s: already set up by `hvtrace setup`; nothing changed (another --range or "
          "--events: `hvtrace setup --undo %s` first)\n",
          domain.c_str(), domain.c_str());
    } else {
      for (const auto& change : result.value("changes", json::array())) {
        std::printf("  %s\n", change.get<std::string>().c_str());
      }
      std::fputs(result.value("diff", "").c_str(), stdout);
      if (result.value("dry_run", false)) {
        std::printf("dry run: domain %s not changed\n", domain.c_str());
      } else {
        std::printf("domain %s: persistent definition %s%s\n", domain.c_str(),
                    request_.undo ? "restored" : "updated",
                    result.value("active", false)
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
    const json range = result.value("boot_range", json::object());
    std::printf("boot range: %llu bytes at GPA 0x%llx (NUMA cell 1)\n",
                static_cast<unsigned long long>(range.value("size", uint64_t{0})),
                static_cast<unsigned long long>(range.value("gpa", uint64_t{0})));
    std::printf("kernel parameters the guest must add: %s\n",
                result.value("kernel_params", "").c_str());
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
