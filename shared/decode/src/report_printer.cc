// ReportPrinter (report_printer.h).
//
// Measured on a 1.37 M-event trace.dat (bench/decode_bench.sh, bench/README.md):
// on 2 vCPUs printing threads hardly shorten the report, even since they
// share the leader's formats and symbols (a follower costs ~nothing to make)
// and the merging thread prints too: the merging thread, its CPU readers and
// one printing thread then keep both CPUs busy, and the batches' copies add
// ~10 % of CPU (2026-12-04, 20 interleaved runs: --threads 0 median 227 ms,
// --threads 1 220 ms), hence DefaultThreads().
#include "report_printer.h"

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>

namespace hvtrace {
namespace {

// A batch is handed over when it holds this many records or this many
// payload bytes (a hostile file may hold records of up to a page each).
constexpr size_t kBatchRecords = 4096;
constexpr size_t kBatchPayloadBytes = 4 << 20;
constexpr unsigned kMaxThreads = 16;

}  // namespace

struct ReportPrinter::Batch {
  struct Item {
    uint32_t cpu = 0;
    uint64_t timestamp = 0;
    int64_t missed_events = 0;
    const char* comm = nullptr;          // Resolved by the leader (PrepareText/Json).
    size_t comm_at = std::string::npos;  // Or a copy in |comms|.
    size_t payload_at = 0, payload_size = 0;
    // The leader printed the record itself (|ordered|); npos: a worker prints it.
    size_t text_at = std::string::npos, text_size = 0;
  };
  std::vector<Item> items;
  std::vector<std::byte> payloads;  // Copies: the merge reuses its pages.
  std::string ordered;
  // Names that came with the record (time names): their storage is reused
  // before the batch is printed, so they are copied ('\0'-terminated).
  std::string comms;
  std::string text;  // The batch's output, once printed.
  bool printed = false;

  void Clear() {
    items.clear();
    payloads.clear();
    ordered.clear();
    comms.clear();
    text.clear();
    printed = false;
  }
};

unsigned ReportPrinter::DefaultThreads() {
  // The merging thread and the per-CPU readers keep more than one CPU
  // busy. On 2 CPUs a printing thread saved 3 % of the wall time for 10 %
  // more CPU (bench/README.md, decode_bench.sh), so they are used from 4
  // CPUs on, one per CPU but the merging thread's.
  const unsigned cpus = std::thread::hardware_concurrency();
  return cpus >= 4 ? std::min(cpus - 1, kMaxThreads) : 0;
}

ReportPrinter::ReportPrinter(std::shared_ptr<const TraceMetadata> metadata, OutputFormat format,
                             unsigned threads, size_t batch_records, OutputSink& sink)
    : metadata_(std::move(metadata)),
      format_(format),
      sink_(sink),
      batch_records_(batch_records != 0 ? batch_records : kBatchRecords),
      filling_(std::make_unique<Batch>()),
      max_in_flight_(2 * std::min(threads, kMaxThreads) + 2) {
  for (unsigned i = 0; i < std::min(threads, kMaxThreads); ++i) {
    workers_.emplace_back([this] { Work(); });
  }
}

ReportPrinter::~ReportPrinter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

bool ReportPrinter::Add(DecodedRecord record) {
  if (workers_.empty()) {
    // Printed at once, straight into the sink's buffer: the batch's copies
    // of the payload and of the text were there for the workers. On
    // bench/large.dat (no workers on 2 CPUs) that copied ~120 MB of text
    // and 1.37M payloads. Record by record is the order a batch gives too;
    // Prepare* is not needed: Append* loads the format and finds the task
    // name itself when the record has none.
    std::string* out = sink_.buffer();
    if (format_ == OutputFormat::kText) {
      leader_->AppendText(record, out);
    } else {
      leader_->AppendJson(record, out);
    }
    sink_.MaybeFlush();
    ok_ = sink_.status().ok();
    return ok_;
  }
  Batch& b = *filling_;
  Batch::Item item;
  item.cpu = record.cpu;
  item.timestamp = record.timestamp;
  item.missed_events = record.missed_events;
  if (record.comm != nullptr) {
    item.comm_at = b.comms.size();
    b.comms.append(record.comm);
    b.comms.push_back('\0');
  }
  if (format_ == OutputFormat::kText) {
    if (leader_->PrepareText(&record)) {
      item.text_at = b.ordered.size();
      leader_->AppendText(record, &b.ordered);
      item.text_size = b.ordered.size() - item.text_at;
    }
  } else {
    leader_->PrepareJson(&record);
  }
  if (item.comm_at == std::string::npos) item.comm = record.comm;  // The leader's: stable.
  if (item.text_at == std::string::npos) {
    item.payload_at = b.payloads.size();
    item.payload_size = record.payload.size();
    b.payloads.insert(b.payloads.end(), record.payload.begin(), record.payload.end());
  }
  b.items.push_back(item);
  if (b.items.size() >= batch_records_ || b.payloads.size() >= kBatchPayloadBytes) Submit();
  return ok_;
}

void ReportPrinter::Submit() {
  if (filling_->items.empty()) return;
  if (workers_.empty()) {
    Print(*leader_, *filling_);
    sink_.Write(filling_->text);
    filling_->Clear();
    ok_ = sink_.status().ok();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(filling_));
    if (!spare_.empty()) {
      filling_ = std::move(spare_.back());
      spare_.pop_back();
    }
  }
  work_cv_.notify_one();
  if (filling_ == nullptr) filling_ = std::make_unique<Batch>();
  WriteDone(max_in_flight_);
}

