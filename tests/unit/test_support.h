// Small helpers the unit and e2e tests share: reading files, a self-removing
// temporary directory, running a tool (trace-cmd) for its output, and reading
// trace-cmd's merged report.
#ifndef HVTRACE_TESTS_UNIT_TEST_SUPPORT_H_
#define HVTRACE_TESTS_UNIT_TEST_SUPPORT_H_

#include <stdlib.h>
#include <sys/wait.h>
#include <zstd.h>

#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace hvtrace::test_support {

// The whole file, or "" when it cannot be read (the test's own checks then
// fail with what they expected).
inline std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

#ifdef HVTRACE_FIXTURES_DIR
// A file under tests/fixtures (|rel| from there), or "" (see ReadText).
inline std::string ReadFixture(const std::string& rel) {
  return ReadText(std::string(HVTRACE_FIXTURES_DIR) + "/" + rel);
}
#endif

// The child processes the threads of this process have now
// (/proc/self/task/*/children): a decoder's trial child shows here.
inline size_t ChildProcesses() {
  size_t n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::istringstream pids(ReadText((task.path() / "children").string()));
    for (std::string pid; pids >> pid;) ++n;
  }
  return n;
}

// The bytes of |s|, as region and page code takes them.
inline std::vector<std::byte> Bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()),
          reinterpret_cast<const std::byte*>(s.data()) + s.size()};
}

// A zstd-packed fixture (one frame with its content size), or empty.
inline std::vector<std::byte> Unzstd(const std::string& path) {
  const std::string packed = ReadText(path);
  const unsigned long long size = ZSTD_getFrameContentSize(packed.data(), packed.size());
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN) return {};
  std::vector<std::byte> out(size);
  const size_t n = ZSTD_decompress(out.data(), out.size(), packed.data(), packed.size());
  if (ZSTD_isError(n) || n != size) return {};
  return out;
}

// The command's standard output (append "2>&1" for its errors too).
inline std::string RunCommand(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// What a command printed on standard output, and how it ended.
struct CommandResult {
  int status = -1;  // Its exit status; -1 when it could not run or was killed.
  std::string out;
};

inline CommandResult RunCommandStatus(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// A fresh directory under $TMPDIR, removed with everything in it.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "hvtrace-test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (tag + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// The line of |text| that ends with |marker| (so "M-1" does not match
// "M-10"), or "".
inline std::string MarkerLine(const std::string& text, const std::string& marker) {
  for (size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at + 1)) {
    const size_t end = at + marker.size();
    if (end != text.size() && text[end] != '\n') continue;
    const size_t start = text.rfind('\n', at);
    return text.substr(start == std::string::npos ? 0 : start + 1,
                       end - (start == std::string::npos ? 0 : start + 1));
  }
  return "";
}

// "FILE EVENT" per event line of `trace-cmd report -i A -i B ...` (lines
// "   FILE:   comm-pid [cpu]TS: event: fields"); each such line as printed
// is appended to |raw| when given. The timeline tests compare it with
// `hvtrace show --timeline`.
inline std::vector<std::string> TraceCmdOrder(const std::string& report,
                                              std::vector<std::string>* raw = nullptr) {
  std::vector<std::string> out;
  std::istringstream in(report);
  // Before the first event after lost ones trace-cmd prints "CPU:N [EVENTS
  // DROPPED]" (or "[N EVENTS DROPPED]") and a newline after the file's name
  // (trace-read.c, trace_show_data): that event's line has no name of its own.
  std::string dropped_in;
  for (std::string line; std::getline(in, line);) {
    line.erase(0, line.find_first_not_of(' '));
    if (line.find(": CPU:") != std::string::npos && line.ends_with("EVENTS DROPPED]")) {
      dropped_in = line.substr(0, line.find(':'));
      continue;
    }
    if (!dropped_in.empty()) {
      line = dropped_in + ": " + line;
      dropped_in.clear();
    }
    const size_t file_end = line.find(':');
    const size_t cpu = line.find(']');
    if (file_end == std::string::npos || cpu == std::string::npos) continue;
    const size_t ts_end = line.find(": ", cpu);
    const size_t ev_end = ts_end == std::string::npos ? ts_end : line.find(": ", ts_end + 2);
    if (ev_end == std::string::npos) continue;
    out.push_back(line.substr(0, file_end) + " " + line.substr(ts_end + 2, ev_end - ts_end - 2));
    if (raw != nullptr) raw->push_back(line);
  }
  return out;
}

}  // namespace hvtrace::test_support

#endif  // HVTRACE_TESTS_UNIT_TEST_SUPPORT_H_
