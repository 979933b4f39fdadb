#include "host_trace_capture.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <span>

#include "boot_trace.h"

namespace hvtrace::hostd {

using nlohmann::json;

Result<HostTraceCopy> ReadQemuTraceLogTail(const std::filesystem::path& path, uint64_t cap) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return Error{"open " + path.string() + ": " + std::strerror(errno)};
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Error{"fstat " + path.string() + ": " + std::strerror(errno)};
  if (!S_ISREG(st.st_mode)) return Error{path.string() + " is not a regular file"};
  HostTraceCopy copy;
  copy.file_bytes = static_cast<uint64_t>(st.st_size);
  const uint64_t start = copy.file_bytes > cap ? copy.file_bytes - cap : 0;
  copy.text.resize(copy.file_bytes - start);
  size_t got = 0;
  // QEMU may append meanwhile: what it adds after fstat is left for the
  // next capture; a file cut short under us gives fewer bytes, not garbage.
  while (got < copy.text.size()) {
    const ssize_t n = ::pread(fd, copy.text.data() + got, copy.text.size() - got,
                              static_cast<off_t>(start + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error{"read " + path.string() + ": " + std::strerror(errno)};
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  copy.text.resize(got);
  copy.skipped_head_bytes = start;
  if (start > 0) {
    // The first line is cut unless the byte before it ended a line.
    char before = '\0';
    if (::pread(fd, &before, 1, static_cast<off_t>(start - 1)) != 1 || before != '\n') {
      const size_t nl = copy.text.find('\n');
      const size_t drop = nl == std::string::npos ? copy.text.size() : nl + 1;
      copy.text.erase(0, drop);
      copy.skipped_head_bytes += drop;
    }
  }
  return copy;
}

json HostTraceSummary(const QemuTraceLog& log, const HostTraceCopy& copy) {
  std::map<std::string, uint64_t> counts;
  uint64_t other = 0;
  for (const QemuTraceEvent& e : log.events) {
    auto it = counts.find(e.name);
    if (it != counts.end()) {
      ++it->second;
    } else if (counts.size() < kHostTraceMaxNames) {
      counts.emplace(e.name, 1);
    } else {
      ++other;
    }
  }
  json by_name = json::object();
  for (const auto& [name, n] : counts) by_name[name] = n;
  if (other != 0) by_name["(other)"] = other;
  json j = {{"file", std::string(kQemuTraceLogName)},
            {"bytes", copy.text.size()},
            {"file_bytes", copy.file_bytes},
            {"skipped_head_bytes", copy.skipped_head_bytes},
            {"events", log.events.size()},
            {"malformed", log.malformed_lines},
            {"dropped", log.dropped_lines},
            {"clock", "host CLOCK_REALTIME (µs)"},
            {"by_name", by_name}};
  if (!log.first_problem.empty()) j["first_problem"] = log.first_problem;
  if (!log.events.empty()) {
    j["first_realtime_ns"] = log.events.front().realtime_ns;
    j["last_realtime_ns"] = log.events.back().realtime_ns;
  }
  return j;
}

LibvirtLogTrace TraceLinesOfNewestStart(std::string_view log) {
  LibvirtLogTrace out;
  // libvirtd writes "2026-11-29 04:10:02.123+0000: starting up libvirt
  // version: 9.0.0, ..." before it runs QEMU; a QEMU message never starts
  // with a digit run and " " (`-msg timestamp=on` gives "2026-11-29T...").
  constexpr std::string_view kStart = ": starting up libvirt version:";
  size_t from = 0;
  for (size_t at = log.rfind(kStart); at != std::string_view::npos;
       at = at == 0 ? std::string_view::npos : log.rfind(kStart, at - 1)) {
    const size_t line = log.rfind('\n', at);
    const size_t begin = line == std::string_view::npos ? 0 : line + 1;
    if (begin + 11 <= at && log[begin] >= '0' && log[begin] <= '9' && log[begin + 10] == ' ') {
      const size_t end = log.find('\n', at);
      from = end == std::string_view::npos ? log.size() : end + 1;
      out.start_found = true;
      break;
    }
  }
  out.earlier_bytes = from;
  while (from < log.size()) {
    const size_t nl = log.find('\n', from);
    const size_t end = nl == std::string_view::npos ? log.size() : nl + 1;
    const std::string_view line = log.substr(from, end - from);
    from = end;
    size_t digits = 0;
    while (digits < line.size() && line[digits] >= '0' && line[digits] <= '9') ++digits;
    if (digits > 0 && digits < line.size() && line[digits] == '@') {
      out.text.append(line);
    } else {
      ++out.other_lines;
    }
  }
  return out;
}

void AttachQemuTraceLogStep(const std::filesystem::path& path, PendingCapture& pending,
                            CaptureManifest& manifest, bool libvirt_log) {
  Result<HostTraceCopy> copy = ReadQemuTraceLogTail(path);
  if (!copy.ok()) {
    manifest.extra["host_trace"] = {{"source", path.string()}, {"error", copy.error().message}};
    return;
  }
  json libvirt;
  if (libvirt_log) {
    LibvirtLogTrace kept = TraceLinesOfNewestStart(copy->text);
    libvirt = {{"newest_start_found", kept.start_found},
               {"earlier_bytes", kept.earlier_bytes},
               {"other_lines", kept.other_lines}};
    copy->text = std::move(kept.text);
  }
  json summary = HostTraceSummary(ParseQemuTraceLog(copy->text), *copy);
  summary["source"] = path.string();
  if (libvirt_log) summary["libvirt_log"] = std::move(libvirt);
  Status s = pending.WriteFile(kQemuTraceLogName, std::as_bytes(std::span(copy->text)));
  if (!s.ok()) {
    summary.erase("file");
    summary["error"] = "writing " + std::string(kQemuTraceLogName) + ": " + s.error().message;
  }
  manifest.extra["host_trace"] = std::move(summary);
}

}  // namespace hvtrace::hostd
