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
#include <zlib.h>
#include <zstd.h>

#include <charconv>
#include <utility>

#include "tracedat_impl.h"

namespace hvtrace {

std::string TraceDat::Impl::Hex(uint64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v, 16);
  (void)ec;
  return "0x" + std::string(buf, end);
}

std::string TraceDat::Impl::SelectedClock(std::string_view text) {
  size_t open = text.find('[');
  size_t close = open == std::string_view::npos ? open : text.find(']', open);
  if (close != std::string_view::npos) return std::string(text.substr(open + 1, close - open - 1));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\0')) {
    text.remove_suffix(1);
  }
  return std::string(text.substr(0, text.find(' ')));
}

Result<std::vector<std::byte>> TraceDat::Impl::Decompress(const std::string& algorithm,
                                                          std::span<const std::byte> in,
                                                          uint64_t out_size, uint64_t cap) {
  std::vector<std::byte> out;
  if (Status s = DecompressInto(algorithm, in, out_size, cap, &out); !s.ok()) return s.error();
  return out;
}

Status TraceDat::Impl::DecompressInto(const std::string& algorithm, std::span<const std::byte> in,
                                      uint64_t out_size, uint64_t cap,
                                      std::vector<std::byte>* out) {
  if (out_size > cap) {
    return Error{"claims " + std::to_string(out_size) + " uncompressed bytes (cap " +
                 std::to_string(cap) + ")"};
  }
  out->resize(static_cast<size_t>(out_size));
  if (algorithm == "zstd") {
    size_t n = ZSTD_decompress(out->data(), out->size(), in.data(), in.size());
    if (ZSTD_isError(n)) return Error{std::string("zstd: ") + ZSTD_getErrorName(n)};
    if (n != out_size) {
      return Error{"zstd: " + std::to_string(n) + " bytes, file claims " +
                   std::to_string(out_size)};
    }
  } else if (algorithm == "zlib") {
    uLongf n = static_cast<uLongf>(out->size());
    if (in.size() > UINT32_MAX) return Error{"zlib: input too large"};
    int rc = uncompress(reinterpret_cast<Bytef*>(out->data()), &n,
                        reinterpret_cast<const Bytef*>(in.data()), static_cast<uLong>(in.size()));
    if (rc != Z_OK) return Error{"zlib: error " + std::to_string(rc)};
    if (n != out_size) {
      return Error{"zlib: " + std::to_string(n) + " bytes, file claims " +
                   std::to_string(out_size)};
    }
  } else {
    return Error{"unsupported compression '" + algorithm + "'"};
  }
  return {};
}

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

bool TraceDat::Impl::ParseSizedText(MemCursor& c, int size_bytes, std::string* out, ParseError* err,
                                    const char* what) {
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
        *err = {c.file_offset() - 8,
                "system '" + system + "': format size " + std::to_string(size)};
        return false;
      }
      FormatText f{system, {}};
      if (!c.Text(size, &f.text, err, "event format")) return false;
      formats.push_back(std::move(f));
    }
  }
  return true;
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
  // Reused for every chunk: a new vector per chunk was zero-filled first
  // (60 M of 2,564 M instructions of `hvtrace report` on bench/large.dat,
  // callgrind, on the reader threads) and, at chunk sizes above malloc's
  // mmap threshold, faulted in afresh. Only exactly |sizes[1]| bytes are handed out, all written by
  // the decompressor (its byte count is checked).
  std::vector<std::byte> unpacked;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t sizes[2];
    if (end - at < 8 || !Read(at, sizes, sizeof(sizes))) {
      Issue(cpu_id, at, "chunk " + std::to_string(i) + " header past the CPU data");
      return {};
    }
    if (uint64_t{sizes[0]} > end - at - 8) {
      Issue(cpu_id, at,
            "chunk " + std::to_string(i) + " claims " + std::to_string(sizes[0]) +
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
    Status out = DecompressInto(compression, packed, sizes[1], kMaxChunkSize, &unpacked);
    if (!out.ok()) {
      Issue(cpu_id, chunk_at,
            "chunk " + std::to_string(i) + " (stream offset " + Hex(stream_offset) +
                "): " + out.error().message + "; skipped");
      stream_offset += sizes[1];
      continue;
    }
    if (!hand_out(unpacked, stream_offset, chunk_at, "chunk")) return {};
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

Result<TraceDat> TraceDat::OpenPages(const std::string& path) { return Open(path, true, true); }

Result<TraceDat> TraceDat::OpenWithoutSymbols(const std::string& path) {
  return Open(path, false, false);
}

Result<TraceDat> TraceDat::Open(const std::string& path) { return Open(path, false, true); }

Result<TraceDat> TraceDat::Open(const std::string& path, bool pages_only, bool symbols) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->pages_only = pages_only;
  impl->symbols = symbols;
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
std::string TraceDat::ReleaseKallsyms() { return std::exchange(impl_->kallsyms, std::string()); }
std::vector<FormatText> TraceDat::ReleaseFormats() {
  return std::exchange(impl_->formats, std::vector<FormatText>());
}
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
