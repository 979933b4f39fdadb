// A unified diff (`diff -u` format, 3 lines of context) of two texts, for
// showing a user what `hvtrace setup` changes in a domain definition. Line
// based, longest common subsequence: meant for files of a few hundred lines.
#ifndef HVTRACE_HOSTD_CLI_UNIFIED_DIFF_H_
#define HVTRACE_HOSTD_CLI_UNIFIED_DIFF_H_

#include <string>
#include <string_view>

namespace hvtrace::cli {

// Empty when the texts are equal; else "--- |old_name|", "+++ |new_name|"
// and the hunks.
std::string UnifiedDiff(std::string_view old_text, std::string_view new_text,
                        std::string_view old_name, std::string_view new_name);

}  // namespace hvtrace::cli

#endif  // HVTRACE_HOSTD_CLI_UNIFIED_DIFF_H_
