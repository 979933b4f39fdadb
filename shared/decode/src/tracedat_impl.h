// Private to the trace.dat reader, which is two files: tracedat.cc (file
// header, v6 metadata, CPU data, the public API) and tracedat_options.cc
// (options and v7 sections). TraceDat::Impl holds the reader's state and
// everything both files parse with: limits, option ids, the bounds-checked
// cursor and the checked reads from the file.
#ifndef HVTRACE_SHARED_DECODE_SRC_TRACEDAT_IMPL_H_
#define HVTRACE_SHARED_DECODE_SRC_TRACEDAT_IMPL_H_

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include "hvtrace/tracedat.h"

namespace hvtrace {

struct TraceDat::Impl {
  static constexpr char kMagic[] = "\x17\x08\x44tracing";
  static constexpr size_t kMagicSize = 10;
  static constexpr size_t kMaxStringSize = 4096;  // Names, clock and option strings.
  static constexpr uint32_t kMaxOptionsSections = 1024;
  static constexpr uint32_t kMaxSystems = 4096;
  static constexpr uint64_t kMaxFormatSize = 1 << 20;  // One format file.
  static constexpr uint32_t kMaxChunks = 1 << 20;
  static constexpr size_t kReadBlockPages = 256;  // Uncompressed data is read in blocks.

  // Option and section ids (trace-cmd's enum tracecmd_option_id).
  enum : uint16_t {
    kOptDone = 0,
    kOptBuffer = 3,
    kOptTraceClock = 4,
    kOptOffset = 7,
    kOptCpuCount = 8,
    kOptHeaderInfo = 16,
    kOptFtraceEvents = 17,
    kOptEventFormats = 18,
    kOptKallsyms = 19,
    kOptPrintk = 20,
    kOptCmdlines = 21,
  };
  static constexpr uint16_t kSectionCompressed = 1;

  // |v| as "0x..." for messages.
  static std::string Hex(uint64_t v);
  // The clock in use from trace_clock text: "[local] global" -> "local".
  static std::string SelectedClock(std::string_view text);
  // Decompresses |in| (trace.dat's |algorithm| name: zlib or zstd) into
  // exactly |out_size| bytes; a size above |cap| is refused before anything
  // is allocated.
  static Result<std::vector<std::byte>> Decompress(const std::string& algorithm,
                                                   std::span<const std::byte> in, uint64_t out_size,
                                                   uint64_t cap);
  // The same into |*out|, resized to |out_size| (its bytes are overwritten,
  // so a reused buffer is neither reallocated nor cleared).
  static Status DecompressInto(const std::string& algorithm, std::span<const std::byte> in,
                               uint64_t out_size, uint64_t cap, std::vector<std::byte>* out);

  // A failure while parsing metadata; |offset| is where in the file.
  struct ParseError {
    uint64_t offset;
    std::string what;
  };

  // Bounds-checked little-endian reader over bytes we own. |base| is the file
  // offset of data[0] for messages (for decompressed sections: the section).
  class MemCursor {
   public:
    MemCursor(std::span<const std::byte> data, uint64_t base) : data_(data), base_(base) {}

    uint64_t file_offset() const { return base_ + pos_; }
    size_t remaining() const { return data_.size() - pos_; }
    bool at_end() const { return pos_ >= data_.size(); }

    bool Bytes(size_t n, std::span<const std::byte>* out, ParseError* err, const char* what) {
      if (n > remaining()) {
        *err = {file_offset(), std::string(what) + ": " + std::to_string(n) + " bytes, only " +
                                   std::to_string(remaining()) + " left"};
        return false;
      }
      *out = data_.subspan(pos_, n);
      pos_ += n;
      return true;
    }
    template <typename T>
    bool Int(T* v, ParseError* err, const char* what) {
      std::span<const std::byte> b;
      if (!Bytes(sizeof(T), &b, err, what)) return false;
      std::memcpy(v, b.data(), sizeof(T));
      return true;
    }
    bool Text(uint64_t n, std::string* out, ParseError* err, const char* what) {
      std::span<const std::byte> b;
      if (n > remaining()) {
        *err = {file_offset(), std::string(what) + ": size " + std::to_string(n) + " but only " +
                                   std::to_string(remaining()) + " bytes left"};
        return false;
      }
      if (!Bytes(static_cast<size_t>(n), &b, err, what)) return false;
      out->assign(reinterpret_cast<const char*>(b.data()), b.size());
      return true;
    }
    bool CString(std::string* out, ParseError* err, const char* what) {
      size_t limit = std::min(remaining(), kMaxStringSize);
      for (size_t i = 0; i < limit; ++i) {
        if (data_[pos_ + i] == std::byte{0}) {
          out->assign(reinterpret_cast<const char*>(data_.data() + pos_), i);
          pos_ += i + 1;
          return true;
        }
      }
      *err = {file_offset(), std::string(what) + ": string without terminator"};
      return false;
    }
    bool Expect(std::string_view literal, ParseError* err) {
      std::span<const std::byte> b;
      if (!Bytes(literal.size(), &b, err, "marker")) return false;
      if (std::memcmp(b.data(), literal.data(), literal.size()) != 0) {
        *err = {file_offset() - literal.size(),
                "expected \"" + std::string(literal.substr(0, literal.find('\0'))) + "\""};
        return false;
      }
      return true;
    }

