// OutputSink and WriteReport (hvtrace/output.h).
//
// Reading: one thread per CPU stream opens its own TraceDat and pushes page
// copies into a small bounded queue (TraceDat::ForEachPage is a push
// interface; the queue turns it into the pull that a k-way merge needs,
// keeping memory bounded and decompression off the merging thread). The
// merging thread walks each page with the bounds-checked PageCursor and
// merges the CPUs by time stamp exactly as trace-cmd's
// tracecmd_iterate_events_multi does: the smallest time stamp wins, ties go
// to the CPU that comes first in the file. It hands the records, in that
// order, to ReportPrinter (report_printer.h), which prints them on printing
// threads when there are any.
#include "hvtrace/output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "hvtrace/decoder.h"
#include "hvtrace/page.h"
#include "hvtrace/task_names.h"
#include "hvtrace/tracedat.h"
#include "report_printer.h"

namespace hvtrace {

namespace {

// Writes all of |text| to |fd|.
Status WriteFd(int fd, std::string_view text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error{std::string("write to output failed: ") + std::strerror(errno)};
    }
    done += static_cast<size_t>(n);
  }
  return {};
}

}  // namespace

// The writing thread of a kBackground sink and the buffer it writes.
struct OutputSink::Background {
  static constexpr size_t kWritebackBytes = 8 << 20;

  explicit Background(int fd) : thread([this, fd] { Run(fd); }) {}
  ~Background() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    thread.join();
  }
  // Waits until the last buffer handed over is written; |mu| held.
  void WaitIdle(std::unique_lock<std::mutex>& lock) {
    cv.wait(lock, [&] { return !busy; });
  }

  void Run(int fd) {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return busy || stop; });
      if (!busy) return;
      const bool ok = status.ok();
      lock.unlock();
      Status s = ok ? WriteFd(fd, pending) : Status{};
      // Start the kernel's writeback as the file grows, here, off the
      // caller's thread: a caller that fsyncs at the end (show --format
      // perfetto) then waits for the last few MiB, not for the whole file
      // (~50 ms for 108 MB here). Fails harmlessly on a pipe.
      unsynced += pending.size();
      if (unsynced >= kWritebackBytes) {
        (void)sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
        unsynced = 0;
      }
      pending.clear();
      lock.lock();
      if (!s.ok()) status = std::move(s);
      busy = false;
      cv.notify_all();
    }
  }

  std::mutex mu;
  std::condition_variable cv;
  std::string pending;  // Being written while |busy|.
  bool busy = false;
  bool stop = false;
  size_t unsynced = 0;  // Written since the last writeback was started.
  Status status;        // The writing thread's first error.
  std::thread thread;   // Last: it starts with the members above ready.
};

OutputSink::OutputSink(int fd, size_t flush_at, Mode mode) : fd_(fd), flush_at_(flush_at) {
  buffer_.reserve(flush_at + (64 << 10));
  if (mode == Mode::kBackground) background_ = std::make_unique<Background>(fd);
}

OutputSink::~OutputSink() { (void)Flush(); }

void OutputSink::Handoff() {
  if (background_ == nullptr) {
    if (status_.ok()) status_ = WriteFd(fd_, buffer_);
    buffer_.clear();
    return;
  }
  Background& b = *background_;
  {
    std::unique_lock<std::mutex> lock(b.mu);
    b.WaitIdle(lock);
    if (status_.ok() && !b.status.ok()) status_ = b.status;
    if (buffer_.empty()) return;
    // |pending| is empty and keeps its capacity: the two buffers alternate.
    std::swap(buffer_, b.pending);
    b.busy = true;
  }
  b.cv.notify_all();
}

Status OutputSink::Flush() {
  Handoff();
  if (background_ != nullptr) {
    Background& b = *background_;
    std::unique_lock<std::mutex> lock(b.mu);
    b.WaitIdle(lock);
    if (status_.ok() && !b.status.ok()) status_ = b.status;
  }
  return status_;
}

void OutputSink::Write(std::string_view text) {
  // A report's batch (~400 KB of text) is written from where it is: copying
  // it into the buffer first was 91 M instructions of the merging thread's
  // 1,060 M in `hvtrace report --threads 1` of bench/large.dat (callgrind).
  constexpr size_t kWriteThrough = 64 << 10;
  if (background_ != nullptr ||
      (text.size() < kWriteThrough && buffer_.size() + text.size() < flush_at_)) {
    buffer_.append(text);
    MaybeFlush();
    return;
  }
  (void)Flush();
  if (status_.ok()) status_ = WriteFd(fd_, text);
}

