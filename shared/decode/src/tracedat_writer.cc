// trace.dat version 6 writer; the layout is in tracedat_writer.h.
#include "hvtrace/tracedat_writer.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace hvtrace {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the writer emits little-endian files from a little-endian host");

constexpr uint16_t kOptionDone = 0;
constexpr uint16_t kOptionTraceClock = 4;
// trace-cmd 3.4's LAST_BOOT_INFO: "<instance>:<last_boot_info text>", NUL
// terminated (a reader that does not know it skips it by its size).
constexpr uint16_t kOptionLastBootInfo = 24;

void Put16(std::string* out, uint16_t v) { out->append(reinterpret_cast<const char*>(&v), 2); }
void Put32(std::string* out, uint32_t v) { out->append(reinterpret_cast<const char*>(&v), 4); }
void Put64(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), 8); }
void PutCString(std::string* out, const std::string& s) { out->append(s.c_str(), s.size() + 1); }

// The header: everything before the page-aligned CPU data.
Result<std::string> EncodeHeader(const TraceDatWriterInput& in) {
  if (in.page_size < 64 || !std::has_single_bit(in.page_size)) {
    return Error{"trace.dat: page size " + std::to_string(in.page_size) + " is not usable"};
  }
  if (in.long_size != 4 && in.long_size != 8) {
    return Error{"trace.dat: long size " + std::to_string(in.long_size) + " must be 4 or 8"};
  }
  if (in.kallsyms.size() > UINT32_MAX || in.printk_formats.size() > UINT32_MAX) {
    return Error{"trace.dat: kallsyms or printk formats larger than 4 GiB"};
  }
  for (size_t cpu = 0; cpu < in.cpus.size(); ++cpu) {
    for (size_t i = 0; i < in.cpus[cpu].size(); ++i) {
      if (in.cpus[cpu][i].size() != in.page_size) {
        return Error{"trace.dat: CPU " + std::to_string(cpu) + " page " + std::to_string(i) +
                     " has " + std::to_string(in.cpus[cpu][i].size()) +
                     " bytes, not the page size " + std::to_string(in.page_size)};
      }
    }
  }
  if (in.trace_clock.empty() || in.trace_clock.find_first_of("[] \n") != std::string::npos) {
    return Error{"trace.dat: trace clock name '" + in.trace_clock + "' is not a clock name"};
  }

  // Sized once: the formats, kallsyms and printk formats are most of a
  // header (~1.7 MB for a 6.12 kernel), and growing by doubling copied them
  // again at each step.
  size_t texts = in.header_page.size() + in.header_event.size() + in.kallsyms.size() +
                 in.printk_formats.size() + in.cmdlines.size() + in.last_boot_info.size();
  for (const FormatText& f : in.formats) texts += f.system.size() + f.text.size() + 16;
  std::string out;
  out.reserve(texts + 1024 + 16 * in.cpus.size() + in.trace_clock.size());
  out.append("\x17\x08\x44tracing", 10);
  PutCString(&out, "6");
  out.push_back(0);  // Little endian.
  out.push_back(static_cast<char>(in.long_size));
  Put32(&out, in.page_size);

  PutCString(&out, "header_page");
  Put64(&out, in.header_page.size());
  out += in.header_page;
  PutCString(&out, "header_event");
  Put64(&out, in.header_event.size());
  out += in.header_event;

  std::vector<const FormatText*> ftrace;
  std::vector<std::string> systems;
  std::vector<std::vector<const FormatText*>> events;
  for (const FormatText& f : in.formats) {
    if (f.system == "ftrace") {
      ftrace.push_back(&f);
      continue;
    }
    if (f.system.empty() || f.system.find('\0') != std::string::npos) {
      return Error{"trace.dat: a format has an empty or NUL-containing system name"};
    }
    size_t i = 0;
    while (i < systems.size() && systems[i] != f.system) ++i;
    if (i == systems.size()) {
      systems.push_back(f.system);
      events.emplace_back();
    }
    events[i].push_back(&f);
  }
  Put32(&out, static_cast<uint32_t>(ftrace.size()));
  for (const FormatText* f : ftrace) {
    Put64(&out, f->text.size());
    out += f->text;
  }
  Put32(&out, static_cast<uint32_t>(systems.size()));
  for (size_t i = 0; i < systems.size(); ++i) {
    PutCString(&out, systems[i]);
    Put32(&out, static_cast<uint32_t>(events[i].size()));
    for (const FormatText* f : events[i]) {
      Put64(&out, f->text.size());
      out += f->text;
    }
  }

  Put32(&out, static_cast<uint32_t>(in.kallsyms.size()));
  out += in.kallsyms;
  Put32(&out, static_cast<uint32_t>(in.printk_formats.size()));
  out += in.printk_formats;
  Put64(&out, in.cmdlines.size());
  out += in.cmdlines;

  Put32(&out, static_cast<uint32_t>(in.cpus.size()));
  const std::string clock = "[" + in.trace_clock + "]";
  out.append("options  \0", 10);
  Put16(&out, kOptionTraceClock);
  Put32(&out, static_cast<uint32_t>(clock.size() + 1));
  PutCString(&out, clock);
  if (!in.last_boot_info.empty()) {
    Put16(&out, kOptionLastBootInfo);
    Put32(&out, static_cast<uint32_t>(in.last_boot_info.size() + 1));
    PutCString(&out, in.last_boot_info);
  }
  Put16(&out, kOptionDone);

  out.append("flyrecord\0", 10);
  // The CPU table comes before the clock and the padding, so compute where
  // the data will land first.
  const uint64_t table_end = out.size() + 16 * in.cpus.size() + 8 + clock.size();
  uint64_t offset = table_end;
  for (const auto& pages : in.cpus) {
    offset = (offset + in.page_size - 1) / in.page_size * in.page_size;
    const uint64_t size = uint64_t{in.page_size} * pages.size();
    Put64(&out, offset);
    Put64(&out, size);
    offset += size;
  }
  // v6 readers take the clock from here when the TRACECLOCK option is set.
  Put64(&out, clock.size());
  out += clock;
  return out;
}

