// Task names as they were at the time of each event.
//
// A boot-range trace has no saved_cmdlines, and trace-cmd's table keeps one
// name per pid (libtraceevent's sched_switch plugin registers the first comm
// it sees; tep_register_comm never replaces one). But the trace records names
// as they change, and TaskNameTimeline reads them back: the name of pid P at
// the time of a record is what the kernel's statements about P around that
// record say (the rule is below the list):
//
//   sched:sched_switch         prev_comm/prev_pid, next_comm/next_pid
//   sched:sched_wakeup(_new), sched_waking, sched_process_exit,
//   sched_process_free, sched_migrate_task      comm/pid
//   sched:sched_process_fork   parent_comm/parent_pid; child_comm/child_pid
//                              (the child starts with the parent's name)
//   sched:sched_process_exec   pid gets kbasename(filename), cut to 15 bytes
//                              (6.12 fs/exec.c begin_new_exec:
//                              __set_task_comm(me, kbasename(bprm->filename))
//                              -> strscpy_pad into comm[TASK_COMM_LEN = 16]);
//                              the exec event itself already runs under it
//   task:task_newtask          pid/comm (the new task, named as its parent)
//   task:task_rename           pid (6.12; common_pid without it): oldcomm up
//                              to and including the rename event, which runs
//                              under the old name, newcomm after it
//
// (sched_process_wait is not used: its comm is the waiter's, its pid the
// waited-for task's.) A record that states P's name itself takes that name.
// Between two statements about P, P's records take the name the later one
// says P had up to it (its "before": every kind above except exec, whose old
// name the record does not carry, and fork/newtask for the child, which did
// not exist before); without one, the name the earlier statement left.
// Where the two agree (task_rename recorded: always, but for lost events)
// this is the latest statement at or before the record. Where they differ,
// P changed its name without an event: prctl(PR_SET_NAME) or a write to
// /proc/PID/comm with task:task_rename off (a forked busybox applet renames
// itself first thing, then runs as the new name until it is switched out),
// and the later name is the better guess; inferred() counts the records
// named so. An exec in between splits the interval: before it the earlier
// name, from it on the exec's. Before P's first statement the name is what
// that statement says P was called; after the last one, what it left. pid 0
// is left to the caller (it prints "<idle>"), and so is a pid the trace never
// names (the caller's saved_cmdlines, e.g. the agent's).
//
// Two passes over the same records in the same (time) order: Scan() each
// record, StartNaming() once, then Next() each record; the passes pair
// records by their index. Both are O(1) amortized per record (hash maps by
// pid; pass 1 keeps at most one interval per statement, pass 2 walks each
// pid's in order). Records are hostile: every field is bounds-checked
// against the payload, names are copied, cut at a NUL or at 15 bytes; a
// format without the expected fields is simply not used.
#ifndef HVTRACE_TASK_NAMES_H_
#define HVTRACE_TASK_NAMES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/page.h"
#include "hvtrace/tracedat.h"

namespace hvtrace {

// TASK_COMM_LEN - 1: the longest name the kernel keeps.
inline constexpr size_t kMaxTaskName = 15;

class TaskNameTimeline {
 public:
  // Finds the name-stating events among |formats| by system and name.
  // |keep_statements|: pass 1 keeps what it read for pass 2, which then
  // reads no record's names twice (memory: 64 bytes a statement, at most
  // 2^20 statements kept; for input bounded in size, such as a capture).
  explicit TaskNameTimeline(const std::vector<FormatText>& formats, bool keep_statements = false);
  ~TaskNameTimeline();
  TaskNameTimeline(const TaskNameTimeline&) = delete;
  TaskNameTimeline& operator=(const TaskNameTimeline&) = delete;

  // False when the formats hold none of the events above (nothing to learn).
  bool usable() const;

  // Pass 1: every record, in time order (|payload| starts with trace_entry).
  void Scan(std::span<const std::byte> payload);
  // Ends pass 1 and starts pass 2 from the names known before each pid's
  // first statement.
  void StartNaming();
  // Pass 2: the same records in the same order. Returns the name of the
  // record's task (common_pid) at its time, or nullptr when the trace does
  // not say (pid 0, or a pid never named). The pointer is valid until the
  // next call.
  const char* Next(std::span<const std::byte> payload);
  // Records Next() has named by inference so far: with the name a later
  // statement says the task had, which differs from what the statement
  // before them left (see above).
  uint64_t inferred() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  // Counts names per pid on the timeline's own entries (no second map).
  friend std::string MostUsedNames(const std::vector<FormatText>&, const PageLayout&,
                                   const std::vector<std::vector<std::span<const std::byte>>>&,
                                   std::string_view, struct TaskNameStats*);
};

// What MostUsedNames found.
struct TaskNameStats {
  uint64_t events = 0;         // Records read.
  uint64_t named = 0;          // Records the timeline named.
  uint64_t pids = 0;           // Pids the timeline named.
  uint64_t renamed_pids = 0;   // Pids that had more than one name.
  uint64_t not_most_used = 0;  // Named records whose name is not their pid's most used.
  uint64_t inferred = 0;       // Named records named by inference (TaskNameTimeline).
};

// saved_cmdlines text ("pid comm\n") for a trace.dat whose reader keeps one
// name per pid: each pid the timeline names gets the name that covers most of
// its events (ties: the one seen first), then the lines of |fallback| for the
// other pids. |cpus| holds each CPU's pages (validated copies, |layout|'s
// page format) in read order; the CPUs are merged by time stamp as trace-cmd
// merges them (ties to the lower CPU index).
std::string MostUsedNames(const std::vector<FormatText>& formats, const PageLayout& layout,
                          const std::vector<std::vector<std::span<const std::byte>>>& cpus,
                          std::string_view fallback, TaskNameStats* stats = nullptr);

}  // namespace hvtrace

#endif  // HVTRACE_TASK_NAMES_H_
