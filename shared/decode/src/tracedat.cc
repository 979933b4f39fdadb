// trace.dat reader, versions 6 and 7. Layout (man 5 trace-cmd.dat.v6/.v7):
//
//   "\x17\x08\x44tracing" version "\0" endian(1) long_size(1) page_size(u32)
//   v6: header_page, header_event, ftrace formats, event formats, kallsyms,
//       printk formats, cmdlines, cpu count, "options  \0" + options,
//       "flyrecord\0", per CPU {u64 offset, u64 size}, u64 + trace clock
//   v7: compression "name\0version\0", u64 offset of the first options
//       section; then sections {u16 id, u16 flags, u32 description, u64 size}
//       (flags & 1: {u32 compressed, u32 uncompressed} + compressed data)
//       found through options; BUFFER options point at flyrecord sections
//       whose per-CPU data may be a chunk list {u32 count, per chunk
//       {u32 compressed, u32 uncompressed, data}}.
//
// The file is hostile. Every read goes through Source::Read, which checks the
// range against the size measured at open and copies into our memory (pread,
// or memcpy from the caller's buffer), so nothing is parsed in place and a
// file that changes under us can only produce bad values, not bad memory
// accesses. Counts and decompressed sizes are capped, and decompressed sizes
// are verified against what the file claims.
#include "hvtrace/tracedat.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <set>
#include <utility>

namespace hvtrace {
namespace {

constexpr char kMagic[] = "\x17\x08\x44tracing";
constexpr size_t kMagicSize = 10;
constexpr size_t kMaxStringSize = 4096;      // Names, clock and option strings.
constexpr uint32_t kMaxOptionsSections = 1024;
constexpr uint32_t kMaxSystems = 4096;
constexpr uint64_t kMaxFormatSize = 1 << 20;  // One format file.
constexpr uint32_t kMaxChunks = 1 << 20;
constexpr size_t kReadBlockPages = 256;       // Uncompressed data is read in blocks.

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
constexpr uint16_t kSectionCompressed = 1;

std::string Hex(uint64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v, 16);
  (void)ec;
  return "0x" + std::string(buf, end);
}

// The clock in use from trace_clock text: "[local] global" -> "local".
std::string SelectedClock(std::string_view text) {
  size_t open = text.find('[');
  size_t close = open == std::string_view::npos ? open : text.find(']', open);
  if (close != std::string_view::npos) return std::string(text.substr(open + 1, close - open - 1));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\0')) {
    text.remove_suffix(1);
  }
  return std::string(text.substr(0, text.find(' ')));
}

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

Result<std::vector<std::byte>> Decompress(const std::string& algorithm,
                                          std::span<const std::byte> in, uint64_t out_size,
                                          uint64_t cap) {
  if (out_size > cap) {
    return Error{"claims " + std::to_string(out_size) + " uncompressed bytes (cap " +
                 std::to_string(cap) + ")"};
  }
  std::vector<std::byte> out(static_cast<size_t>(out_size));
  if (algorithm == "zstd") {
    size_t n = ZSTD_decompress(out.data(), out.size(), in.data(), in.size());
    if (ZSTD_isError(n)) return Error{std::string("zstd: ") + ZSTD_getErrorName(n)};
    if (n != out_size) {
      return Error{"zstd: " + std::to_string(n) + " bytes, file claims " + std::to_string(out_size)};
    }
  } else if (algorithm == "zlib") {
    uLongf n = static_cast<uLongf>(out.size());
    if (in.size() > UINT32_MAX) return Error{"zlib: input too large"};
    int rc = uncompress(reinterpret_cast<Bytef*>(out.data()), &n,
                        reinterpret_cast<const Bytef*>(in.data()), static_cast<uLong>(in.size()));
    if (rc != Z_OK) return Error{"zlib: error " + std::to_string(rc)};
    if (n != out_size) {
      return Error{"zlib: " + std::to_string(n) + " bytes, file claims " + std::to_string(out_size)};
    }
  } else {
    return Error{"unsupported compression '" + algorithm + "'"};
  }
  return out;
}

}  // namespace

