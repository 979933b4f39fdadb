// ReportPrinter: prints a report's records, already in their final order, on
// worker threads and writes the text in that order.
//
// The calling thread prepares each record on the leader decoder
// (EventDecoder::PrepareText / PrepareJson: task name, first-use format
// loading, and the few events whose printing changes later text, which it
// prints itself), copies it into a batch, and hands full batches to the
// workers. Each worker prints whole batches with its own follower decoder
// (libtraceevent's handle is not thread-safe; EventDecoder::CreateFollower);
// while the queue is full the calling thread prints batches too. Batches
// are written in the order they were filled, so the output does not depend
// on the number of threads or on their timing.
#ifndef HVTRACE_SHARED_DECODE_SRC_REPORT_PRINTER_H_
#define HVTRACE_SHARED_DECODE_SRC_REPORT_PRINTER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "hvtrace/decoder.h"
#include "hvtrace/output.h"

namespace hvtrace {

class ReportPrinter {
 public:
  // Starts |threads| workers (0: the calling thread prints everything),
  // which make their decoders from the leader and |metadata| at their
  // first batch; batches of |batch_records| (0: the default).
  ReportPrinter(std::shared_ptr<const TraceMetadata> metadata, OutputFormat format,
                unsigned threads, size_t batch_records, OutputSink& sink);
  ~ReportPrinter();  // Stops the workers; unwritten batches are dropped.
  ReportPrinter(const ReportPrinter&) = delete;
  ReportPrinter& operator=(const ReportPrinter&) = delete;

  // The leader decoder (made from the same metadata), before the first
  // Add(); it must outlive the printer.
  void SetLeader(EventDecoder& leader) { leader_ = &leader; }
  // Prints |record| after every record added before it. False once the
  // output failed (the sink's status says why).
  bool Add(DecodedRecord record);
  // Prints and writes everything added; the sink's status.
  Status Finish();
  // Events printed by compiled printers, over all decoders (after Finish).
  uint64_t fast_path_events() const;

  // The default number of workers: none below 4 CPUs, else one per CPU
  // but the merging thread's.
  static unsigned DefaultThreads();

 private:
  struct Batch;
  void Submit();
  // Writes the finished batches at the head of the queue, first waiting for
  // the head while the queue holds |keep| batches or more.
  void WriteDone(size_t keep);
  void Work();
  void Print(EventDecoder& decoder, Batch& batch) const;

  EventDecoder* leader_ = nullptr;
  const std::shared_ptr<const TraceMetadata> metadata_;
  const OutputFormat format_;
  OutputSink& sink_;
  const size_t batch_records_;
  std::unique_ptr<Batch> filling_;
  size_t max_in_flight_;
  bool ok_ = true;  // The sink and the workers are fine (as of the last Submit).

  std::mutex mu_;
  std::condition_variable work_cv_;           // Workers: a batch to print, or stop.
  std::condition_variable done_cv_;           // The calling thread: a batch printed.
  std::deque<std::unique_ptr<Batch>> queue_;  // In output order.
  size_t next_to_print_ = 0;                  // Index into queue_.
  std::vector<std::unique_ptr<Batch>> spare_;
  bool stop_ = false;
  uint64_t worker_fast_paths_ = 0;
  Status worker_status_;
  std::vector<std::thread> workers_;
};

}  // namespace hvtrace

#endif  // HVTRACE_SHARED_DECODE_SRC_REPORT_PRINTER_H_