void ReportPrinter::WriteDone(size_t keep) {
  for (;;) {
    std::unique_ptr<Batch> head;
    Batch* help = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // While the queue is too long and its head not printed, this thread
      // prints the next batch no worker has taken instead of waiting: on
      // 2 CPUs one worker and this thread then share the printing (the
      // merge alone does not keep a CPU busy). Otherwise the head is taken
      // only when it is ready.
      done_cv_.wait(lock, [&] {
        return queue_.empty() || queue_.front()->printed || queue_.size() < keep ||
               next_to_print_ < queue_.size() || !worker_status_.ok();
      });
      ok_ = sink_.status().ok() && worker_status_.ok();
      if (queue_.empty() || !ok_) return;
      if (queue_.front()->printed) {
        head = std::move(queue_.front());
        queue_.pop_front();
        --next_to_print_;
      } else if (queue_.size() < keep) {
        return;
      } else {
        help = queue_[next_to_print_++].get();
      }
    }
    if (help != nullptr) {
      Print(*leader_, *help);
      {
        std::lock_guard<std::mutex> lock(mu_);
        help->printed = true;
      }
      continue;
    }
    sink_.Write(head->text);
    head->Clear();
    std::lock_guard<std::mutex> lock(mu_);
    spare_.push_back(std::move(head));
  }
}

Status ReportPrinter::Finish() {
  Submit();
  if (!workers_.empty()) {
    // keep = 1: wait for each head in turn until the queue is empty.
    for (;;) {
      WriteDone(1);
      if (!ok_) break;  // The output or a worker failed: the rest is dropped.
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) break;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }
  if (!worker_status_.ok()) return worker_status_;
  return sink_.Flush();
}

uint64_t ReportPrinter::fast_path_events() const {
  return leader_->fast_path_count() + worker_fast_paths_;
}

void ReportPrinter::Work() {
  // Made at the first batch, from the leader (set before the first batch
  // was queued, under mu_): a follower shares its parsed formats and
  // symbols and costs little to make.
  std::optional<Result<std::unique_ptr<EventDecoder>>> decoder;
  for (;;) {
    Batch* batch = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || next_to_print_ < queue_.size(); });
      if (stop_) break;
      batch = queue_[next_to_print_++].get();
    }
    if (!decoder) decoder.emplace(EventDecoder::CreateFollower(*leader_, *metadata_));
    if (decoder->ok()) Print(***decoder, *batch);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!decoder->ok() && worker_status_.ok()) worker_status_ = decoder->error();
      batch->printed = true;
    }
    done_cv_.notify_one();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (decoder && decoder->ok()) worker_fast_paths_ += (**decoder)->fast_path_count();
}

void ReportPrinter::Print(EventDecoder& decoder, Batch& batch) const {
  std::string& out = batch.text;
  out.clear();
  for (const Batch::Item& item : batch.items) {
    if (item.text_at != std::string::npos) {
      out.append(batch.ordered, item.text_at, item.text_size);
      continue;
    }
    DecodedRecord r;
    r.cpu = item.cpu;
    r.timestamp = item.timestamp;
    r.payload =
        std::span<const std::byte>(batch.payloads).subspan(item.payload_at, item.payload_size);
    r.missed_events = item.missed_events;
    r.comm = item.comm_at != std::string::npos ? batch.comms.c_str() + item.comm_at : item.comm;
    if (format_ == OutputFormat::kText) {
      decoder.AppendText(r, &out);
    } else {
      decoder.AppendJson(r, &out);
    }
  }
}

}  // namespace hvtrace