namespace {

constexpr size_t kQueueDepth = 32;  // Pages in flight per CPU.
// A merge that waits for a CPU's pages is woken when this many are ready
// (or the CPU has no more), not at the first: a merge faster than the
// readers (the first pass of time-of-event names, the Perfetto export)
// was woken once per page, ~7,000 context switches on bench/large.dat.
constexpr size_t kWakeBatch = kQueueDepth / 2;

struct Page {
  std::vector<std::byte> data;
  uint64_t offset = 0;  // In the file (or decompressed stream), for messages.
};

// One CPU's pages, produced by a reader thread and consumed by the merge.
class CpuStream {
 public:
  CpuStream(std::string path, size_t index, uint32_t cpu)
      : path_(std::move(path)), index_(index), cpu_(cpu) {}
  ~CpuStream() { Stop(); }

  void Start() {
    thread_ = std::thread([this] { Produce(); });
  }
  // Asks the reader to stop early and waits for it.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // Waits for the next page; false at the end of the stream.
  bool Pop(Page* page) {
    std::unique_lock<std::mutex> lock(mu_);
    if (ready_.empty() && !done_) {
      consumer_waiting_ = true;
      cv_.wait(lock, [&] { return ready_.size() >= kWakeBatch || done_; });
      consumer_waiting_ = false;
    }
    if (ready_.empty()) return false;
    if (!page->data.empty()) free_.push_back(std::move(page->data));
    *page = std::move(ready_.front());
    ready_.pop_front();
    const bool wake = producer_waiting_ && ready_.size() <= kQueueDepth / 2;
    lock.unlock();
    if (wake) cv_.notify_all();
    return true;
  }

  // Valid after Pop() returned false.
  const std::vector<TraceDatIssue>& issues() const { return issues_; }
  uint32_t cpu() const { return cpu_; }

 private:
  void Produce() {
    Result<TraceDat> dat = TraceDat::OpenPages(path_);
    if (!dat.ok()) {
      Finish({TraceDatIssue{static_cast<int>(cpu_), 0, dat.error().message}});
      return;
    }
    Status status =
        dat->ForEachPage(index_, [&](std::span<const std::byte> page_copy, uint64_t offset) {
          std::vector<std::byte> buf;
          {
            std::unique_lock<std::mutex> lock(mu_);
            if (ready_.size() >= kQueueDepth && !stop_) {
              // Full: sleep until the merge has taken half (Pop), not
              // until the next page: one wake-up per kQueueDepth / 2 pages.
              producer_waiting_ = true;
              cv_.wait(lock, [&] { return ready_.size() <= kQueueDepth / 2 || stop_; });
              producer_waiting_ = false;
            }
            if (stop_) return false;
            if (!free_.empty()) {
              buf = std::move(free_.back());
              free_.pop_back();
            }
          }
          buf.assign(page_copy.begin(), page_copy.end());
          bool wake = false;
          {
            std::lock_guard<std::mutex> lock(mu_);
            ready_.push_back(Page{std::move(buf), offset});
            wake = consumer_waiting_ && ready_.size() >= kWakeBatch;
          }
          if (wake) cv_.notify_all();
          return true;
        });
    std::vector<TraceDatIssue> issues = dat->issues();
    if (!status.ok())
      issues.push_back(TraceDatIssue{static_cast<int>(cpu_), 0, status.error().message});
    Finish(std::move(issues));
  }

  void Finish(std::vector<TraceDatIssue> issues) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      issues_ = std::move(issues);
      done_ = true;
    }
    cv_.notify_all();
  }

  const std::string path_;
  const size_t index_;
  const uint32_t cpu_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Page> ready_;
  std::vector<std::vector<std::byte>> free_;
  bool done_ = false;
  bool stop_ = false;
  // Who sleeps on cv_: the queue wakes the other side only then. Waking on
  // every page cost two futex calls and a context switch per 4 KiB page
  // (12% of `hvtrace report` on bench/large.dat in perf, 2026-11-25).
  bool producer_waiting_ = false;
  bool consumer_waiting_ = false;
  std::vector<TraceDatIssue> issues_;
};

