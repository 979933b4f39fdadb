// Reading the files hvtraced keeps (formats cache, capture inputs, recovery
// records): whole, bounded, never through a symlink. Someone else may own the
// directory or plant a symlink, and a file may be truncated under us, so each
// of those is an error with the path, not a crash or a huge allocation.
#ifndef HVTRACE_HOSTD_CAPPED_FILE_H_
#define HVTRACE_HOSTD_CAPPED_FILE_H_

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

// The whole of the regular file at |path| (not followed if a symlink) when it
// holds at most |cap| bytes. |missing_ok|: a file that does not exist reads
// as empty instead of failing.
Result<std::string> ReadCappedFile(const std::filesystem::path& path, size_t cap,
                                   bool missing_ok = false);
// The same, as bytes (region copies).
Result<std::vector<std::byte>> ReadCappedFileBytes(const std::filesystem::path& path, size_t cap);

// The last |max_bytes| bytes of the regular file at |path| (not followed if
// a symlink), or "" when it cannot be read: a log's end for an error message
// (QEMU's log, a probe's console), where what decides is at the end.
std::string ReadFileTail(const std::string& path, size_t max_bytes);

// Whether the regular files at |a| and |b| hold the same bytes (false when
// either cannot be read). Reads both in 1 MiB pieces.
bool SameContents(const std::filesystem::path& a, const std::filesystem::path& b);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CAPPED_FILE_H_
