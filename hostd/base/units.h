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

// "16M" / "0x40000000" / "4096" / "64k" as the kernel parses memmap= sizes:
// a C integer (decimal, 0x hex, 0 octal) with an optional K, M or G suffix
// (binary units, either case). Overflow and junk are errors.
Result<uint64_t> ParseKernelSize(std::string_view text);

// A size flag: like ParseKernelSize, plus T, an optional trailing "B" or
// "iB" ("16MiB", "1GB" = 1 GiB), and |bare_unit| for a number without a
// suffix (e.g. kMiB for `--memory 1088`, 1 for byte counts).
Result<uint64_t> ParseSize(std::string_view text, uint64_t bare_unit = 1);

// A duration flag: a non-negative integer with ms, s, m or h ("500ms",
// "30s", "2m"); a bare number is taken in |bare_unit|.
Result<std::chrono::milliseconds> ParseDuration(
    std::string_view text, std::chrono::milliseconds bare_unit = std::chrono::seconds(1));

// "16M", "1G", "4096" — the shortest exact spelling ParseSize reads back.
std::string SizeText(uint64_t bytes);

// "0x40000000": an address or size as QEMU and the kernel print them.
std::string HexText(uint64_t value);
// "00c0ffee12345678": a 64-bit id at fixed width (region ids).
std::string HexId(uint64_t value);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_UNITS_H_
