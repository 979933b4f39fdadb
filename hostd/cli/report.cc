// hvtrace report FILE.dat [--json | --format text|json] [-o OUT] [--strict] [--threads N]
//
// Exit status: 0 when the file was read (problems inside it are printed to
// stderr, and every good event is still written); 1 when nothing could be
// read (the file cannot be opened, or it has problems and not one event could
// be decoded) or the output cannot be written; 2 for a usage error. With
// --strict any problem in the data gives 3.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "command.h"
#include "command_table.h"
#include "hvtrace/output.h"

namespace hvtrace::cli {
namespace {

class ReportCommand final : public Command {
 public:
  void Define(CLI::App& app) override {
    app.add_option("FILE", input_, "a trace-cmd trace.dat, version 6 or 7")
        ->required()
        ->type_name("");
    AddFormatFlags(app, json_);
    app.add_option("-o,--output", output_, "write to OUT instead of stdout")->type_name("OUT");
    app.add_flag("--strict", strict_, "exit 3 when the file had any problem");
    app.add_flag(
        "!--no-fast-paths", fast_paths_,
        "print every event through libtraceevent (slower; for checking the compiled printers)");
    app.add_option("--threads", threads_,
                   "threads that print events beside the one that merges the CPUs "
                   "(default: none below 4 CPUs, else one per CPU but the merging one's; 0: the "
                   "merging thread prints too; the output is the same)")
        ->type_name("N")
        ->check(CLI::Range(0, 64));
    app.add_flag("--time-names", time_names_,
                 "name each event's task as the trace named it at that time (two passes)");
    app.footer(
        "Prints every event of FILE (trace-cmd's trace.dat) in time order: as `trace-cmd report`\n"
        "prints it (text, the default) or as one JSON object per line. Problems in the file go to\n"
        "stderr, naming the CPU and offset; the good events are still printed.\n"
        "Task names are trace-cmd's, one per pid (saved_cmdlines, else the first sched_switch\n"
        "name), unless --time-names: then each event's task is named as the trace's own\n"
        "sched/task events named it at that time (the text is then no longer trace-cmd's).");
  }

  int Run() override {
    ReportOptions options;
    options.format = json_ ? OutputFormat::kJson : OutputFormat::kText;
    options.fast_paths = fast_paths_;
    options.time_names = time_names_;
    options.threads = threads_;
    options.leave_to_exit = true;  // Run() returns to main, which exits.
    int fd = STDOUT_FILENO;
    if (!output_.empty() && output_ != "-") {
      fd = ::open(output_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) {
        std::fprintf(stderr, "hvtrace report: cannot open %s: %s\n", output_.c_str(),
                     std::strerror(errno));
        return kExitFailed;
      }
    }
    Result<ReportStats> stats = WriteReport(input_, options, fd);
    if (fd != STDOUT_FILENO && ::close(fd) != 0 && stats.ok()) {
      std::fprintf(stderr, "hvtrace report: writing %s: %s\n", output_.c_str(),
                   std::strerror(errno));
      return kExitFailed;
    }
    if (!stats.ok()) {
      std::fprintf(stderr, "hvtrace report: %s\n", stats.error().message.c_str());
      return kExitFailed;
    }
    for (const std::string& issue : stats->issues)
      std::fprintf(stderr, "hvtrace report: %s\n", issue.c_str());
    if (!stats->issues.empty()) {
      std::fprintf(stderr, "hvtrace report: %zu problem(s); %llu events decoded\n",
                   stats->issues.size(), static_cast<unsigned long long>(stats->events));
      if (stats->events == 0) return kExitFailed;
      if (strict_) return kExitProblems;
    }
    return kExitOk;
  }

 private:
  std::string input_, output_;
  bool json_ = false;
  bool strict_ = false;
  bool fast_paths_ = true;
  bool time_names_ = false;
  int threads_ = -1;
};

}  // namespace

void AddReportCommand(CommandTable& table) {
  table.Add("report", "decode a trace.dat like `trace-cmd report` (text or JSON lines)",
            std::make_unique<ReportCommand>());
}

}  // namespace hvtrace::cli
