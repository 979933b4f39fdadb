// zlib helpers shared by the region's text areas and the metadata channel:
// both carry guest-compressed bytes that the host inflates into a size the
// frame states and never past it.
#ifndef HVTRACE_CORE_ZLIB_UTIL_H_
#define HVTRACE_CORE_ZLIB_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/result.h"

namespace hvtrace::zlib_util {

uint32_t Crc32(std::string_view bytes);

// compress2 at |level|; empty only on out of memory.
std::vector<std::byte> Deflate(std::string_view raw, int level);

// Inflates |stored| into exactly |raw_size| bytes: an error when the stream
// is not zlib, ends early, inflates to more, or leaves compressed bytes over.
// The caller bounds |raw_size| first (this allocates it).
Result<std::string> InflateExact(std::span<const std::byte> stored, uint32_t raw_size);

}  // namespace hvtrace::zlib_util

#endif  // HVTRACE_CORE_ZLIB_UTIL_H_
