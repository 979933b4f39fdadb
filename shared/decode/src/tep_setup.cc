// What a trace file says about its kernel, handed to libtraceevent as
// trace-cmd hands it (tep_setup.h).
#include "tep_setup.h"

#include <traceevent/event-parse.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace hvtrace {

// trace-cmd prints times as sec.usec only for clocks that count nanoseconds
// (trace-input.c, extract_trace_clock); for others it prints the raw count.
bool ClockInNanoseconds(const std::string& trace_clock) {
  std::string clock;
  if (size_t open = trace_clock.find('['); open != std::string::npos) {
    size_t close = trace_clock.find(']', open);
    clock = trace_clock.substr(open + 1,
                               close == std::string::npos ? std::string::npos : close - open - 1);
  } else {
    size_t end = trace_clock.find_first_of(" \n\t");
    clock = trace_clock.substr(0, end);
  }
  if (clock.empty()) return true;  // No clock recorded: trace-cmd keeps usecs.
  return clock == "local" || clock == "global" || clock == "uptime" || clock == "perf" ||
         clock.starts_with("mono") || clock == "x86-tsc-nsec" || clock == "tai";
}

// printk_formats ("0xADDR : \"FORMAT\"" per line, as the kernel writes
// them) registered one by one instead of through tep_parse_printk_formats:
// libtraceevent 1.7's parser reads past a line's end when it has no ':'
// (strdup(fmt + 1)), and tep_register_print_string strips the quotes and a
// trailing "\n" by stepping back two bytes from the end, before the string's
// start for a format under two characters (found by the perfetto_export
// fuzzer under ASan: tests/fixtures/fuzz/tracedat/short-printk-format.dat).
// Lines of any other shape, and formats too short to name anything, are
// left out: a trace.dat is hostile input.
void LoadPrintkFormats(tep_handle* tep, std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    const size_t sep = line.find(" : ");
    if (sep == std::string_view::npos || sep == 0) continue;
    std::string addr(line.substr(0, sep));
    char* after = nullptr;
    errno = 0;
    const unsigned long long value = std::strtoull(addr.c_str(), &after, 16);
    if (errno != 0 || after != addr.c_str() + addr.size() || !std::isxdigit(addr[0])) continue;
    std::string_view fmt = line.substr(sep + 3);
    if (fmt.size() < 4 || fmt.front() != '"' || fmt.back() != '"') continue;
    if (fmt.find('\0') != std::string_view::npos) continue;
    tep_register_print_string(tep, std::string(fmt).c_str(), value);
  }
}

// saved_cmdlines as trace-cmd parses it (trace-util.c): "pid comm" per line,
// registered in file order; later duplicates are ignored.
void LoadCmdlines(tep_handle* tep, const std::string& text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    char* after = nullptr;
    long pid = std::strtol(line.c_str(), &after, 10);
    if (after == line.c_str() || *after != ' ') continue;
    std::string comm(after + 1);
    if (comm.empty() || pid < 0 || pid > INT32_MAX) continue;
    tep_register_comm(tep, comm.c_str(), static_cast<int>(pid));
  }
}

// tep_unload_plugins dlcloses every plugin: with no other handle open, each
// decoder's end unmapped them and the next decoder mapped and relocated
// them again, 0.6-1.3 ms of each panic's crash summary in hvtraced
// (timed around tep_load_plugins, bench/capture_latency.sh, 2026-12-05).
// One list loaded once and never unloaded keeps them mapped; its handle is
// reachable from here, so leak checkers see no leak.
tep_plugin_list* LoadTepPlugins(tep_handle* tep) {
  struct Pin {
    tep_handle* tep = tep_alloc();
    tep_plugin_list* plugins = tep != nullptr ? tep_load_plugins(tep) : nullptr;
  };
  static const Pin* const pin = new Pin;
  (void)pin;
  return tep_load_plugins(tep);
}

}  // namespace hvtrace