struct TraceDat::Impl {
  std::string path;
  int fd = -1;
  std::vector<std::byte> memory;
  bool in_memory = false;
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
  bool ParseHeaderInfo(MemCursor& c, ParseError* err);
  bool ParseFtraceFormats(MemCursor& c, ParseError* err);
  bool ParseEventFormats(MemCursor& c, ParseError* err);
  bool ParseSizedText(MemCursor& c, int size_bytes, std::string* out, ParseError* err,
                      const char* what);
  bool ReadSection(uint64_t offset, uint16_t want_id, std::vector<std::byte>* body,
                   uint16_t* flags, ParseError* err);
  void ParseBufferOptionV7(std::span<const std::byte> data, uint64_t option_offset);
  void ParseOption(uint16_t id, std::span<const std::byte> data, uint64_t option_offset);
  void CheckCpuRanges();
  Status ForEachPage(size_t cpu_index,
                     const std::function<bool(std::span<const std::byte>, uint64_t)>& on_page);
};

Status TraceDat::Impl::ParseInitial(uint64_t* pos) {
  std::vector<std::byte> head;
  ParseError err;
  // Magic, version string (short), endian, long size, page size.
  const uint64_t want = std::min<uint64_t>(file_size, 64);
  if (!ReadBlob(0, want, want, &head, &err, "file header")) return Fail(err);
  MemCursor c(head, 0);
  std::span<const std::byte> magic;
  if (!c.Bytes(kMagicSize, &magic, &err, "magic") ||
      std::memcmp(magic.data(), kMagic, kMagicSize) != 0) {
    return Error{Where(0) + ": not a trace.dat file (bad magic)"};
  }
  std::string version_text;
  if (!c.CString(&version_text, &err, "version")) return Fail(err);
  if (version_text == "6") {
    version = 6;
  } else if (version_text == "7") {
    version = 7;
  } else {
    return Error{Where(kMagicSize) + ": unsupported trace.dat version '" +
                 version_text.substr(0, 16) + "'"};
  }
  uint8_t endian = 0, lsize = 0;
  if (!c.Int(&endian, &err, "endian") || !c.Int(&lsize, &err, "long size") ||
      !c.Int(&page_size, &err, "page size")) {
    return Fail(err);
  }
  if (endian != 0) {
    big_endian = true;
    return Error{Where(c.file_offset() - 6) + ": big-endian trace.dat files are not supported"};
  }
  if (lsize != 4 && lsize != 8) {
    return Error{Where(c.file_offset() - 5) + ": long size " + std::to_string(lsize)};
  }
  long_size = lsize;
  if (page_size < 32 || page_size > kMaxPageSize) {
    return Error{Where(c.file_offset() - 4) + ": page size " + std::to_string(page_size) +
                 " out of range"};
  }
  *pos = c.file_offset();
  return {};
}

bool TraceDat::Impl::ParseSizedText(MemCursor& c, int size_bytes, std::string* out,
                                    ParseError* err, const char* what) {
  uint64_t n = 0;
  if (size_bytes == 4) {
    uint32_t n32 = 0;
    if (!c.Int(&n32, err, what)) return false;
    n = n32;
  } else if (!c.Int(&n, err, what)) {
    return false;
  }
  return c.Text(n, out, err, what);
}

bool TraceDat::Impl::ParseHeaderInfo(MemCursor& c, ParseError* err) {
  return c.Expect(std::string_view("header_page\0", 12), err) &&
         ParseSizedText(c, 8, &header_page, err, "header_page") &&
         c.Expect(std::string_view("header_event\0", 13), err) &&
         ParseSizedText(c, 8, &header_event, err, "header_event");
}

bool TraceDat::Impl::ParseFtraceFormats(MemCursor& c, ParseError* err) {
  uint32_t count = 0;
  if (!c.Int(&count, err, "ftrace format count")) return false;
  if (count > kMaxFormats || count > c.remaining() / 8) {
    *err = {c.file_offset() - 4, "ftrace format count " + std::to_string(count) + " is absurd"};
    return false;
  }
  for (uint32_t i = 0; i < count; ++i) {
    uint64_t size = 0;
    if (!c.Int(&size, err, "ftrace format size")) return false;
    if (size > kMaxFormatSize) {
      *err = {c.file_offset() - 8, "ftrace format size " + std::to_string(size)};
      return false;
    }
    FormatText f{"ftrace", {}};
    if (!c.Text(size, &f.text, err, "ftrace format")) return false;
    formats.push_back(std::move(f));
  }
  return true;
}

