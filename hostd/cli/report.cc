// hvtrace report FILE.dat [--format text|json] [-o OUT]
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

#include "commands.h"
#include "hvtrace/output.h"

namespace hvtrace::cli {
namespace {

void ReportUsage(FILE* out) {
  std::fprintf(out,
               "usage: hvtrace report FILE.dat [--format text|json] [-o OUT] [--strict]\n"
               "\n"
               "Prints every event of FILE.dat (trace-cmd's trace.dat, version 6 or 7) in\n"
               "time order: as `trace-cmd report` prints it (text, the default) or as one\n"
               "JSON object per line. Problems in the file go to stderr, naming the CPU and\n"
               "offset; the good events are still printed.\n"
               "\n"
               "  --format text|json   output format (default text)\n"
               "  -o OUT               write to OUT instead of stdout\n"
               "  --strict             exit 3 when the file had any problem\n"
               "  --no-fast-paths      print every event through libtraceevent (slower;\n"
               "                       for checking the compiled printers)\n");
}

}  // namespace

int RunReport(int argc, char** argv) {
  std::string input, output;
  ReportOptions options;
  bool strict = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* flag) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "hvtrace report: %s needs a value\n", flag);
        return nullptr;
      }
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      ReportUsage(stdout);
      return 0;
    } else if (arg == "--format" || arg == "-f") {
      const char* v = value("--format");
      if (v == nullptr) return 2;
      if (!std::strcmp(v, "text")) {
        options.format = OutputFormat::kText;
      } else if (!std::strcmp(v, "json")) {
        options.format = OutputFormat::kJson;
      } else {
        std::fprintf(stderr, "hvtrace report: unknown format '%s' (text or json)\n", v);
        return 2;
      }
    } else if (arg.starts_with("--format=")) {
      std::string v = arg.substr(9);
      if (v == "text") {
        options.format = OutputFormat::kText;
      } else if (v == "json") {
        options.format = OutputFormat::kJson;
      } else {
        std::fprintf(stderr, "hvtrace report: unknown format '%s' (text or json)\n", v.c_str());
        return 2;
      }
    } else if (arg == "-o" || arg == "--output") {
      const char* v = value("-o");
      if (v == nullptr) return 2;
      output = v;
    } else if (arg == "--strict") {
      strict = true;
    } else if (arg == "--no-fast-paths") {
      options.fast_paths = false;
    } else if (!arg.empty() && arg[0] == '-' && arg != "-") {
      std::fprintf(stderr, "hvtrace report: unknown option '%s'\n", arg.c_str());
      ReportUsage(stderr);
      return 2;
    } else if (input.empty()) {
      input = arg;
    } else {
      std::fprintf(stderr, "hvtrace report: more than one input file ('%s')\n", arg.c_str());
      return 2;
    }
  }
  if (input.empty()) {
    ReportUsage(stderr);
    return 2;
  }
  int fd = STDOUT_FILENO;
  if (!output.empty() && output != "-") {
    fd = ::open(output.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      std::fprintf(stderr, "hvtrace report: cannot open %s: %s\n", output.c_str(), std::strerror(errno));
      return 1;
    }
  }
  Result<ReportStats> stats = WriteReport(input, options, fd);
  if (fd != STDOUT_FILENO && ::close(fd) != 0 && stats.ok()) {
    std::fprintf(stderr, "hvtrace report: writing %s: %s\n", output.c_str(), std::strerror(errno));
    return 1;
  }
  if (!stats.ok()) {
    std::fprintf(stderr, "hvtrace report: %s\n", stats.error().message.c_str());
    return 1;
  }
  for (const std::string& issue : stats->issues) std::fprintf(stderr, "hvtrace report: %s\n", issue.c_str());
  if (!stats->issues.empty()) {
    std::fprintf(stderr, "hvtrace report: %zu problem(s); %llu events decoded\n", stats->issues.size(),
                 static_cast<unsigned long long>(stats->events));
    if (stats->events == 0) return 1;
    if (strict) return 3;
  }
  return 0;
}

}  // namespace hvtrace::cli
