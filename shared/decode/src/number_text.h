// The compiled printers' native integer conversions (event_printer.cc,
// NumberStep): printf's "%[-][0][width]{d,i,u,x,X,o}" of a value that is
// already cast to its length modifier's type, after the literal text that
// precedes the conversion in the print format.
//
// The prefix, padding, sign and digits are made in one local buffer (the
// digits written in place, their count first) and appended once: one append
// per number instead of two, and one printing step fewer. On bench/large.dat,
// where 88 % of the events are sys_enter/exit_read/write ("fd: 0x%08lx, buf:
// 0x%08lx, count: 0x%08lx"), FormatPrinter::Print went from 959 M to 873 M
// instructions (callgrind; 2,654 M -> 2,564 M for the whole report).
#ifndef HVTRACE_SHARED_DECODE_SRC_NUMBER_TEXT_H_
#define HVTRACE_SHARED_DECODE_SRC_NUMBER_TEXT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace hvtrace {

struct NumberText {
  static constexpr size_t kMaxPrefix = 32;
  static constexpr int kMaxWidth = 1000;

  // Takes |text| as the literal printed before the number; false when it is
  // longer than kMaxPrefix (the caller prints it itself).
  bool SetPrefix(std::string_view text);
  // Appends the prefix and the number: |sv| for 'd' and 'i', else |uv|.
  void Append(int64_t sv, uint64_t uv, std::string* out) const;

  char prefix[kMaxPrefix] = {};
  uint8_t prefix_len = 0;
  bool left = false;  // '-'
  bool zero = false;  // '0'
  int width = 0;      // At most kMaxWidth.
  char conv = 'd';    // 'd', 'i', 'u', 'x', 'X' or 'o'.
};

}  // namespace hvtrace

#endif  // HVTRACE_SHARED_DECODE_SRC_NUMBER_TEXT_H_
