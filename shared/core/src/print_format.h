// Checks of an event's print format (the "print fmt:" line of a tracefs
// format), which libtraceevent parses and evaluates with less care than the
// rest of the format: see EventFormat's divisor_fields, length_fields and
// unchecked_print in hvtrace/format.h. Used by format.cc only.
#ifndef HVTRACE_SHARED_CORE_SRC_PRINT_FORMAT_H_
#define HVTRACE_SHARED_CORE_SRC_PRINT_FORMAT_H_

#include <string>
#include <string_view>

#include "hvtrace/format.h"

namespace hvtrace::format_internal {

// Lexical helpers both format.cc and print_format.cc use.
inline std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

inline bool IsIdentChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

inline bool IsIdentifier(std::string_view s) {
  if (s.empty() || s.size() > kMaxNameSize) return false;
  for (char c : s) {
    if (!IsIdentChar(c)) return false;
  }
  return true;
}

// Returns an empty string when |fmt| is shaped like a kernel print format,
// else what is wrong with it.
std::string CheckPrintFormat(std::string_view fmt);

// Sorts the divisors and length arguments of |ev|->print_fmt (already
// accepted by CheckPrintFormat) into divisor_fields, length_fields and
// unchecked_print.
void FindPrintHazards(EventFormat* ev);

}  // namespace hvtrace::format_internal

#endif  // HVTRACE_SHARED_CORE_SRC_PRINT_FORMAT_H_
