// Capping a log file that another process (QEMU, for a guest's console)
// keeps open and appends to.
//
// The writer must append (O_APPEND: QEMU's logappend=on / append=on), so
// after the file is truncated its next write lands at offset 0. Rotation is
// copy-then-truncate: the tail goes to <path>.1 (older copies shift to .2,
// …), then <path> is truncated in place; what the writer appends between the
// copy and the truncation is lost, which a log can afford and a full disk
// cannot. Disk use stays at most |files| × |max_bytes| plus what the writer
// adds between two checks.
#ifndef HVTRACE_HOSTD_LOG_ROTATION_H_
#define HVTRACE_HOSTD_LOG_ROTATION_H_

#include <cstdint>
#include <filesystem>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

// Rotates |path| when it holds more than |max_bytes|: keeps its last
// |max_bytes| as <path>.1 (when |files| > 1; <path>.k moves to .k+1, up to
// |files| - 1) and truncates it. A missing file is fine; a symlink or
// anything but a regular file is an error naming the path (never followed).
// Returns whether it rotated.
Result<bool> RotateLogIfLarger(const std::filesystem::path& path, uint64_t max_bytes, int files);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_LOG_ROTATION_H_