// The merge's view of one CPU: the current page and its next record.
struct CpuCursor {
  std::unique_ptr<CpuStream> stream;
  Page page;
  std::optional<PageCursor> cursor;
  bool first_in_page = false;
  bool has_record = false;
  RawRecord record;
  int64_t missed = 0;
};

std::string PageIssue(const std::string& path, uint32_t cpu, const Page& page,
                      const PageCursor& cursor) {
  return path + ": CPU " + std::to_string(cpu) + ": page at offset " + std::to_string(page.offset) +
         ": " + PageErrorName(cursor.error()) + " at page offset " +
         std::to_string(cursor.error_offset()) + "; rest of the page skipped";
}

// Calls |on_record| for every record of |path| in trace-cmd's merge order
// until it returns false. Page problems are counted in |stats| and issues
// handed to |add_issue| when |stats| is not null (the first pass of
// time-of-event names reads the same pages and says nothing).
// The CPU streams of |path|, their readers started.
std::vector<std::unique_ptr<CpuStream>> StartStreams(const std::string& path, const TraceDat& dat) {
  std::vector<std::unique_ptr<CpuStream>> streams;
  for (size_t i = 0; i < dat.cpus().size(); ++i) {
    streams.push_back(std::make_unique<CpuStream>(path, i, dat.cpus()[i].cpu));
    streams.back()->Start();
  }
  return streams;
}

// |streams|: from StartStreams(path, dat).
template <typename F>
void MergeRecords(const std::string& path, const TraceDat& dat, const PageLayout& layout,
                  std::vector<std::unique_ptr<CpuStream>> streams, ReportStats* stats,
                  const std::function<void(const TraceDatIssue&)>& add_issue, F&& on_record) {
  const int64_t ts_offset = dat.timestamp_offset();
  std::vector<CpuCursor> cpus(streams.size());
  for (size_t i = 0; i < cpus.size(); ++i) cpus[i].stream = std::move(streams[i]);

  // Moves |c| to its next record; false when the CPU has no more.
  auto advance = [&](CpuCursor& c) {
    for (;;) {
      if (c.cursor && c.cursor->Next(&c.record)) {
        c.missed = 0;
        // trace-cmd (kbuffer_missed_events) reports a page's missed events
        // with its first record, and only when that record is at the very
        // start of the data (not after a time extend).
        if (c.first_in_page && c.cursor->header().missed_events &&
            c.record.offset == layout.data_offset) {
          c.missed = c.cursor->header().missed_stored
                         ? static_cast<int64_t>(c.cursor->missed_count())
                         : -1;
        }
        c.first_in_page = false;
        c.has_record = true;
        return true;
      }
      if (c.cursor && c.cursor->error() != PageError::kOk && stats != nullptr) {
        stats->bad_pages++;
        stats->issues.push_back(PageIssue(path, c.stream->cpu(), c.page, *c.cursor));
      }
      c.cursor.reset();
      if (!c.stream->Pop(&c.page)) {
        c.has_record = false;
        return false;
      }
      if (stats != nullptr) stats->pages++;
      c.cursor.emplace(std::span<const std::byte>(c.page.data), layout);
      c.first_in_page = true;
    }
  };
  for (CpuCursor& c : cpus) advance(c);

  for (;;) {
    CpuCursor* next = nullptr;
    for (CpuCursor& c : cpus) {
      if (c.has_record && (next == nullptr || c.record.timestamp < next->record.timestamp))
        next = &c;
    }
    if (next == nullptr) break;
    DecodedRecord rec;
    rec.cpu = next->stream->cpu();
    rec.timestamp = next->record.timestamp + static_cast<uint64_t>(ts_offset);
    rec.payload = next->record.payload;
    rec.missed_events = next->missed;
    if (!on_record(rec)) break;
    advance(*next);
  }
  for (CpuCursor& c : cpus) {
    c.stream->Stop();
    if (stats == nullptr) continue;
    for (const TraceDatIssue& issue : c.stream->issues()) add_issue(issue);
  }
}

// The layout of |dat|'s pages; the default one (and an issue in |stats|)
// when its header_page cannot be read.
PageLayout LayoutOf(const TraceDat& dat, const std::string& path, ReportStats* stats) {
  Result<PageLayout> l = PageLayout::FromHeaderPage(dat.header_page(), dat.page_size());
  if (l.ok()) return *l;
  stats->issues.push_back(path + ": " + l.error().message + "; using the default page layout");
  PageLayout layout;
  layout.page_size = dat.page_size();
  return layout;
}