bool TraceDat::Impl::ParseEventFormats(MemCursor& c, ParseError* err) {
  uint32_t systems = 0;
  if (!c.Int(&systems, err, "event system count")) return false;
  if (systems > kMaxSystems || systems > c.remaining() / 5) {
    *err = {c.file_offset() - 4, "event system count " + std::to_string(systems) + " is absurd"};
    return false;
  }
  for (uint32_t s = 0; s < systems; ++s) {
    std::string system;
    uint32_t count = 0;
    if (!c.CString(&system, err, "system name") || !c.Int(&count, err, "event count")) {
      return false;
    }
    if (count > c.remaining() / 8 || formats.size() + count > kMaxFormats) {
      *err = {c.file_offset() - 4,
              "system '" + system + "': event count " + std::to_string(count) + " is absurd"};
      return false;
    }
    for (uint32_t i = 0; i < count; ++i) {
      uint64_t size = 0;
      if (!c.Int(&size, err, "format size")) return false;
      if (size > kMaxFormatSize) {
        *err = {c.file_offset() - 8, "system '" + system + "': format size " + std::to_string(size)};
        return false;
      }
      FormatText f{system, {}};
      if (!c.Text(size, &f.text, err, "event format")) return false;
      formats.push_back(std::move(f));
    }
  }
  return true;
}

void TraceDat::Impl::ParseOption(uint16_t id, std::span<const std::byte> data,
                                 uint64_t option_offset) {
  auto text = [&] {
    std::string s(reinterpret_cast<const char*>(data.data()), std::min(data.size(), kMaxStringSize));
    return s.substr(0, s.find('\0'));
  };
  switch (id) {
    case kOptTraceClock:
      if (trace_clock.empty()) trace_clock = SelectedClock(text());
      break;
    case kOptOffset: {
      std::string s = text();
      int64_t v = 0;
      auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (ec == std::errc() && ptr != s.data()) {
        timestamp_offset = v;
      } else {
        Issue(-1, option_offset, "OFFSET option '" + s.substr(0, 40) + "' is not a number");
      }
      break;
    }
    default:
      break;  // Options we do not need are skipped, as the format intends.
  }
}

Status TraceDat::Impl::ParseV6(uint64_t pos) {
  // Version 6 is one sequential header whose size is stated nowhere: read a
  // window, and when the parse runs out of it, parse again from a window
  // twice as large (up to the file, and a cap).
  const uint64_t available = std::min<uint64_t>(file_size - pos, kMaxSectionSize * 4);
  for (uint64_t window = std::min<uint64_t>(available, 8 << 20);; window *= 2) {
    window = std::min(window, available);
    Status s = ParseV6Window(pos, window);
    if (s.ok() || window == available) return s;
    formats.clear();
    instances.clear();
    cpus.clear();
    issues.clear();
    trace_clock.clear();
    timestamp_offset = 0;
  }
}

