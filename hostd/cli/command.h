// One `hvtrace` command: a CLI11 subcommand whose options are bound to the
// command's members, a request for hvtraced built from them alone (no I/O,
// so tests check it), and Run. Each command lives in the file that
// implements it and is registered by that file's Add…Commands function;
// command_table.cc puts them all under one parser.
//
// The spellings every command shares are made here, so they are the same
// everywhere: --json, --socket PATH, sizes (ParseSize: 16M, 1G, 1088M),
// durations (ParseDuration: 30s, 500ms) and counts, each with an error that
// names the flag.
#ifndef HVTRACE_HOSTD_CLI_COMMAND_H_
#define HVTRACE_HOSTD_CLI_COMMAND_H_

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "hvtrace/result.h"
#include "json_message.h"

namespace hvtrace::cli {

// Exit statuses of every command; README ("Exit status") and `hvtrace help`
// print this table. hvtraced's error codes (control_protocol.h) map onto it
// in ExitCodeForDaemonError.
enum ExitCode : int {
  kExitOk = 0,
  // The command ran and failed: hvtraced said vm_failed, internal,
  // too_large or unknown_command, or a local step failed (a file, QEMU,
  // the harvest). `report`/`show`: nothing could be read.
  kExitFailed = 1,
  // Bad command line (unknown flag, bad number, missing argument), or a
  // request hvtraced refused as bad_request.
  kExitUsage = 2,
  // `report --strict`: the file had problems (the good events were printed).
  kExitProblems = 3,
  // hvtraced knows no VM of that name (unknown_vm), or no such capture
  // (unknown_capture).
  kExitUnknownVm = 4,
  // hvtraced could not be reached, or did not answer in time.
  kExitNoDaemon = 5,
  // hvtraced is busy with an earlier request for that VM, or with too many
  // clients (busy); try again.
  kExitBusy = 6,
  // hvtraced refused this user (permission_denied).
  kExitDenied = 7,
};

// The exit status for an error reply's "code".
int ExitCodeForDaemonError(std::string_view code);

// The table above as `hvtrace help` prints it.
const char* ExitStatusHelp();

// What a command sends hvtraced over its control socket.
struct DaemonRequest {
  std::string cmd;
  nlohmann::json args = nlohmann::json::object();
  std::chrono::milliseconds timeout{30000};
};

// |message| (control/requests.h, qemu/boot_request.h) as the request for its
// command, through its one JSON mapping.
template <class Message>
DaemonRequest ToDaemonRequest(const Message& message,
                              std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  return DaemonRequest{Message::kCommand, hostd::MessageToJson(message), timeout};
}

class Command {
 public:
  virtual ~Command() = default;

  // Adds this command's options and positionals to |app|, its subcommand.
  virtual void Define(CLI::App& app) = 0;
  // Checks that need more than one option (runs after a successful parse);
  // an error is a usage error.
  virtual Status Check() const { return {}; }
  // The request this command sends hvtraced; nullopt for commands that do
  // not talk to the daemon.
  virtual std::optional<DaemonRequest> Request() const { return std::nullopt; }
  // Does the work; returns the exit status.
  virtual int Run() = 0;

  // "attach", "formats harvest": for messages ("hvtrace attach: …").
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }

 private:
  std::string name_;
};

// Flags a command shares with every other command that talks to hvtraced.
struct DaemonFlags {
  std::string socket;
  bool json = false;
};
// --socket PATH, and --json when |json| (commands that can print JSON).
void AddDaemonFlags(CLI::App& app, DaemonFlags& flags, bool json = true);

// The VM NAME positional, checked with ValidateVmName.
CLI::Option* AddVmName(CLI::App& app, std::string& name, const std::string& what = "the VM's name");

// --flag SIZE through ParseSize: a bare number is in |bare_unit| bytes; the
// value must be a multiple of |granule| bytes and is handed to |store| in
// granules (so a MiB flag stores MiB).
CLI::Option* AddSizeOption(CLI::App& app, const std::string& flag, uint64_t bare_unit,
                           uint64_t granule, std::function<void(uint64_t)> store,
                           const std::string& help);

// --flag DURATION through ParseDuration, a bare number in seconds; values
// outside [|min|, |max|] are errors. |ms_alias| ("--wait-ms", or several:
// "--wait-ms,--timeout-ms"), when not empty, is a hidden old spelling whose
// bare number is milliseconds.
void AddDurationOption(CLI::App& app, const std::string& flag, const std::string& ms_alias,
                       std::chrono::milliseconds min, std::chrono::milliseconds max,
                       std::function<void(std::chrono::milliseconds)> store,
                       const std::string& help);

// --flag N: a decimal count in [|min|, |max|].
CLI::Option* AddCountOption(CLI::App& app, const std::string& flag, uint64_t min, uint64_t max,
                            std::function<void(uint64_t)> store, const std::string& help);

// --format text|json and --json (the same as --format json), for the
// commands that print events; |json| ends up true for JSON.
void AddFormatFlags(CLI::App& app, bool& json);

// Pretty JSON on stdout; invalid UTF-8 is replaced rather than thrown on.
void PrintJson(const nlohmann::json& value);

// Registration: command_table.cc calls each of these once, in the order
// `hvtrace help` lists the commands.
class CommandTable;
void AddReportCommand(CommandTable& table);
void AddShowCommand(CommandTable& table);
void AddDaemonCommands(CommandTable& table);  // ping list status captures daemon-shutdown
void AddVmCommands(CommandTable& table);      // boot qemu-args adopt capture stop
void AddAttachCommands(CommandTable& table);  // attach detach stream (+ libvirt-attach/-detach)
void AddDomainXmlCommand(CommandTable& table);
void AddSetupCommand(CommandTable& table);
void AddFormatsCommands(CommandTable& table);  // formats harvest, formats list
void AddFleetCommands(CommandTable& table);    // fleet list, fleet fetch

// formats_command.cc: asks hvtraced (on |socket_flag|'s socket) to harvest
// |kernel|'s formats into its cache unless they are there (boot runs it
// before the boot itself); fails only when hvtraced cannot be reached or
// refuses this user (a failed harvest is reported and the boot goes on).
int EnsureFormatsCached(const std::string& kernel, const std::string& socket_flag);

}  // namespace hvtrace::cli

#endif  // HVTRACE_HOSTD_CLI_COMMAND_H_
