// A unified diff of two texts (diffutils' `diff -u`), for showing a user
// what `hvtrace setup` changes in a domain definition.
#ifndef HVTRACE_HOSTD_CLI_UNIFIED_DIFF_H_
#define HVTRACE_HOSTD_CLI_UNIFIED_DIFF_H_

#include <string>
#include <string_view>

#include "hvtrace/result.h"

namespace hvtrace::cli {

// Empty when the texts are equal; else "--- |old_name|", "+++ |new_name|"
// and the hunks. An error when diff cannot run.
Result<std::string> UnifiedDiff(std::string_view old_text, std::string_view new_text,
                                std::string_view old_name, std::string_view new_name);

}  // namespace hvtrace::cli

#endif  // HVTRACE_HOSTD_CLI_UNIFIED_DIFF_H_
