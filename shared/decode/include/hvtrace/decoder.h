// Event decoding: raw records (cpu, time stamp, payload) -> text in exactly
// `trace-cmd report`'s shape, or JSON lines.
//
// The text of every event is what libtraceevent (with its plugins, as
// trace-cmd loads them) prints for it. For the common shapes of print format
// the decoder compiles the format once into a small program and runs that
// instead (libtraceevent re-parses the format string on every call); the
// compiled path must produce byte-identical text, and
// EventDecoder::SetFastPathsEnabled(false) turns it off so tests can compare
// the two on every record of real traces.
//
// Payloads are untrusted. Before anything reads a payload it is copied into a
// zero-padded scratch area large enough for any field offset or dynamic-array
// reference the accepted formats can name, so neither libtraceevent nor the
// compiled printers can read outside memory we own.
#ifndef HVTRACE_DECODER_H_
#define HVTRACE_DECODER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/format.h"
#include "hvtrace/result.h"
#include "hvtrace/tracedat.h"

namespace hvtrace {

// Everything the decoder needs to know about the kernel that wrote the data.
// TraceMetadataFrom() fills it from a trace.dat; a capture fills it from the
// guest's published formats.
struct TraceMetadata {
  std::string source;       // For messages: a file name or VM name.
  std::string header_page;  // events/header_page text.
  std::vector<FormatText> formats;
  std::string kallsyms;        // /proc/kallsyms text (may be empty).
  std::string printk_formats;  // printk_formats text (may be empty).
  std::string cmdlines;        // saved_cmdlines text: "pid comm\n".
  std::string trace_clock;     // "[local] global ..." or just "local".
  uint32_t long_size = 8;
  uint32_t page_size = 4096;
  bool big_endian = false;
};
TraceMetadata TraceMetadataFrom(const TraceDat& dat);
// The same, moving the kallsyms and formats out of |dat| (TraceDat::
// ReleaseKallsyms, ReleaseFormats): copying them was 7.4 MB of memcpy into
// fresh pages (~1,800 page faults) of `hvtrace report` on bench/large.dat,
// before its first record.
TraceMetadata TraceMetadataFrom(TraceDat* dat);

// One record ready to print. |payload| starts with struct trace_entry.
struct DecodedRecord {
  uint32_t cpu = 0;
  uint64_t timestamp = 0;  // Nanoseconds (or raw clock units), offset applied.
  std::span<const std::byte> payload;
  // Missed events reported by the record's page before this record, as
  // trace-cmd reports them: 0 none, > 0 count, -1 "some, count unknown".
  int64_t missed_events = 0;
  // The task's name at this record's time (TaskNameTimeline); nullptr: the
  // decoder's one name per pid (saved_cmdlines, then the sched plugin's).
  const char* comm = nullptr;
};

class EventDecoder {
 public:
  // Loads the formats (each checked by ParseEventFormat before libtraceevent
  // sees it), symbols, printk formats and comms. Formats that fail are
  // skipped and listed in warnings(); their events print as unknown.
  static Result<std::unique_ptr<EventDecoder>> Create(const TraceMetadata& metadata);
  // A decoder that prints records beside |leader| (made from |metadata|)
  // on another thread, a parallel report's: it takes the leader's parsed
  // formats (copied on each event's first record), kernel symbols, trial
  // verdicts and fast-path setting (SetFastPathsEnabled) instead of making
  // its own, so it costs little to make. |leader| and |metadata| must
  // outlive it, and the leader must have prepared (PrepareText /
  // PrepareJson) every record before this decoder prints it.
  static Result<std::unique_ptr<EventDecoder>> CreateFollower(const EventDecoder& leader,
                                                              const TraceMetadata& metadata);
  ~EventDecoder();
  EventDecoder(const EventDecoder&) = delete;
  EventDecoder& operator=(const EventDecoder&) = delete;

  const std::vector<std::string>& warnings() const;

  // The format of event |id|, or nullptr when the metadata has none.
  const EventFormat* FindFormat(uint32_t id) const;

  // Appends the record as one line of `trace-cmd report` text, '\n' included
  // (preceded by trace-cmd's "CPU:N [... EVENTS DROPPED]" line when
  // |missed_events| is set).
  void AppendText(const DecodedRecord& record, std::string* out);

  // The part of AppendText that must run once per record, in record order,
  // on one decoder, so that followers can print the others in any order:
  // loads the record's format on first use and sets |record->comm| (unless
  // set) to the name AppendText would print for it now. Returns true when
  // this decoder must also print the record itself, now (AppendText),
  // because printing it changes what later records print: libtraceevent's
  // plugin handlers (sched_switch registers the comms it prints; others keep
  // state), except kmem's call-site handler, which keeps none.
  bool PrepareText(DecodedRecord* record);
  // The same for AppendJson, whose printing changes nothing: parses the
  // record's format on first use (a follower copies it from here) and sets
  // |record->comm|.
  void PrepareJson(DecodedRecord* record);

  // Appends the record as one JSON object and '\n':
  // {"cpu":0,"ts_ns":123,"event":"sched_switch","system":"sched","pid":1,
  //  "comm":"bash","fields":{...}} (+ "missed_events" when set). Integer
  // fields are numbers, char arrays and __data_loc strings are strings, other
  // arrays are arrays of numbers.
  void AppendJson(const DecodedRecord& record, std::string* out);

  // Names the tasks of |cmdlines| ("pid comm\n" lines; a pid's first line
  // wins), replacing names already known: a live source (an attached
  // guest's saved_cmdlines) renames tasks and reuses pids, and rebuilding
  // the decoder for that would parse its symbols again.
  void UpdateComms(std::string_view cmdlines);

  // Each format is trial-parsed in a forked copy of this process before
  // libtraceevent parses it here (Create). Kept: the trials share one child
  // until this is turned off or the decoder ends, one fork for a whole file
  // instead of one per format (a copy of a big process is not cheap). Off by
  // default: a long-lived decoder should not keep a copy of its process.
  void KeepTrialChild(bool keep);

  // The trial run of every format this decoder has not loaded, in one child
  // (a new one after a crash), none loaded here. Indexed like the metadata's
  // formats: true when libtraceevent survived it; false also for a format
  // Create skipped (refused, or an id an earlier format has). For a caller
  // that loads a kernel's formats once and prints a few of its events
  // later, when a fork of a large process would cost more than the printing
  // (FormatText::trial_passed).
  std::vector<bool> TrialParseAll();

  // On by default. Off: every event goes through libtraceevent, and events
  // first seen while it is off get no compiled printer.
  void SetFastPathsEnabled(bool enabled);
  // Events whose text came from compiled printers / from libtraceevent.
  uint64_t fast_path_count() const;
  uint64_t slow_path_count() const;

 private:
  struct Impl;
  explicit EventDecoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hvtrace

#endif  // HVTRACE_DECODER_H_
