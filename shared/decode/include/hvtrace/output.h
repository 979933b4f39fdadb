// Writing decoded events: a buffered sink and the whole-file report that
// `hvtrace report` runs.
#ifndef HVTRACE_OUTPUT_H_
#define HVTRACE_OUTPUT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/result.h"

namespace hvtrace {

class EventDecoder;
struct DecodedRecord;
struct TraceMetadata;

// Collects text in one large buffer and writes it to a file descriptor in big
// chunks: one write(2) per ~1 MiB instead of one stdio call per line.
class OutputSink {
 public:
  // kBackground writes each full buffer on a thread of its own while the
  // caller fills the next one (two buffers in all): for a producer that
  // keeps its thread busy, the write(2)s no longer take turns with it.
  // That thread also starts the file's writeback every 8 MiB
  // (sync_file_range), so a final fsync has little left to wait for.
  enum class Mode { kInline, kBackground };
  explicit OutputSink(int fd, size_t flush_at = 1 << 20, Mode mode = Mode::kInline);
  ~OutputSink();  // Flushes; errors are kept in status().
  OutputSink(const OutputSink&) = delete;
  OutputSink& operator=(const OutputSink&) = delete;

  // The buffer to append to; call MaybeFlush() after appending.
  std::string* buffer() { return &buffer_; }
  void MaybeFlush() {
    if (buffer_.size() >= flush_at_) Handoff();  // Errors stay in status().
  }
  // Writes everything (and waits for it in kBackground mode).
  Status Flush();
  // Appends |text|, or writes it through (after what is buffered) when it
  // is large (64 KiB: a report's batches) or the buffer would pass the
  // flush size.
  void Write(std::string_view text);
  // The first write error; in kBackground mode as of the last buffer
  // handed over (a failing write is seen one buffer late).
  const Status& status() const { return status_; }

 private:
  struct Background;
  void Handoff();
  int fd_;
  size_t flush_at_;
  std::string buffer_;
  Status status_;
  std::unique_ptr<Background> background_;  // kBackground only.
};

enum class OutputFormat { kText, kJson };

struct ReportOptions {
  OutputFormat format = OutputFormat::kText;
  // Off: every event is printed by libtraceevent (for comparisons).
  bool fast_paths = true;
  // Print trace-cmd's "cpus=N" header line (text only).
  bool header = true;
  // Name each event's task as the trace itself named it at that time
  // (TaskNameTimeline: a first pass over the records, then the printing
  // pass). Off: trace-cmd's one name per pid, byte-identical to
  // `trace-cmd report`.
  bool time_names = false;
  // Off: the file's kallsyms and printk formats, which only event text
  // uses, are neither read (v7) nor given to the decoder (ForEachRecord's
  // writers).
  bool symbols = true;
  // Threads that print events while the calling thread merges the CPUs:
  // -1 the default (none below 4 CPUs, else one per CPU but the caller's),
  // 0 none (the calling thread prints). The output is the same for every
  // value.
  int threads = -1;
  // Records per batch handed to a printing thread (0: the default, 4096).
  // Tests make it small to cross many batch boundaries.
  size_t batch_records = 0;
  // The process ends right after this report (`hvtrace report`): the file's
  // metadata and the decoder are left to the exit instead of freed (the
  // output is flushed and the trial child ended all the same). Freeing them
  // was ~2,600 page faults at the end of bench/large.dat's report: the trial
  // child shared those pages, so each free copied one.
  bool leave_to_exit = false;
};

struct ReportStats {
  uint64_t events = 0;
  uint64_t pages = 0;
  uint64_t bad_pages = 0;  // Pages with a rejected tail (their good records are printed).
  uint64_t fast_path_events = 0;
  // Every problem, each naming the file and, where it applies, the CPU and
  // offset. Reading went on past each of them.
  std::vector<std::string> issues;
};

// Decodes every event of the trace.dat at |path| and writes it to |out_fd|
// in the same order and shape as `trace-cmd report` (text) or as JSON lines.
// CPUs are merged by time stamp the way trace-cmd merges them: smallest time
// first, ties to the CPU listed first. Fails only when the file cannot be
// opened or the output cannot be written; problems inside the data are listed
// in the returned stats and every good event is still written.
Result<ReportStats> WriteReport(const std::string& path, const ReportOptions& options, int out_fd);

// The same events in the same order, handed one by one to |on_event| with
// their time stamp and the text WriteReport would write for them ('\n'
// included; no "cpus=" header). Return false from |on_event| to stop. For
// merging several files into one timeline.
using ReportLineFn = std::function<bool(uint64_t timestamp, std::string_view text)>;
Result<ReportStats> ForEachReportLine(const std::string& path, const ReportOptions& options,
                                      const ReportLineFn& on_event);

// The same records in the same order, undecoded, for writers of other
// formats (perfetto_writer.h): |on_start| once before the first record,
// with the file's metadata and the decoder whose FindFormat() names each
// record's event; then |on_record| for every record (its |comm| the name
// at the time when options.time_names is set). Either returns false to
// stop. options.format and options.threads are not used.
using RecordStartFn = std::function<bool(const TraceMetadata& metadata, EventDecoder& decoder)>;
using RecordFn = std::function<bool(const DecodedRecord& record)>;
Result<ReportStats> ForEachRecord(const std::string& path, const ReportOptions& options,
                                  const RecordStartFn& on_start, const RecordFn& on_record);

}  // namespace hvtrace

#endif  // HVTRACE_OUTPUT_H_
