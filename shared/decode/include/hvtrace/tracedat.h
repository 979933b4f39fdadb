// Reader for trace-cmd's trace.dat, versions 6 and 7 (see man 5
// trace-cmd.dat.v6 / trace-cmd.dat.v7). Version 7 sections and the flyrecord
// trace data may be compressed (zlib or zstd); the reader decompresses them.
//
// The file is untrusted input: every offset and size is checked against the
// file size, counts are capped, and a bad CPU stream is reported (file, CPU,
// offset) while the other CPUs are still read.
#ifndef HVTRACE_TRACEDAT_H_
#define HVTRACE_TRACEDAT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "hvtrace/result.h"

namespace hvtrace {

// A format file's text and the system it belongs to ("ftrace" for the
// built-in ftrace events of the header section).
struct FormatText {
  std::string system;
  std::string text;
  // Set only by a caller that ran exactly |text| through
  // EventDecoder::TrialParseAll and kept the verdict with it: a decoder given
  // it skips its own trial run (a fork) for this format.
  bool trial_passed = false;
};

// One CPU's flyrecord data in the file.
struct TraceDatCpu {
  uint32_t cpu = 0;
  uint64_t offset = 0;  // In the file (v7 compressed: start of the chunks).
  uint64_t size = 0;
};

// A problem found while reading; reading goes on past it where it can.
struct TraceDatIssue {
  int cpu = -1;         // -1 when not about one CPU.
  uint64_t offset = 0;  // File offset (or offset in the decompressed stream).
  std::string message;
};

class TraceDat {
 public:
  // Opens and reads the metadata of |path| (the trace data itself is read by
  // ForEachPage). Fails with a message naming the file and offset.
  static Result<TraceDat> Open(const std::string& path);
  // The same for a reader of pages only (ForEachPage, cpus(), issues()): a
  // v7 file's formats, kallsyms, printk formats and cmdlines sections are not
  // read (their accessors return nothing). `hvtrace report` opens the file
  // once more per CPU; decompressing and parsing those sections for each
  // was ~10 ms of CPU apiece on bench/large.dat (5.4 MB of kallsyms).
  static Result<TraceDat> OpenPages(const std::string& path);
  // The same as Open() without a v7 file's kallsyms and printk formats
  // sections (their accessors return nothing): for readers that print no
  // symbols. Decompressing and copying them was 20-40 ms on bench/large.dat.
  static Result<TraceDat> OpenWithoutSymbols(const std::string& path);
  // The same from bytes in memory (fuzzing, data received over a socket);
  // |name| stands for the file name in messages.
  static Result<TraceDat> OpenBuffer(std::vector<std::byte> data, const std::string& name);

  // Caps on what a file may make us allocate or loop over.
  static constexpr uint64_t kMaxSectionSize = 64ull << 20;  // Decompressed metadata.
  static constexpr uint64_t kMaxChunkSize = 64ull << 20;    // One decompressed data chunk.
  static constexpr uint32_t kMaxCpus = 8192;
  static constexpr uint32_t kMaxPageSize = 16u << 20;
  static constexpr uint32_t kMaxFormats = 100000;

  TraceDat(TraceDat&&) noexcept;
  TraceDat& operator=(TraceDat&&) noexcept;
  ~TraceDat();

  const std::string& path() const;
  int version() const;
  bool big_endian() const;
  uint32_t long_size() const;
  uint32_t page_size() const;              // Sub-buffer size of the trace data.
  const std::string& compression() const;  // "none", "zstd", "zlib".

  const std::string& header_page() const;          // events/header_page text
  const std::string& header_event() const;         // events/header_event text
  const std::vector<FormatText>& formats() const;  // ftrace + event formats
  const std::string& kallsyms() const;             // /proc/kallsyms text (may be empty)
  const std::string& printk_formats() const;       // printk_formats text (may be empty)
  const std::string& cmdlines() const;             // saved_cmdlines text: "pid comm\n"
  const std::string& trace_clock() const;          // The clock in use, e.g. "local".
  // Move the kallsyms text and the formats out (their accessors return
  // nothing after): the largest texts (5.4 and 2 MB on bench/large.dat),
  // for a caller that hands them on (TraceMetadataFrom) instead of copying.
  std::string ReleaseKallsyms();
  std::vector<FormatText> ReleaseFormats();
  // Time offset to add to every time stamp (trace-cmd's TSC/guest offset
  // options); 0 when the file has none.
  int64_t timestamp_offset() const;

  const std::vector<TraceDatCpu>& cpus() const;  // Top instance, in file order.
  // Whether the flyrecord data is in compressed chunks (v7 only).
  bool data_compressed() const;
  // Names of the other instances (BUFFER options) in the file; their data is
  // not read.
  const std::vector<std::string>& instances() const;

  // Calls |on_page(page_copy, offset)| for every page of CPU index |cpu_index|
  // (into cpus()), in order. |page_copy| is a private copy of page_size()
  // bytes, valid for the call. |offset| is the page's file offset, or for
  // compressed data its offset in the CPU's decompressed stream. Return false from |on_page| to
  // stop. Problems are appended to issues() and the walk continues where it can.
  Status ForEachPage(
      size_t cpu_index,
      const std::function<bool(std::span<const std::byte> page_copy, uint64_t offset)>& on_page);

  const std::vector<TraceDatIssue>& issues() const;

 private:
  struct Impl;
  explicit TraceDat(std::unique_ptr<Impl> impl);
  static Result<TraceDat> Open(const std::string& path, bool pages_only, bool symbols);
  static Result<TraceDat> Load(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hvtrace

#endif  // HVTRACE_TRACEDAT_H_
