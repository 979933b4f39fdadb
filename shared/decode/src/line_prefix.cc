// LinePrefix (see line_prefix.h).
#include "line_prefix.h"

#include <cstring>

#include "event_text.h"

namespace hvtrace {

size_t LinePrefix::FormatTask(const char* comm, size_t comm_len, int pid, uint32_t cpu, char* p) {
  char* const start = p;
  if (comm_len < 16) {
    std::memset(p, ' ', 16 - comm_len);
    p += 16 - comm_len;
  }
  std::memcpy(p, comm, comm_len);
  p += comm_len;
  *p++ = '-';
  char num[24];
  char* end = num + sizeof(num);
  char* d = FormatUintBackwards(
      pid < 0 ? 0 - static_cast<uint64_t>(static_cast<int64_t>(pid)) : static_cast<uint64_t>(pid),
      end);
  if (pid < 0) *--d = '-';
  size_t n = static_cast<size_t>(end - d);
  std::memcpy(p, d, n);
  p += n;
  for (; n < 5; ++n) *p++ = ' ';
  *p++ = ' ';
  *p++ = '[';
  d = FormatUintBackwards(cpu, end);
  for (n = static_cast<size_t>(end - d); n < 3; ++n) *p++ = '0';
  std::memcpy(p, d, static_cast<size_t>(end - d));
  p += end - d;
  *p++ = ']';
  return static_cast<size_t>(p - start);
}

void LinePrefix::AppendSlow(const char* comm, size_t comm_len, int pid, uint32_t cpu,
                            uint64_t timestamp, std::string_view latency, std::string* out) const {
  AppendPadLeft(out, comm, comm_len, 16);
  out->push_back('-');
  AppendIntPadRight(out, pid, 5);
  out->append(" [");
  AppendUintZeroPad(out, cpu, 3);
  out->push_back(']');
  if (!latency.empty()) {
    out->push_back(' ');
    out->append(latency);
  }
  if (time_in_usecs_) {
    uint64_t t = (timestamp + 500) / 1000;
    out->push_back(' ');
    AppendUintPadLeft(out, t / 1000000, 5);
    out->push_back('.');
    AppendUintZeroPad(out, t % 1000000, 6);
  } else {
    AppendUintPadLeft(out, timestamp, 12);
  }
  out->push_back(':');
}

bool LinePrefix::PlainAscii(std::string_view text) {
  for (char c : text) {
    if (c < 0x20 || c > 0x7e) return false;  // char is signed: bytes >= 0x80 too.
  }
  return true;
}

bool LinePrefix::Append(const char* comm, int pid, uint32_t cpu, uint64_t timestamp,
                        std::string_view latency, std::string* out) {
  const size_t comm_len = std::strlen(comm);
  if (comm_len >= kMaxComm || !time_in_usecs_ || latency.size() > kMaxLatency) {
    AppendSlow(comm, comm_len, pid, cpu, timestamp, latency, out);
    return false;
  }
  Task& task = tasks_[cpu % kTasks];
  if (!task.valid || task.pid != pid || task.cpu != cpu || task.comm_len != comm_len ||
      std::memcmp(task.comm, comm, comm_len) != 0) {
    task.valid = true;
    task.pid = pid;
    task.cpu = cpu;
    task.comm_len = static_cast<uint8_t>(comm_len);
    std::memcpy(task.comm, comm, comm_len);
    task.printable = PlainAscii(std::string_view(comm, comm_len));
    // At most 63 + 1 + 11 + 2 + 10 + 1 bytes: fits text.
    task.len = static_cast<uint8_t>(FormatTask(comm, comm_len, pid, cpu, task.text));
  }
  const uint64_t t = (timestamp + 500) / 1000;
  const uint64_t seconds = t / 1000000;
  if (seconds != seconds_) {
    seconds_ = seconds;
    char* p = seconds_text_;
    *p++ = ' ';
    char num[24];
    char* end = num + sizeof(num);
    char* d = FormatUintBackwards(seconds, end);
    for (size_t n = static_cast<size_t>(end - d); n < 5; ++n) *p++ = ' ';
    std::memcpy(p, d, static_cast<size_t>(end - d));
    p += end - d;
    *p++ = '.';
    seconds_len_ = static_cast<uint8_t>(p - seconds_text_);
  }
  char buf[sizeof(task.text) + 1 + kMaxLatency + sizeof(seconds_text_) + 8];
  std::memcpy(buf, task.text, sizeof(task.text));
  char* p = buf + task.len;
  if (!latency.empty()) {
    *p++ = ' ';
    std::memcpy(p, latency.data(), latency.size());
    p += latency.size();
  }
  std::memcpy(p, seconds_text_, sizeof(seconds_text_));
  p += seconds_len_;
  FormatSixDigits(static_cast<uint32_t>(t % 1000000), p);
  p[6] = ':';
  p += 7;
  out->append(buf, static_cast<size_t>(p - buf));
  return task.printable && latency.empty();
}

}  // namespace hvtrace