// The file as the spans it is made of, in order: the header, then per CPU
// zero padding to a page boundary and its pages (pages adjacent in memory
// merged into one span). EncodeTraceDat joins them; WriteTraceDat hands them
// to writev, so the pages are never copied (the issue-16 capture measured
// 28.8 ms for a 1.4 MB trace.dat written one page per write(2) and fsynced
// twice; see bench/README.md "Panic to capture").
struct Pieces {
  Pieces() = default;
  Pieces(const Pieces&) = delete;
  Pieces& operator=(const Pieces&) = delete;

  std::string head;
  std::string zeros;  // page_size zero bytes, the source of every padding span.
  std::vector<std::span<const std::byte>> spans;
  uint64_t size = 0;

  void Add(std::span<const std::byte> s) {
    if (s.empty()) return;
    size += s.size();
    if (!spans.empty() && spans.back().data() + spans.back().size() == s.data()) {
      spans.back() = {spans.back().data(), spans.back().size() + s.size()};
      return;
    }
    spans.push_back(s);
  }
};

// Fills |p| (not moved afterwards: its spans point into its own strings).
Status LayOutPieces(const TraceDatWriterInput& input, Pieces& p) {
  auto header = EncodeHeader(input);
  if (!header.ok()) return header.error();
  p.head = std::move(*header);
  p.zeros.assign(input.page_size, '\0');
  p.Add(std::as_bytes(std::span(p.head)));
  for (const auto& pages : input.cpus) {
    const uint64_t pad = (input.page_size - p.size % input.page_size) % input.page_size;
    p.Add(std::as_bytes(std::span(p.zeros)).first(pad));
    for (const auto& page : pages) p.Add(page);
  }
  return {};
}

