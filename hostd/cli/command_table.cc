// GCC 12 sees a null dereference in std::string inlined from CLI11's config
// file reader, which App::parse instantiates here; a false positive, so it
// is silenced for the headers' code only (their locations are inside the
// push/pop), never for this file's.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include "command_table.h"

#include <iostream>
#include <sstream>
#pragma GCC diagnostic pop

#ifndef HVTRACE_VERSION
#define HVTRACE_VERSION "unknown"
#endif

namespace hvtrace::cli {
namespace {

// `hvtrace help [COMMAND [SUBCOMMAND]]`.
class HelpCommand final : public Command {
 public:
  explicit HelpCommand(const CommandTable& table) : table_(table) {}

  void Define(CLI::App& app) override {
    app.add_option("COMMAND", path_, "the command to describe (e.g. `attach`, `formats harvest`)")
        ->type_name("");
  }
  Status Check() const override {
    std::ostringstream ignored;
    if (!table_.Help(path_, ignored)) {
      std::string joined;
      for (const std::string& w : path_) joined += (joined.empty() ? "" : " ") + w;
      return Error{"no command '" + joined + "' (`hvtrace help` lists them)"};
    }
    return {};
  }
  int Run() override {
    table_.Help(path_, std::cout);
    return kExitOk;
  }

 private:
  const CommandTable& table_;
  std::vector<std::string> path_;
};

// CLI11's message, reworded where it does not say what was wrong.
std::string UsageMessage(const CLI::ParseError& e, const CLI::App& chosen) {
  std::string what = e.what();
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    // "The following arguments were not expected: x --shm", last first.
    std::istringstream words(
        what.substr(what.find(": ") == std::string::npos ? 0 : what.find(": ") + 2));
    std::string flags, others, word;
    while (words >> word) {
      std::string& list = word.size() > 1 && word[0] == '-' ? flags : others;
      list = "'" + word + "'" + (list.empty() ? "" : ", " + list);
    }
    if (flags.empty()) return "unexpected argument(s): " + others;
    return "unknown flag " + flags + (others.empty() ? "" : "; unexpected argument(s): " + others);
  }
  if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr &&
      what == "A subcommand is required") {
    std::string names;
    for (const CLI::App* sub :
         chosen.get_subcommands([](const CLI::App* a) { return !a->get_group().empty(); })) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    return "a subcommand is required: " + names;
  }
  return what;
}

}  // namespace

CommandTable::CommandTable()
    : app_(
          "hvtrace: the command-line front end of hvtraced, the hypervisor-side "
          "trace service for KVM/QEMU guests",
          "hvtrace") {
  app_.set_version_flag("--version", std::string("hvtrace ") + HVTRACE_VERSION);
  app_.require_subcommand(1);
  // `--size 4M --size 8M`: the last one counts, as scripts that append
  // flags expect.
  app_.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app_.footer(
      std::string(
          "`hvtrace help COMMAND` or `hvtrace COMMAND --help` describes a command.\n"
          "Sizes: 16M, 1G, 1088M, 0x1000 (a bare number is in the flag's unit, e.g. MiB\n"
          "for --memory); durations: 500ms, 30s, 2m (a bare number is seconds; the old\n"
          "--…-ms spellings take milliseconds). --flag=value and --flag value both work.\n\n") +
      ExitStatusHelp());
  AddReportCommand(*this);
  AddShowCommand(*this);
  AddDaemonCommands(*this);
  AddVmCommands(*this);
  AddAttachCommands(*this);
  AddDomainXmlCommand(*this);
  AddSetupCommand(*this);
  AddFormatsCommands(*this);
  AddFleetCommands(*this);
  Add("help", "describe every command, or one (`hvtrace help attach`)",
      std::make_unique<HelpCommand>(*this));
}

CLI::App* CommandTable::Add(const std::string& name, const std::string& summary,
                            std::unique_ptr<Command> command, CLI::App* parent, bool hidden) {
  CLI::App* sub = (parent ? parent : &app_)->add_subcommand(name, summary);
  if (hidden) sub->group("");
  command->set_name(parent ? parent->get_name() + " " + name : name);
  command->Define(*sub);
  commands_.emplace_back(sub, std::move(command));
  return sub;
}

CLI::App* CommandTable::AddGroup(const std::string& name, const std::string& summary) {
  CLI::App* sub = app_.add_subcommand(name, summary);
  sub->require_subcommand(1);
  return sub;
}

const CLI::App& CommandTable::Chosen(std::string* path) const {
  const CLI::App* app = &app_;
  while (true) {
    const auto chosen = app->get_subcommands();
    if (chosen.empty()) return *app;
    app = chosen.front();
    *path += (path->empty() ? "" : " ") + app->get_name();
  }
}

const CLI::App* CommandTable::Find(const std::vector<std::string>& path) const {
  const CLI::App* app = &app_;
  for (const std::string& word : path) {
    const CLI::App* next = nullptr;
    for (const CLI::App* sub :
         app->get_subcommands([&](const CLI::App* a) { return a->check_name(word); })) {
      next = sub;
    }
    if (next == nullptr) return nullptr;
    app = next;
  }
  return app;
}

bool CommandTable::Help(const std::vector<std::string>& path, std::ostream& out) const {
  const CLI::App* app = Find(path);
  if (app == nullptr) return false;
  std::string name = "hvtrace";
  for (const std::string& word : path) name += " " + word;
  out << app->get_formatter()->make_help(app, name, CLI::AppFormatMode::Normal);
  return true;
}

CommandTable::Parsed CommandTable::Parse(const std::vector<std::string>& args, std::ostream& out,
                                         std::ostream& err) {
  if (args.size() < 2) {
    Help({}, err);
    return {nullptr, kExitUsage};
  }
  if (!args[1].empty() && args[1][0] != '-' && Find({args[1]}) == nullptr) {
    err << "hvtrace: unknown command '" << args[1]
        << "'\nRun `hvtrace help` for the list of commands.\n";
    return {nullptr, kExitUsage};
  }
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  try {
    app_.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::Success& e) {  // --help, --version.
    app_.exit(e, out, err);
    return {nullptr, kExitOk};
  } catch (const CLI::ParseError& e) {
    std::string path;
    const CLI::App& chosen = Chosen(&path);
    const std::string words = path.empty() ? "" : " " + path;
    err << "hvtrace" << words << ": " << UsageMessage(e, chosen) << "\nRun `hvtrace help" << words
        << "` for usage.\n";
    return {nullptr, kExitUsage};
  }
  std::string path;
  Chosen(&path);
  for (auto& [app, command] : commands_) {
    if (command->name() != path) continue;
    if (Status s = command->Check(); !s.ok()) {
      err << "hvtrace " << path << ": " << s.error().message << "\nRun `hvtrace help " << path
          << "` for usage.\n";
      return {nullptr, kExitUsage};
    }
    return {command.get(), kExitOk};
  }
  err << "hvtrace: internal error: no command for '" << path << "'\n";
  return {nullptr, kExitFailed};
}

int CommandTable::Main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  Parsed parsed = Parse(args, std::cout, std::cerr);
  if (parsed.command == nullptr) return parsed.exit_code;
  return parsed.command->Run();
}

}  // namespace hvtrace::cli
