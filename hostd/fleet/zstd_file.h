// Streaming zstd compression and decompression of whole files, for region
// files in the store (fleet_keys.h: *.bin travel as *.bin.zst).
#ifndef HVTRACE_HOSTD_FLEET_ZSTD_FILE_H_
#define HVTRACE_HOSTD_FLEET_ZSTD_FILE_H_

#include <cstdint>
#include <filesystem>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

// Compresses |in| into a new file |out| (level 3, one frame, content size
// recorded), fsynced. Errors name the file.
Status CompressFile(const std::filesystem::path& in, const std::filesystem::path& out);

// Decompresses |in| into a new file |out|, refusing output beyond
// |max_bytes| (the store's bytes are untrusted: a small frame can claim
// gigabytes). Errors name the file.
Status DecompressFile(const std::filesystem::path& in, const std::filesystem::path& out,
                      uint64_t max_bytes);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_FLEET_ZSTD_FILE_H_