   private:
    std::span<const std::byte> data_;
    uint64_t base_;
    size_t pos_ = 0;
  };

  std::string path;
  int fd = -1;
  std::vector<std::byte> memory;
  bool in_memory = false;
  bool pages_only = false;  // OpenPages.
  bool symbols = true;      // False: OpenWithoutSymbols.
  uint64_t file_size = 0;

  int version = 0;
  bool big_endian = false;
  uint32_t long_size = 8;
  uint32_t page_size = 0;
  std::string compression = "none";
  bool data_compressed = false;
  std::string header_page, header_event, kallsyms, printk_formats, cmdlines, trace_clock;
  std::vector<FormatText> formats;
  int64_t timestamp_offset = 0;
  std::vector<TraceDatCpu> cpus;
  std::vector<std::string> instances;
  std::vector<TraceDatIssue> issues;
  bool have_top_buffer = false;

  ~Impl() {
    if (fd >= 0) ::close(fd);
  }

  std::string Where(uint64_t offset) const { return path + " @" + Hex(offset); }
  Error Fail(const ParseError& e) const { return Error{Where(e.offset) + ": " + e.what}; }
  void Issue(int cpu, uint64_t offset, std::string message) {
    // A file can make the same mistake many times; keep the list bounded.
    if (issues.size() < 1000) issues.push_back({cpu, offset, std::move(message)});
  }

  // Copies |n| bytes at |offset| into |dst|. False when the range is outside
  // the file or the read comes up short (the file shrank).
  bool Read(uint64_t offset, void* dst, size_t n) const {
    if (offset > file_size || n > file_size - offset) return false;
    if (n == 0) return true;  // memcpy must not see a null pointer.
    if (in_memory) {
      std::memcpy(dst, memory.data() + offset, n);
      return true;
    }
    auto* out = static_cast<char*>(dst);
    while (n > 0) {
      ssize_t got = ::pread(fd, out, n, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return false;
      out += got;
      offset += static_cast<uint64_t>(got);
      n -= static_cast<size_t>(got);
    }
    return true;
  }

  // Reads [offset, offset + n) into a new buffer, n capped by |cap|.
  bool ReadBlob(uint64_t offset, uint64_t n, uint64_t cap, std::vector<std::byte>* out,
                ParseError* err, const char* what) const {
    if (n > cap || offset > file_size || n > file_size - offset) {
      *err = {offset, std::string(what) + ": " + std::to_string(n) + " bytes at " + Hex(offset) +
                          " do not fit the " + std::to_string(file_size) + "-byte file"};
      return false;
    }
    out->resize(static_cast<size_t>(n));
    if (!Read(offset, out->data(), out->size())) {
      *err = {offset, std::string(what) + ": short read"};
      return false;
    }
    return true;
  }

  Status ParseInitial(uint64_t* pos);
  Status ParseV6(uint64_t pos);
  Status ParseV6Window(uint64_t pos, uint64_t window);
  Status ParseV7(uint64_t pos);
  // ParseV7's header info, formats, kallsyms, printk and cmdlines sections
  // (offsets 0 when absent).
  Status ReadMetadataSections(uint64_t header_info, uint64_t ftrace, uint64_t events,
                              uint64_t ksyms, uint64_t printk, uint64_t cmdl);
  bool ParseHeaderInfo(MemCursor& c, ParseError* err);
  bool ParseFtraceFormats(MemCursor& c, ParseError* err);
  bool ParseEventFormats(MemCursor& c, ParseError* err);
  bool ParseSizedText(MemCursor& c, int size_bytes, std::string* out, ParseError* err,
                      const char* what);
  bool ReadSection(uint64_t offset, uint16_t want_id, std::vector<std::byte>* body, uint16_t* flags,
                   ParseError* err);
  void ParseBufferOptionV7(std::span<const std::byte> data, uint64_t option_offset);
  void ParseOption(uint16_t id, std::span<const std::byte> data, uint64_t option_offset);
  void CheckCpuRanges();
  Status ForEachPage(size_t cpu_index,
                     const std::function<bool(std::span<const std::byte>, uint64_t)>& on_page);
};

}  // namespace hvtrace

#endif  // HVTRACE_SHARED_DECODE_SRC_TRACEDAT_IMPL_H_