Status TraceDat::Impl::ParseV6Window(uint64_t pos, uint64_t window) {
  std::vector<std::byte> meta;
  ParseError err;
  if (!ReadBlob(pos, window, window, &meta, &err, "header")) return Fail(err);
  MemCursor c(meta, pos);
  if (!ParseHeaderInfo(c, &err) || !ParseFtraceFormats(c, &err) || !ParseEventFormats(c, &err) ||
      !ParseSizedText(c, 4, &kallsyms, &err, "kallsyms") ||
      !ParseSizedText(c, 4, &printk_formats, &err, "printk formats") ||
      !ParseSizedText(c, 8, &cmdlines, &err, "cmdlines")) {
    return Fail(err);
  }
  uint32_t cpu_count = 0;
  if (!c.Int(&cpu_count, &err, "cpu count")) return Fail(err);
  if (cpu_count > kMaxCpus) {
    return Error{Where(c.file_offset() - 4) + ": CPU count " + std::to_string(cpu_count) +
                 " is absurd (cap " + std::to_string(kMaxCpus) + ")"};
  }
  std::span<const std::byte> kind;
  if (!c.Bytes(10, &kind, &err, "data kind")) return Fail(err);
  if (std::memcmp(kind.data(), "options  \0", 10) == 0) {
    for (uint32_t n = 0;; ++n) {
      uint16_t id = 0;
      if (!c.Int(&id, &err, "option id")) return Fail(err);
      if (id == kOptDone) break;
      uint32_t size = 0;
      std::span<const std::byte> data;
      const uint64_t at = c.file_offset();
      if (!c.Int(&size, &err, "option size") || !c.Bytes(size, &data, &err, "option")) {
        return Fail(err);
      }
      if (id == kOptBuffer) {
        // v6 BUFFER: {u64 offset, name}: an instance other than the top one.
        MemCursor oc(data, at + 4);
        uint64_t off = 0;
        std::string name;
        if (oc.Int(&off, &err, "buffer offset") && oc.CString(&name, &err, "buffer name")) {
          instances.push_back(name);
        } else {
          Issue(-1, err.offset, "BUFFER option: " + err.what);
        }
      } else {
        ParseOption(id, data, at);
      }
    }
    if (!c.Bytes(10, &kind, &err, "data kind")) return Fail(err);
  }
  if (std::memcmp(kind.data(), "latency  \0", 10) == 0) {
    return Error{Where(c.file_offset() - 10) + ": latency trace files hold text, not pages"};
  }
  if (std::memcmp(kind.data(), "flyrecord\0", 10) != 0) {
    return Error{Where(c.file_offset() - 10) + ": expected \"flyrecord\""};
  }
  if (cpu_count > c.remaining() / 16) {
    return Error{Where(c.file_offset()) + ": CPU count " + std::to_string(cpu_count) +
                 " does not fit the file"};
  }
  for (uint32_t i = 0; i < cpu_count; ++i) {
    TraceDatCpu cpu;
    cpu.cpu = i;
    if (!c.Int(&cpu.offset, &err, "cpu offset") || !c.Int(&cpu.size, &err, "cpu size")) {
      return Fail(err);
    }
    cpus.push_back(cpu);
  }
  // Then {u64 size, text} of the trace clock (trace-cmd writes it when the
  // TRACECLOCK option is present). Optional: absent in old files.
  uint64_t clock_size = 0;
  std::string clock;
  ParseError ignored;
  if (c.Int(&clock_size, &ignored, "clock size") && clock_size > 0 &&
      clock_size <= kMaxStringSize && c.Text(clock_size, &clock, &ignored, "clock")) {
    trace_clock = SelectedClock(clock);
  }
  have_top_buffer = true;
  return {};
}

bool TraceDat::Impl::ReadSection(uint64_t offset, uint16_t want_id, std::vector<std::byte>* body,
                                 uint16_t* flags_out, ParseError* err) {
  uint8_t raw[16];
  if (!Read(offset, raw, sizeof(raw))) {
    *err = {offset, "section header past the end of the file"};
    return false;
  }
  uint16_t id, flags;
  uint64_t size;
  std::memcpy(&id, raw, 2);
  std::memcpy(&flags, raw + 2, 2);
  std::memcpy(&size, raw + 8, 8);
  if (id != want_id) {
    *err = {offset, "section id " + std::to_string(id) + ", expected " + std::to_string(want_id)};
    return false;
  }
  if (flags_out) *flags_out = flags;
  const uint64_t data_at = offset + 16;
  if (size > file_size - data_at) {
    *err = {offset, "section size " + std::to_string(size) + " runs past the end of the " +
                        std::to_string(file_size) + "-byte file"};
    return false;
  }
  if (!(flags & kSectionCompressed)) {
    return ReadBlob(data_at, size, kMaxSectionSize, body, err, "section");
  }
  uint32_t sizes[2];
  if (size < 8 || !Read(data_at, sizes, sizeof(sizes))) {
    *err = {data_at, "compressed section header past the end of the file"};
    return false;
  }
  if (uint64_t{sizes[0]} + 8 > size) {
    *err = {data_at, "compressed size " + std::to_string(sizes[0]) + " exceeds section size " +
                         std::to_string(size)};
    return false;
  }
  std::vector<std::byte> packed;
  if (!ReadBlob(data_at + 8, sizes[0], kMaxSectionSize, &packed, err, "compressed section")) {
    return false;
  }
  auto out = Decompress(compression, packed, sizes[1], kMaxSectionSize);
  if (!out.ok()) {
    *err = {data_at, "section: " + out.error().message};
    return false;
  }
  *body = std::move(out.value());
  return true;
}

