// printk:console events as the 6.12 and 7.3 guests write them, for the
// tests of the kernel log readers (shared/decode console_log, hostd/decode
// crash_step).
#ifndef HVTRACE_TESTS_UNIT_CONSOLE_EVENT_FIXTURE_H_
#define HVTRACE_TESTS_UNIT_CONSOLE_EVENT_FIXTURE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace hvtrace::test_support {

// struct trace_entry's fields, as every format lists them first.
inline constexpr const char* kCommonFormatFields =
    "format:\n"
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n";

inline constexpr uint16_t kConsoleEventId = 5;

// events/printk/console/format (id kConsoleEventId).
inline std::string ConsoleFormatText() {
  return std::string("name: console\nID: 5\n") + kCommonFormatFields +
         "\tfield:__data_loc char[] msg;\toffset:8;\tsize:4;\tsigned:0;\n\n"
         "print fmt: \"%s\", __get_str(msg)\n";
}

// A record as trace_console writes it: trace_entry, the __data_loc
// reference, then the text and its NUL (__dynamic_array(char, msg, len + 1)).
inline std::vector<std::byte> ConsoleRecord(std::string_view text, int32_t pid = 209,
                                            uint16_t id = kConsoleEventId) {
  std::vector<std::byte> p(12 + text.size() + 1, std::byte{0});
  std::memcpy(p.data(), &id, 2);
  std::memcpy(p.data() + 4, &pid, 4);
  const uint32_t ref = (static_cast<uint32_t>(text.size() + 1) << 16) | 12u;
  std::memcpy(p.data() + 8, &ref, 4);
  std::memcpy(p.data() + 12, text.data(), text.size());
  return p;
}

}  // namespace hvtrace::test_support

#endif  // HVTRACE_TESTS_UNIT_CONSOLE_EVENT_FIXTURE_H_
