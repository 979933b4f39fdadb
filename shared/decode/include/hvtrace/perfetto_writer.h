// Writes trace.dat files as one Perfetto trace (`hvtrace show --format
// perfetto`): the protobuf `Trace { repeated TracePacket packet = 1; }` that
// ui.perfetto.dev and trace_processor open. Field numbers are Perfetto's
// published ones (perfetto_writer.cc names each with its .proto file).
//
// What a file holds, in order:
//   - a SystemInfo packet first (the guest's utsname.release, so Perfetto
//     reads sched_switch's prev_state for the right kernel; the CPU count);
//   - per trace.dat (a boot; with --timeline also the host), one packet
//     sequence (trusted_packet_sequence_id), named by a track and a slice
//     spanning it: a ClockSnapshot stating its clock, then per CPU
//     FtraceEventBundles of at most kMaxBundleEvents events in time order,
//     each event with timestamp, pid and either the typed event Perfetto
//     makes tracks from (sched_switch, sched_wakeup/waking/wakeup_new,
//     sched_process_fork/exec/exit/free, task_newtask, task_rename,
//     ftrace:print, printk:console) or a GenericFtraceEvent with every field
//     (nothing is dropped; a record without a format is a generic
//     "hvtrace_unknown_event" with its id). Lost events start a new bundle
//     with lost_events set. Each task's name, as the trace names it at the
//     time (TaskNameTimeline), is stated with a ProcessTree packet when it
//     changes;
//   - with a host machine (WriteHostMachine), its SystemInfo, a
//     RemoteClockSync tying its clock to the guest's (offset 0: both are
//     the host clock) and its events on machine_id kHostMachineId.
//
// Memory is bounded: a bundle per CPU, one name per pid, and the sink's
// buffer; packets are written as they are complete.
#ifndef HVTRACE_PERFETTO_WRITER_H_
#define HVTRACE_PERFETTO_WRITER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "hvtrace/output.h"
#include "hvtrace/result.h"

namespace hvtrace {

// What one file contributed, for messages and tests.
struct PerfettoCounts {
  uint64_t events = 0;
  uint64_t bundles = 0;
  uint64_t lost_bundles = 0;                  // Bundles with lost_events set.
  uint64_t generic = 0;                       // Events written as GenericFtraceEvent.
  uint64_t name_changes = 0;                  // ProcessTree thread entries written.
  std::map<std::string, uint64_t> per_event;  // "sched_switch" -> count, typed or generic.
};

class PerfettoTraceWriter {
 public:
  static constexpr uint32_t kHostMachineId = 1;
  static constexpr uint32_t kMaxBundleEvents = 1024;

  // Writes to |fd| (not closed).
  explicit PerfettoTraceWriter(int fd);
  ~PerfettoTraceWriter();
  PerfettoTraceWriter(const PerfettoTraceWriter&) = delete;
  PerfettoTraceWriter& operator=(const PerfettoTraceWriter&) = delete;

  // The guest's SystemInfo: call first. |release| may be empty (unknown).
  void WriteSystemInfo(const std::string& release, uint32_t cpus, const std::string& machine_name);

  // How one file's events are placed on the trace's time axis.
  struct Sequence {
    std::string name;  // "guest boot 0: 6.12.58", shown on the sequence's track.
    // True: the file's time stamps are the host's CLOCK_REALTIME already
    // (host.dat, boot-<n>.host-clock.dat), written as they are. False: the
    // guest's own trace clock; a boot is placed after the previous one when
    // their times overlap (a kexec'd kernel starts its clock again).
    bool host_clock = false;
  };
  // Writes every event of the trace.dat at |path| as a new sequence of the
  // guest machine. Fails as WriteReport fails (the file cannot be read, the
  // output cannot be written); problems in the data are in the stats.
  Result<ReportStats> WriteGuestFile(const std::string& path, const Sequence& seq,
                                     PerfettoCounts* counts);
  // The host's events (host.dat, on the host clock) as machine
  // kHostMachineId, named |name|.
  Result<ReportStats> WriteHostMachine(const std::string& path, const std::string& name,
                                       PerfettoCounts* counts);
  // An instant event |name| (with |detail| as an argument) on the last
  // written guest sequence's track at |ts_ns| of its trace clock: the crash
  // summary. Before any sequence: nothing is written.
  void WriteInstant(uint64_t ts_ns, const std::string& name, const std::string& detail);

  // Flushes; the first write error.
  Status Finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hvtrace

#endif  // HVTRACE_PERFETTO_WRITER_H_