void TraceDat::Impl::ParseBufferOptionV7(std::span<const std::byte> data, uint64_t option_offset) {
  MemCursor c(data, option_offset);
  ParseError err;
  uint64_t section = 0;
  std::string name, clock;
  uint32_t buffer_page_size = 0, count = 0;
  if (!c.Int(&section, &err, "buffer section") || !c.CString(&name, &err, "buffer name") ||
      !c.CString(&clock, &err, "buffer clock") ||
      !c.Int(&buffer_page_size, &err, "buffer page size") || !c.Int(&count, &err, "cpu count")) {
    Issue(-1, err.offset, "BUFFER option: " + err.what);
    return;
  }
  if (!name.empty()) {
    instances.push_back(name);
    return;
  }
  if (have_top_buffer) {
    Issue(-1, option_offset, "second BUFFER option for the top instance ignored");
    return;
  }
  have_top_buffer = true;
  if (!clock.empty()) trace_clock = SelectedClock(clock);
  if (buffer_page_size != page_size) {
    Issue(-1, option_offset, "BUFFER page size " + std::to_string(buffer_page_size) +
                                 " differs from the file's " + std::to_string(page_size) +
                                 "; using the file's");
  }
  if (count > kMaxCpus || count > c.remaining() / 20) {
    Issue(-1, c.file_offset() - 4, "BUFFER CPU count " + std::to_string(count) + " is absurd");
    return;
  }
  uint16_t flags = 0;
  uint8_t raw[16];
  if (Read(section, raw, sizeof(raw))) {
    uint16_t id;
    std::memcpy(&id, raw, 2);
    std::memcpy(&flags, raw + 2, 2);
    if (id != kOptBuffer) {
      Issue(-1, section, "flyrecord section id " + std::to_string(id) + ", expected 3");
    }
  } else {
    Issue(-1, section, "flyrecord section header past the end of the file");
  }
  data_compressed = (flags & kSectionCompressed) != 0;
  if (data_compressed && compression == "none") {
    Issue(-1, section, "compressed flyrecord data in a file without a compression algorithm");
  }
  std::set<uint32_t> seen;
  for (uint32_t i = 0; i < count; ++i) {
    TraceDatCpu cpu;
    if (!c.Int(&cpu.cpu, &err, "cpu id") || !c.Int(&cpu.offset, &err, "cpu offset") ||
        !c.Int(&cpu.size, &err, "cpu size")) {
      Issue(-1, err.offset, "BUFFER option: " + err.what);
      return;
    }
    if (!seen.insert(cpu.cpu).second) {
      Issue(static_cast<int>(cpu.cpu), option_offset, "CPU listed twice; second entry ignored");
      continue;
    }
    cpus.push_back(cpu);
  }
}