// ReportOptions::leave_to_exit: what a report made that the process's exit
// may take back instead of free(), but the trial child, which is ended now.
// A static pointer keeps it reachable: no leak to LeakSanitizer, and no
// destructor at exit.
void LeaveToExit(std::unique_ptr<EventDecoder> decoder, TraceDat dat,
                 std::shared_ptr<const TraceMetadata> metadata) {
  struct Left {
    std::unique_ptr<EventDecoder> decoder;
    TraceDat dat;
    std::shared_ptr<const TraceMetadata> metadata;
  };
  static auto* const left = new std::vector<Left>();
  decoder->KeepTrialChild(false);
  left->push_back(Left{std::move(decoder), std::move(dat), std::move(metadata)});
}

// The report of |path|: |out.Begin(metadata)| (before the decoder is made,
// which takes a while), |out.Start(decoder, cpus)|, then
// |out.Record(rec)| for every record in order (after the first pass that
// learns names as they were at the time), then |out.End(&stats)|. Start and
// Record return false to stop.
template <typename Out>
Result<ReportStats> Report(const std::string& path, const ReportOptions& options, Out& out) {
  Result<TraceDat> dat =
      options.symbols ? TraceDat::Open(path) : TraceDat::OpenWithoutSymbols(path);
  if (!dat.ok()) return dat.error();
  ReportStats stats;
  std::set<std::tuple<int, uint64_t, std::string>> seen_issues;
  auto add_issue = [&](const TraceDatIssue& issue) {
    if (!seen_issues.emplace(issue.cpu, issue.offset, issue.message).second) return;
    std::string where = path;
    if (issue.cpu >= 0) where += ": CPU " + std::to_string(issue.cpu);
    where += ": offset " + std::to_string(issue.offset);
    // TraceDat messages usually name the file already; do not repeat it.
    if (issue.message.starts_with(path)) {
      stats.issues.push_back(issue.message);
    } else {
      stats.issues.push_back(where + ": " + issue.message);
    }
  };
  for (const TraceDatIssue& issue : dat->issues()) add_issue(issue);

  // The readers open the file and decompress its first pages while the
  // decoder is made (EventDecoder::Create: ~40 ms on bench/large.dat, which
  // the first record used to wait for on top).
  std::vector<std::unique_ptr<CpuStream>> streams = StartStreams(path, *dat);
  // Shared: the printing threads may outlive this function on an early return.
  // It takes |dat|'s kallsyms and formats (no copies): metadata->formats below.
  TraceMetadata file_metadata = TraceMetadataFrom(&*dat);
  if (!options.symbols) {
    // Turning kallsyms into symbol tables was ~30 ms of the decoder's
    // making on bench/large.dat, for a writer that prints no event text
    // (a v6 file has them still: OpenWithoutSymbols skips v7 sections).
    file_metadata.kallsyms.clear();
    file_metadata.printk_formats.clear();
  }
  auto metadata = std::make_shared<const TraceMetadata>(std::move(file_metadata));
  out.Begin(metadata);
  const PageLayout layout = LayoutOf(*dat, path, &stats);

  // Names as they were at the time: a first pass over the records learns
  // what the trace says about each pid (TaskNameTimeline). It needs only
  // the formats, so it runs on a thread of its own while the decoder is
  // made. It reports nothing (|stats| null); the jthread joins on every
  // return.
  std::optional<TaskNameTimeline> names;
  std::jthread first_pass;
  if (options.time_names) {
    names.emplace(metadata->formats);
    if (!names->usable()) {
      names.reset();
    } else {
      first_pass = std::jthread([&] {
        MergeRecords(path, *dat, layout, StartStreams(path, *dat), nullptr, add_issue,
                     [&](const DecodedRecord& rec) {
                       names->Scan(rec.payload);
                       return true;
                     });
        names->StartNaming();
      });
    }
  }
  Result<std::unique_ptr<EventDecoder>> decoder = EventDecoder::Create(*metadata);
  if (!decoder.ok()) return decoder.error();
  (*decoder)->SetFastPathsEnabled(options.fast_paths);
  (*decoder)->KeepTrialChild(true);  // Ends with the report.
  if (first_pass.joinable()) first_pass.join();
  EventDecoder& dec = **decoder;
  if (!out.Start(dec, dat->cpus().size())) return stats;
  MergeRecords(path, *dat, layout, std::move(streams), &stats, add_issue, [&](DecodedRecord& rec) {
    if (names) rec.comm = names->Next(rec.payload);
    stats.events++;
    return out.Record(rec);
  });
  if (Status s = out.End(&stats); !s.ok()) return Error{path + ": " + s.error().message};
  // Formats reach libtraceevent on first use, so its warnings come last.
  for (const std::string& w : dec.warnings()) stats.issues.push_back(w);
  if (options.leave_to_exit) LeaveToExit(std::move(*decoder), std::move(*dat), std::move(metadata));
  return stats;
}

