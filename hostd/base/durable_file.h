// Writing the small files hvtraced must find whole after a crash (VM records,
// published metadata, upload queue entries, recovery records): the old
// contents or the new, never a mix or a short file, and on disk before the
// caller goes on (a capture is reported only once its queue entry is).
#ifndef HVTRACE_HOSTD_DURABLE_FILE_H_
#define HVTRACE_HOSTD_DURABLE_FILE_H_

#include <sys/types.h>

#include <cstddef>
#include <filesystem>
#include <string_view>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

// Replaces |path| by |data|: written to a hidden file beside it
// (".NAME.tmp", never through a symlink), fsync'd, renamed over |path|, then
// the directory fsync'd. A new file gets |mode| (before the umask). On error
// the hidden file is removed and |path| is as it was; the error names |path|
// and, for a short write, the offset.
Status WriteFileDurably(const std::filesystem::path& path, std::string_view data,
                        mode_t mode = 0640);

// WriteFileDurably in two halves, for a file whose contents can be made
// durable before the moment it may appear (a capture's recovery record,
// written while the copy it vouches for is still being made): Stage writes
// and fsyncs the hidden file, Publish renames it over |path| and fsyncs the
// directory. A failed Stage removes the hidden file.
Status StageFileDurably(const std::filesystem::path& path, std::string_view data,
                        mode_t mode = 0640);
Status PublishStagedFile(const std::filesystem::path& path);

// fsync of the directory |dir|: makes the names created or renamed in it
// durable.
Status FsyncDir(const std::filesystem::path& dir);

// The largest VM record (qmp_vm.json, libvirt_vm.json) read back: a few
// hundred bytes written, room for long paths.
inline constexpr size_t kVmRecordMaxBytes = 64 * 1024;

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_DURABLE_FILE_H_