Status TraceDat::Impl::ParseV7(uint64_t pos) {
  std::vector<std::byte> head;
  ParseError err;
  const uint64_t want = std::min<uint64_t>(file_size - pos, 2 * kMaxStringSize + 8);
  if (!ReadBlob(pos, want, want, &head, &err, "compression header")) return Fail(err);
  MemCursor c(head, pos);
  std::string algorithm, algorithm_version;
  uint64_t options = 0;
  if (!c.CString(&algorithm, &err, "compression name") ||
      !c.CString(&algorithm_version, &err, "compression version") ||
      !c.Int(&options, &err, "options offset")) {
    return Fail(err);
  }
  if (algorithm != "none" && algorithm != "zstd" && algorithm != "zlib") {
    return Error{Where(pos) + ": unsupported compression '" + algorithm.substr(0, 32) + "'"};
  }
  compression = algorithm;

  // Section offsets found in the options, parsed after the options walk.
  uint64_t header_info = 0, ftrace = 0, events = 0, ksyms = 0, printk = 0, cmdl = 0;
  std::set<uint64_t> visited;
  for (uint32_t n = 0; options != 0; ++n) {
    if (n >= kMaxOptionsSections || !visited.insert(options).second) {
      Issue(-1, options, "options sections loop or too many; stopped");
      break;
    }
    std::vector<std::byte> body;
    if (!ReadSection(options, kOptDone, &body, nullptr, &err)) {
      if (n == 0) return Fail(err);
      Issue(-1, err.offset, "options section: " + err.what);
      break;
    }
    MemCursor oc(body, options + 16);
    uint64_t next = 0;
    while (!oc.at_end()) {
      uint16_t id = 0;
      uint32_t size = 0;
      std::span<const std::byte> data;
      const uint64_t at = oc.file_offset();
      if (!oc.Int(&id, &err, "option id") || !oc.Int(&size, &err, "option size") ||
          !oc.Bytes(size, &data, &err, "option")) {
        Issue(-1, err.offset, "options section: " + err.what);
        break;
      }
      uint64_t value = 0;
      if (size >= 8) std::memcpy(&value, data.data(), 8);
      switch (id) {
        case kOptDone: next = value; break;
        case kOptHeaderInfo: header_info = value; break;
        case kOptFtraceEvents: ftrace = value; break;
        case kOptEventFormats: events = value; break;
        case kOptKallsyms: ksyms = value; break;
        case kOptPrintk: printk = value; break;
        case kOptCmdlines: cmdl = value; break;
        case kOptBuffer: ParseBufferOptionV7(data, at + 6); break;
        default: ParseOption(id, data, at); break;
      }
      if (id == kOptDone) break;
    }
    options = next;
  }

  if (header_info == 0) return Error{Where(0) + ": no HEADER_INFO option"};
  std::vector<std::byte> body;
  if (!ReadSection(header_info, kOptHeaderInfo, &body, nullptr, &err)) return Fail(err);
  {
    MemCursor hc(body, header_info + 16);
    if (!ParseHeaderInfo(hc, &err)) return Fail(err);
  }
  // The rest is optional: a bad section is an issue, the file stays usable.
  auto optional = [&](uint64_t offset, uint16_t id, const char* what, auto&& parse) {
    if (offset == 0) return;
    std::vector<std::byte> b;
    ParseError e;
    if (!ReadSection(offset, id, &b, nullptr, &e)) {
      Issue(-1, e.offset, std::string(what) + ": " + e.what);
      return;
    }
    MemCursor sc(b, offset + 16);
    if (!parse(sc, &e)) Issue(-1, e.offset, std::string(what) + ": " + e.what);
  };
  optional(ftrace, kOptFtraceEvents, "ftrace formats",
           [&](MemCursor& sc, ParseError* e) { return ParseFtraceFormats(sc, e); });
  optional(events, kOptEventFormats, "event formats",
           [&](MemCursor& sc, ParseError* e) { return ParseEventFormats(sc, e); });
  optional(ksyms, kOptKallsyms, "kallsyms", [&](MemCursor& sc, ParseError* e) {
    return ParseSizedText(sc, 4, &kallsyms, e, "kallsyms");
  });
  optional(printk, kOptPrintk, "printk formats", [&](MemCursor& sc, ParseError* e) {
    return ParseSizedText(sc, 4, &printk_formats, e, "printk formats");
  });
  optional(cmdl, kOptCmdlines, "cmdlines", [&](MemCursor& sc, ParseError* e) {
    return ParseSizedText(sc, 8, &cmdlines, e, "cmdlines");
  });
  if (!have_top_buffer) Issue(-1, 0, "no BUFFER option for the top instance: no trace data");
  return {};
}

