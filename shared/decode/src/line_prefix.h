// The start of each text line: "%16s-%-5d [%03d]" (comm, pid, cpu), the
// latency column when given (" d.h2.", trace-cmd 3.3's default), then
// " %5llu.%06llu:" (usecs) or "%12llu:" (raw clock), as trace-cmd prints it.
//
// Hand-written for speed, with two caches: the "comm-pid [cpu]" part of the
// last record of each CPU (consecutive events of a CPU mostly come from one
// task) and the seconds of the last time stamp. Formatting all of it for
// every record was 14% of `hvtrace report` on bench/large.dat (perf,
// 2026-11-25), most of it in small variable-length memcpy calls.
#ifndef HVTRACE_SHARED_DECODE_SRC_LINE_PREFIX_H_
#define HVTRACE_SHARED_DECODE_SRC_LINE_PREFIX_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace hvtrace {

class LinePrefix {
 public:
  explicit LinePrefix(bool time_in_usecs) : time_in_usecs_(time_in_usecs) {}
  // |latency|: libtraceevent's latency text for the record, or empty for none.
  // True when all it appended is printable ASCII (0x20-0x7e), which
  // MakePrintableFrom would leave as it is: the caller may then start that
  // scan after it. False says nothing (the slow path does not look).
  bool Append(const char* comm, int pid, uint32_t cpu, uint64_t timestamp, std::string_view latency,
              std::string* out);

  // Whether |text| is all printable ASCII (0x20-0x7e).
  static bool PlainAscii(std::string_view text);

 private:
  // Comms longer than this (not a kernel's, which are 16 bytes) are not
  // cached.
  static constexpr size_t kMaxComm = 64;
  // Longer latency text (not libtraceevent's, which is 5 or 6 bytes) takes
  // the slow path.
  static constexpr size_t kMaxLatency = 16;
  struct Task {
    bool valid = false;
    int pid = 0;
    uint32_t cpu = 0;
    uint8_t comm_len = 0;
    uint8_t len = 0;         // Of text.
    bool printable = false;  // The comm is PlainAscii.
    char comm[kMaxComm];
    char text[128];  // Formatted; copied whole (a fixed-size copy inlines).
  };
  static constexpr size_t kTasks = 64;  // Direct-mapped by CPU.

  void AppendSlow(const char* comm, size_t comm_len, int pid, uint32_t cpu, uint64_t timestamp,
                  std::string_view latency, std::string* out) const;
  static size_t FormatTask(const char* comm, size_t comm_len, int pid, uint32_t cpu, char* p);

  const bool time_in_usecs_;
  Task tasks_[kTasks];
  uint64_t seconds_ = UINT64_MAX;  // Of seconds_text_.
  uint8_t seconds_len_ = 0;
  char seconds_text_[32];  // " %5llu."
};

}  // namespace hvtrace

#endif  // HVTRACE_SHARED_DECODE_SRC_LINE_PREFIX_H_