class File {
 public:
  explicit File(std::string path) : path_(std::move(path)) {}
  ~File() {
    if (fd_ >= 0) close(fd_);
    if (!committed_ && !tmp_.empty()) unlink(tmp_.c_str());
  }
  Status Open() {
    tmp_ = path_ + ".tmp.XXXXXX";
    fd_ = mkstemp(tmp_.data());
    if (fd_ < 0) {
      const std::string err = std::strerror(errno);
      tmp_.clear();
      return Error{"trace.dat: cannot create a temporary file beside " + path_ + ": " + err};
    }
    // mkstemp makes the file 0600; a capture is read by the hvtrace group too
    // (the directory it lands in decides who can reach it).
    if (fchmod(fd_, 0640) != 0) {
      return Error{"trace.dat: chmod " + tmp_ + " (for " + path_ + "): " + std::strerror(errno)};
    }
    return {};
  }
  // Writes |spans| in order, IOV_MAX at a time, resuming after short writes.
  Status Write(std::span<const std::span<const std::byte>> spans) {
    std::vector<iovec> iov;
    size_t next = 0;  // First span not yet in |iov|.
    size_t skip = 0;  // Bytes of spans[next] already written.
    while (next < spans.size()) {
      iov.clear();
      for (size_t i = next; i < spans.size() && iov.size() < IOV_MAX; ++i) {
        const size_t off = i == next ? skip : 0;
        iov.push_back({const_cast<std::byte*>(spans[i].data()) + off, spans[i].size() - off});
      }
      const ssize_t n = writev(fd_, iov.data(), static_cast<int>(iov.size()));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const std::string err = n < 0 ? std::strerror(errno) : "wrote nothing";
        return Error{"trace.dat: write " + tmp_ + " (for " + path_ + ") at offset " +
                     std::to_string(written_) + ": " + err};
      }
      written_ += static_cast<uint64_t>(n);
      size_t left = static_cast<size_t>(n);
      while (next < spans.size() && left >= spans[next].size() - skip) {
        left -= spans[next].size() - skip;
        skip = 0;
        ++next;
      }
      skip += left;
    }
    return {};
  }
  Status Commit(TraceDatSync sync) {
    if (sync == TraceDatSync::kDurable && fsync(fd_) != 0) {
      return Error{"trace.dat: fsync " + tmp_ + " (for " + path_ + "): " + std::strerror(errno)};
    }
    // The caller syncs later (one flush for all its files): start the
    // writeback now so that flush finds little left to do.
    if (sync == TraceDatSync::kCallerSyncs) {
      (void)sync_file_range(fd_, 0, 0, SYNC_FILE_RANGE_WRITE);
    }
    const int fd = fd_;
    fd_ = -1;
    if (close(fd) != 0) {
      return Error{"trace.dat: close " + tmp_ + " (for " + path_ + "): " + std::strerror(errno)};
    }
    if (rename(tmp_.c_str(), path_.c_str()) != 0) {
      return Error{"trace.dat: rename " + tmp_ + " to " + path_ + ": " + std::strerror(errno)};
    }
    committed_ = true;
    if (sync == TraceDatSync::kCallerSyncs) return {};
    // Make the rename itself durable.
    const size_t slash = path_.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path_.substr(0, slash + 1);
    const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      fsync(dfd);
      close(dfd);
    }
    return {};
  }

 private:
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  uint64_t written_ = 0;
  bool committed_ = false;
};

}  // namespace

Result<std::string> EncodeTraceDat(const TraceDatWriterInput& input) {
  Pieces pieces;
  if (Status s = LayOutPieces(input, pieces); !s.ok()) return s.error();
  std::string out;
  out.reserve(pieces.size);
  for (const auto& span : pieces.spans) {
    out.append(reinterpret_cast<const char*>(span.data()), span.size());
  }
  return out;
}

Status WriteTraceDat(const std::string& path, const TraceDatWriterInput& input, TraceDatSync sync) {
  Pieces pieces;
  if (Status s = LayOutPieces(input, pieces); !s.ok()) {
    return Error{s.error().message + " (writing " + path + ")"};
  }
  File file(path);
  if (Status s = file.Open(); !s.ok()) return s;
  if (Status s = file.Write(pieces.spans); !s.ok()) return s;
  return file.Commit(sync);
}

}  // namespace hvtrace
