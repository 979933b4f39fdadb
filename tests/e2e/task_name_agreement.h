// Task names against what the kernel recorded: the e2e tests' measure of
// how well `hvtrace show` names the events of each task (issue #29's goal:
// >= 99% on busybox and systemd guests, 6.12 and 7.x). Shared by the busybox
// workload (task_names_e2e.cc) and the Debian image under libvirt
// (libvirt_debian_e2e.cc).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace hvtrace::e2e {

// One event of `hvtrace show --json`.
struct Event {
  int cpu = 0;
  int pid = 0;
  std::string comm;  // As printed.
  std::string name;
  nlohmann::json fields;
};

// `hvtrace show --json`'s output: its events, and the boot file lines
// (gtest assertions on a line that is not JSON).
void ParseShown(const std::string& out, std::vector<Event>* events,
                std::vector<std::string>* boot_files);

// The reference name of each event: what the kernel recorded for its task
// next on the same CPU (pid != 0). |at_switch_only|: the prev_comm of the
// next sched_switch that switches the task out. Otherwise a task_rename of
// the task by itself before that switch comes first (exec renames through
// task_rename too): its oldcomm is the name the task had up to and including
// the rename, while the switch shows the name after it. And, for a trace
// without task_rename, the task's own exec (sched_process_exec) before that
// switch: the events before it take the name the task had in this run so
// far (its switch-in next_comm, or its own latest rename's newcomm or exec's
// name; not compared when the trace does not show the switch-in), the exec
// event itself the basename of its filename, cut to 15 bytes.
std::vector<std::string> KernelNames(const std::vector<Event>& events, bool at_switch_only);

struct Agreement {
  size_t compared = 0, agree = 0;
  double percent() const { return compared == 0 ? 0 : 100.0 * agree / compared; }
};

// How many of |names| equal |ref| where |ref| is not empty.
Agreement Compare(const std::vector<std::string>& ref, const std::vector<std::string>& names);

// The names show printed (Event::comm), in order.
std::vector<std::string> ShownNames(const std::vector<Event>& events);

// Prints up to |max| events where |names| and |ref| disagree, "[TAG] ...".
void PrintDisagreements(const char* tag, const std::vector<Event>& events,
                        const std::vector<std::string>& ref, const std::vector<std::string>& names,
                        size_t max);

}  // namespace hvtrace::e2e