void TraceDat::Impl::CheckCpuRanges() {
  // Compressed data starts with a u32 chunk count that the stated size does
  // not include (as trace-cmd writes it).
  const uint64_t lead = data_compressed ? 4 : 0;
  for (TraceDatCpu& cpu : cpus) {
    if (cpu.offset > file_size || file_size - cpu.offset < lead) {
      Issue(static_cast<int>(cpu.cpu), cpu.offset,
            "CPU data offset " + Hex(cpu.offset) + " is past the end of the " +
                std::to_string(file_size) + "-byte file");
      cpu.size = 0;
    } else if (cpu.size > file_size - cpu.offset - lead) {
      Issue(static_cast<int>(cpu.cpu), cpu.offset,
            "CPU data claims " + std::to_string(cpu.size) + " bytes, the file has " +
                std::to_string(file_size - cpu.offset - lead) +
                " (truncated?); reading what is there");
      cpu.size = file_size - cpu.offset - lead;
    }
  }
}

Status TraceDat::Impl::ForEachPage(
    size_t cpu_index, const std::function<bool(std::span<const std::byte>, uint64_t)>& on_page) {
  if (cpu_index >= cpus.size()) {
    return Error{path + ": no CPU index " + std::to_string(cpu_index) + " (" +
                 std::to_string(cpus.size()) + " CPUs)"};
  }
  const TraceDatCpu cpu = cpus[cpu_index];
  const int cpu_id = static_cast<int>(cpu.cpu);
  // Checked against the file at open (CheckCpuRanges).
  const uint64_t end = cpu.offset + (data_compressed ? 4 : 0) + cpu.size;
  std::vector<std::byte> buffer;

  // Hands out the whole pages of |data| (a private buffer), |base| is the
  // offset of data[0] for the callback. Returns false when the callback stops.
  auto hand_out = [&](std::span<const std::byte> data, uint64_t base, uint64_t issue_offset,
                      const char* where) {
    size_t whole = data.size() / page_size * page_size;
    for (size_t at = 0; at < whole; at += page_size) {
      if (!on_page(data.subspan(at, page_size), base + at)) return false;
    }
    if (whole != data.size()) {
      Issue(cpu_id, issue_offset,
            std::string(where) + " ends with a partial page of " +
                std::to_string(data.size() - whole) + " bytes; skipped");
    }
    return true;
  };

  if (!data_compressed) {
    const uint64_t block = uint64_t{page_size} * kReadBlockPages;
    for (uint64_t at = cpu.offset; at < end;) {
      const uint64_t n = std::min(block, end - at);
      buffer.resize(static_cast<size_t>(n));
      if (!Read(at, buffer.data(), buffer.size())) {
        Issue(cpu_id, at, "short read of CPU data (file changed?)");
        return {};
      }
      if (!hand_out(buffer, at, at + n - n % page_size, "CPU data")) return {};
      at += n;
    }
    return {};
  }

  // Chunked compressed data: {u32 count, {u32 compressed, u32 uncompressed,
  // data} * count}. A bad chunk is skipped when its size still lets us find
  // the next one.
  uint32_t count = 0;
  if (cpu.size == 0) return {};
  if (!Read(cpu.offset, &count, 4)) {
    Issue(cpu_id, cpu.offset, "compressed CPU data too short for its chunk count");
    return {};
  }
  if (count > kMaxChunks || count > cpu.size / 8) {
    Issue(cpu_id, cpu.offset, "chunk count " + std::to_string(count) + " is absurd");
    return {};
  }
  uint64_t at = cpu.offset + 4;
  uint64_t stream_offset = 0;  // Offset in the decompressed stream.
  std::vector<std::byte> packed;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t sizes[2];
    if (end - at < 8 || !Read(at, sizes, sizeof(sizes))) {
      Issue(cpu_id, at, "chunk " + std::to_string(i) + " header past the CPU data");
      return {};
    }
    if (uint64_t{sizes[0]} > end - at - 8) {
      Issue(cpu_id, at, "chunk " + std::to_string(i) + " claims " + std::to_string(sizes[0]) +
                            " compressed bytes, past the CPU data");
      return {};
    }
    const uint64_t chunk_at = at;
    at += 8 + uint64_t{sizes[0]};
    packed.resize(sizes[0]);
    if (!Read(chunk_at + 8, packed.data(), packed.size())) {
      Issue(cpu_id, chunk_at, "short read of chunk " + std::to_string(i));
      return {};
    }
    auto out = Decompress(compression, packed, sizes[1], kMaxChunkSize);
    if (!out.ok()) {
      Issue(cpu_id, chunk_at,
            "chunk " + std::to_string(i) + " (stream offset " + Hex(stream_offset) +
                "): " + out.error().message + "; skipped");
      stream_offset += sizes[1];
      continue;
    }
    if (!hand_out(out.value(), stream_offset, chunk_at, "chunk")) return {};
    stream_offset += sizes[1];
  }
  if (at != end) {
    Issue(cpu_id, at, std::to_string(end - at) + " bytes after the last chunk ignored");
  }
  return {};
}