// WriteReport's consumer: the header line, then ReportPrinter.
class ReportWriter {
 public:
  ReportWriter(const ReportOptions& options, int fd) : options_(options), sink_(fd) {}
  // The printing threads make their decoders while the caller makes its own.
  void Begin(std::shared_ptr<const TraceMetadata> metadata) {
    const unsigned threads = options_.threads >= 0 ? static_cast<unsigned>(options_.threads)
                                                   : ReportPrinter::DefaultThreads();
    printer_.emplace(std::move(metadata), options_.format, threads, options_.batch_records, sink_);
  }
  bool Start(EventDecoder& decoder, size_t cpus) {
    if (options_.format == OutputFormat::kText && options_.header) {
      sink_.Write("cpus=" + std::to_string(cpus) + "\n");
    }
    printer_->SetLeader(decoder);
    return true;
  }
  bool Record(const DecodedRecord& rec) { return printer_->Add(rec); }
  Status End(ReportStats* stats) {
    if (!printer_) return sink_.Flush();
    Status s = printer_->Finish();
    stats->fast_path_events = printer_->fast_path_events();
    return s;
  }

 private:
  const ReportOptions& options_;
  OutputSink sink_;
  std::optional<ReportPrinter> printer_;
};

// ForEachReportLine's consumer: one line at a time, on the calling thread.
class LineReader {
 public:
  LineReader(const ReportOptions& options, const ReportLineFn& on_event)
      : options_(options), on_event_(on_event) {}
  void Begin(const std::shared_ptr<const TraceMetadata>&) {}
  bool Start(EventDecoder& decoder, size_t) {
    decoder_ = &decoder;
    return true;
  }
  bool Record(const DecodedRecord& rec) {
    line_.clear();
    if (options_.format == OutputFormat::kText) {
      decoder_->AppendText(rec, &line_);
    } else {
      decoder_->AppendJson(rec, &line_);
    }
    return on_event_(rec.timestamp, line_);
  }
  Status End(ReportStats* stats) {
    if (decoder_ != nullptr) stats->fast_path_events = decoder_->fast_path_count();
    return {};
  }

 private:
  const ReportOptions& options_;
  const ReportLineFn& on_event_;
  EventDecoder* decoder_ = nullptr;
  std::string line_;
};

// ForEachRecord's consumer: the records as they are.
class RecordReader {
 public:
  RecordReader(const RecordStartFn& on_start, const RecordFn& on_record)
      : on_start_(on_start), on_record_(on_record) {}
  void Begin(std::shared_ptr<const TraceMetadata> metadata) { metadata_ = std::move(metadata); }
  bool Start(EventDecoder& decoder, size_t) { return on_start_(*metadata_, decoder); }
  bool Record(const DecodedRecord& rec) { return on_record_(rec); }
  Status End(ReportStats*) { return {}; }

 private:
  const RecordStartFn& on_start_;
  const RecordFn& on_record_;
  std::shared_ptr<const TraceMetadata> metadata_;
};

}  // namespace

Result<ReportStats> WriteReport(const std::string& path, const ReportOptions& options, int out_fd) {
  ReportWriter writer(options, out_fd);
  return Report(path, options, writer);
}

Result<ReportStats> ForEachReportLine(const std::string& path, const ReportOptions& options,
                                      const ReportLineFn& on_event) {
  LineReader reader(options, on_event);
  return Report(path, options, reader);
}

Result<ReportStats> ForEachRecord(const std::string& path, const ReportOptions& options,
                                  const RecordStartFn& on_start, const RecordFn& on_record) {
  RecordReader reader(on_start, on_record);
  return Report(path, options, reader);
}

}  // namespace hvtrace
