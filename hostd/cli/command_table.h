// The one parser for every `hvtrace` command: a CLI11 app whose subcommands
// the command files add (command.h), plus `help [COMMAND]` and --version.
// Parse is separate from running so tests parse argv vectors and look at
// the chosen command's request without a daemon.
#ifndef HVTRACE_HOSTD_CLI_COMMAND_TABLE_H_
#define HVTRACE_HOSTD_CLI_COMMAND_TABLE_H_

#include <CLI/CLI.hpp>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "command.h"

namespace hvtrace::cli {

class CommandTable {
 public:
  // Every command, in the order `hvtrace help` lists them.
  CommandTable();
  CommandTable(const CommandTable&) = delete;
  CommandTable& operator=(const CommandTable&) = delete;

  // Adds subcommand |name| of |parent| (the root when null) that runs
  // |command|. A hidden command works but is not listed (old spellings).
  CLI::App* Add(const std::string& name, const std::string& summary,
                std::unique_ptr<Command> command, CLI::App* parent = nullptr, bool hidden = false);
  // A command that only holds subcommands (`formats`).
  CLI::App* AddGroup(const std::string& name, const std::string& summary);

  struct Parsed {
    Command* command = nullptr;  // Null: nothing to run, exit with |exit_code|.
    int exit_code = kExitOk;
  };
  // Parses |args| (args[0] is the program). Help, --version and usage
  // errors ("hvtrace COMMAND: why") are written to |out| / |err| here.
  Parsed Parse(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

  // Help for the command |path| names ({} for the whole table, {"formats",
  // "harvest"}); false when there is no such command.
  bool Help(const std::vector<std::string>& path, std::ostream& out) const;

  // Parse, then Run; the process's exit status.
  int Main(int argc, char** argv);

 private:
  // The deepest subcommand the parse chose (the root for none), and its
  // words ("formats harvest") appended to |path|.
  const CLI::App& Chosen(std::string* path) const;
  const CLI::App* Find(const std::vector<std::string>& path) const;

  CLI::App app_;
  std::vector<std::pair<CLI::App*, std::unique_ptr<Command>>> commands_;
};

}  // namespace hvtrace::cli

#endif  // HVTRACE_HOSTD_CLI_COMMAND_TABLE_H_