TraceDat::TraceDat(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TraceDat::TraceDat(TraceDat&&) noexcept = default;
TraceDat& TraceDat::operator=(TraceDat&&) noexcept = default;
TraceDat::~TraceDat() = default;

Result<TraceDat> TraceDat::Open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (impl->fd < 0) return Error{path + ": " + std::strerror(errno)};
  struct stat st;
  if (::fstat(impl->fd, &st) != 0) return Error{path + ": fstat: " + std::strerror(errno)};
  if (!S_ISREG(st.st_mode)) return Error{path + ": not a regular file"};
  impl->file_size = static_cast<uint64_t>(st.st_size);
  return Load(std::move(impl));
}

Result<TraceDat> TraceDat::OpenBuffer(std::vector<std::byte> data, const std::string& name) {
  auto impl = std::make_unique<Impl>();
  impl->path = name;
  impl->memory = std::move(data);
  impl->in_memory = true;
  impl->file_size = impl->memory.size();
  return Load(std::move(impl));
}

Result<TraceDat> TraceDat::Load(std::unique_ptr<Impl> impl) {
  uint64_t pos = 0;
  if (Status s = impl->ParseInitial(&pos); !s.ok()) return s.error();
  Status s = impl->version == 6 ? impl->ParseV6(pos) : impl->ParseV7(pos);
  if (!s.ok()) return s.error();
  impl->CheckCpuRanges();
  return TraceDat(std::move(impl));
}

const std::string& TraceDat::path() const { return impl_->path; }
int TraceDat::version() const { return impl_->version; }
bool TraceDat::big_endian() const { return impl_->big_endian; }
uint32_t TraceDat::long_size() const { return impl_->long_size; }
uint32_t TraceDat::page_size() const { return impl_->page_size; }
const std::string& TraceDat::compression() const { return impl_->compression; }
const std::string& TraceDat::header_page() const { return impl_->header_page; }
const std::string& TraceDat::header_event() const { return impl_->header_event; }
const std::vector<FormatText>& TraceDat::formats() const { return impl_->formats; }
const std::string& TraceDat::kallsyms() const { return impl_->kallsyms; }
const std::string& TraceDat::printk_formats() const { return impl_->printk_formats; }
const std::string& TraceDat::cmdlines() const { return impl_->cmdlines; }
const std::string& TraceDat::trace_clock() const { return impl_->trace_clock; }
int64_t TraceDat::timestamp_offset() const { return impl_->timestamp_offset; }
const std::vector<TraceDatCpu>& TraceDat::cpus() const { return impl_->cpus; }
bool TraceDat::data_compressed() const { return impl_->data_compressed; }
const std::vector<std::string>& TraceDat::instances() const { return impl_->instances; }
const std::vector<TraceDatIssue>& TraceDat::issues() const { return impl_->issues; }

Status TraceDat::ForEachPage(
    size_t cpu_index,
    const std::function<bool(std::span<const std::byte> page_copy, uint64_t offset)>& on_page) {
  return impl_->ForEachPage(cpu_index, on_page);
}

}  // namespace hvtrace
