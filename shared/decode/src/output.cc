// OutputSink and WriteReport (hvtrace/output.h).
//
// Reading: one thread per CPU stream opens its own TraceDat and pushes page
// copies into a small bounded queue (TraceDat::ForEachPage is a push
// interface; the queue turns it into the pull that a k-way merge needs,
// keeping memory bounded and decompression off the printing thread). The
// printing thread walks each page with the bounds-checked PageCursor and
// merges the CPUs by time stamp exactly as trace-cmd's
// tracecmd_iterate_events_multi does: the smallest time stamp wins, ties go
// to the CPU that comes first in the file.
#include "hvtrace/output.h"

#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <type_traits>

#include "hvtrace/decoder.h"
#include "hvtrace/page.h"
#include "hvtrace/task_names.h"
#include "hvtrace/tracedat.h"

namespace hvtrace {

OutputSink::OutputSink(int fd, size_t flush_at) : fd_(fd), flush_at_(flush_at) {
  buffer_.reserve(flush_at + (64 << 10));
}

OutputSink::~OutputSink() { (void)Flush(); }

Status OutputSink::Flush() {
  size_t done = 0;
  while (status_.ok() && done < buffer_.size()) {
    ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      status_ = Error{std::string("write to output failed: ") + std::strerror(errno)};
      break;
    }
    done += static_cast<size_t>(n);
  }
  buffer_.clear();
  return status_;
}

namespace {

constexpr size_t kQueueDepth = 32;  // Pages in flight per CPU.

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
    cv_.wait(lock, [&] { return !ready_.empty() || done_; });
    if (ready_.empty()) return false;
    if (!page->data.empty()) free_.push_back(std::move(page->data));
    *page = std::move(ready_.front());
    ready_.pop_front();
    cv_.notify_all();
    return true;
  }

  // Valid after Pop() returned false.
  const std::vector<TraceDatIssue>& issues() const { return issues_; }
  uint32_t cpu() const { return cpu_; }

 private:
  void Produce() {
    Result<TraceDat> dat = TraceDat::Open(path_);
    if (!dat.ok()) {
      Finish({TraceDatIssue{static_cast<int>(cpu_), 0, dat.error().message}});
      return;
    }
    Status status =
        dat->ForEachPage(index_, [&](std::span<const std::byte> page_copy, uint64_t offset) {
          std::vector<std::byte> buf;
          {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return ready_.size() < kQueueDepth || stop_; });
            if (stop_) return false;
            if (!free_.empty()) {
              buf = std::move(free_.back());
              free_.pop_back();
            }
          }
          buf.assign(page_copy.begin(), page_copy.end());
          {
            std::lock_guard<std::mutex> lock(mu_);
            ready_.push_back(Page{std::move(buf), offset});
          }
          cv_.notify_all();
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
template <typename F>
void MergeRecords(const std::string& path, const TraceDat& dat, const PageLayout& layout,
                  ReportStats* stats, const std::function<void(const TraceDatIssue&)>& add_issue,
                  F&& on_record) {
  const int64_t ts_offset = dat.timestamp_offset();
  std::vector<CpuCursor> cpus(dat.cpus().size());
  for (size_t i = 0; i < cpus.size(); ++i) {
    cpus[i].stream = std::make_unique<CpuStream>(path, i, dat.cpus()[i].cpu);
    cpus[i].stream->Start();
  }

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

// The report of |path|: |emit(rec, decoder)| for every record in order,
// after the first pass that learns names as they were at the time. Returns
// the stats; |emit| returns false to stop.
template <typename F>
Result<ReportStats> Report(const std::string& path, const ReportOptions& options, F&& emit) {
  Result<TraceDat> dat = TraceDat::Open(path);
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

  TraceMetadata metadata = TraceMetadataFrom(*dat);
  Result<std::unique_ptr<EventDecoder>> decoder = EventDecoder::Create(metadata);
  if (!decoder.ok()) return decoder.error();
  (*decoder)->SetFastPathsEnabled(options.fast_paths);

  PageLayout layout;
  if (Result<PageLayout> l = PageLayout::FromHeaderPage(dat->header_page(), dat->page_size());
      l.ok()) {
    layout = *l;
  } else {
    stats.issues.push_back(path + ": " + l.error().message + "; using the default page layout");
    layout.page_size = dat->page_size();
  }

  // Names as they were at the time: a first pass over the records learns
  // what the trace says about each pid (TaskNameTimeline).
  std::optional<TaskNameTimeline> names;
  if (options.time_names) {
    names.emplace(dat->formats());
    if (!names->usable()) {
      names.reset();
    } else {
      MergeRecords(path, *dat, layout, nullptr, add_issue, [&](const DecodedRecord& rec) {
        names->Scan(rec.payload);
        return true;
      });
      names->StartNaming();
    }
  }
  if (!emit(nullptr, dat->cpus().size())) return stats;
  EventDecoder& dec = **decoder;
  MergeRecords(path, *dat, layout, &stats, add_issue, [&](DecodedRecord& rec) {
    if (names) rec.comm = names->Next(rec.payload);
    stats.events++;
    return emit(&rec, dec);
  });
  stats.fast_path_events = dec.fast_path_count();
  // Formats reach libtraceevent on first use, so its warnings come last.
  for (const std::string& w : dec.warnings()) stats.issues.push_back(w);
  return stats;
}

}  // namespace

Result<ReportStats> WriteReport(const std::string& path, const ReportOptions& options, int out_fd) {
  OutputSink sink(out_fd);
  Result<ReportStats> stats =
      Report(path, options, [&](const DecodedRecord* rec, auto&& dec_or_cpus) {
        if constexpr (std::is_same_v<std::decay_t<decltype(dec_or_cpus)>, EventDecoder>) {
          if (options.format == OutputFormat::kText) {
            dec_or_cpus.AppendText(*rec, sink.buffer());
          } else {
            dec_or_cpus.AppendJson(*rec, sink.buffer());
          }
          sink.MaybeFlush();
          return sink.status().ok();
        } else {
          if (options.format == OutputFormat::kText && options.header) {
            sink.buffer()->append("cpus=" + std::to_string(dec_or_cpus) + "\n");
          }
          return true;
        }
      });
  if (!stats.ok()) return stats;
  if (Status s = sink.Flush(); !s.ok()) return Error{path + ": " + s.error().message};
  return stats;
}

Result<ReportStats> ForEachReportLine(const std::string& path, const ReportOptions& options,
                                      const ReportLineFn& on_event) {
  std::string line;
  return Report(path, options, [&](const DecodedRecord* rec, auto&& dec_or_cpus) {
    if constexpr (std::is_same_v<std::decay_t<decltype(dec_or_cpus)>, EventDecoder>) {
      line.clear();
      if (options.format == OutputFormat::kText) {
        dec_or_cpus.AppendText(*rec, &line);
      } else {
        dec_or_cpus.AppendJson(*rec, &line);
      }
      return on_event(rec->timestamp, line);
    } else {
      return true;
    }
  });
}

}  // namespace hvtrace
