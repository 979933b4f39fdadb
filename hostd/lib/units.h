// Sizes and durations as people and the kernel write them. One parser for
// every command-line flag and config key, so `16M`, `1G`, `30s` and `500ms`
// mean the same everywhere.
#ifndef HVTRACE_HOSTD_UNITS_H_
#define HVTRACE_HOSTD_UNITS_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

// A size flag: a C integer (decimal, 0x hex, 0 octal, as the kernel reads
// memmap= sizes) with an optional K, M, G or T suffix (binary units, either
// case) and an optional trailing "B" or "iB" ("16MiB", "1GB" = 1 GiB);
// |bare_unit| scales a number without a suffix (e.g. kMiB for
// `--memory 1088`, 1 for byte counts). Signs, junk and overflow are errors.
// (The kernel's own memmap= parser, without T and B, is ParseKernelSize in
// libvirt_backend.h.)
Result<uint64_t> ParseSize(std::string_view text, uint64_t bare_unit = 1);

// A duration flag: a non-negative decimal integer with ms, s, m (or min) or
// h ("500ms", "30s", "2m"); a bare number is taken in |bare_unit|. At most a
// year.
Result<std::chrono::milliseconds> ParseDuration(
    std::string_view text, std::chrono::milliseconds bare_unit = std::chrono::seconds(1));

// "16M", "1G", "4096" — the shortest exact spelling ParseSize reads back.
std::string SizeText(uint64_t bytes);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_UNITS_H_
