// Paths hvtraced creates or trusts while it runs as root next to local users
// who may race it: a file planted under the name it is about to use, a
// symlink in its place, or a directory that someone else can write (and so
// swap what is in it after every check).
//
// The rule: a path is trusted when every component, from / down, is not a
// symlink, is owned by root or by this process's user, and cannot be written
// by anyone else (group/other write bits clear; a root-owned sticky directory
// such as /tmp counts as safe, since nobody else can rename or remove what is
// ours in it). Once a path passes, nobody but root or us can change what it
// names, so a check followed by an open is not a race.
#ifndef HVTRACE_HOSTD_PRIVATE_PATH_H_
#define HVTRACE_HOSTD_PRIVATE_PATH_H_

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>

#include "hvtrace/result.h"
#include "unique_fd.h"

namespace hvtrace::hostd {

// Checks |path| (made absolute first) and every directory above it as said
// above. The error names the component, its owner and mode, and |what|
// (e.g. "formats cache").
Status CheckTrustedPath(const std::filesystem::path& path, const std::string& what);

// Creates |dir| (and missing parents) with mode 0700 and checks it: a
// directory owned by this process's user that nobody else may enter, under
// a trusted path.
Status EnsurePrivateDir(const std::filesystem::path& dir, const std::string& what);

// The directory of guest memory files (<run_dir>/mem): like
// EnsurePrivateDir, except that QEMU's group may traverse it (0710) so a
// QEMU that dropped root can open, by name, the files the daemon made for
// it there; nobody else may enter, and nobody but this daemon's user may
// list, create or rename entries. With |qemu_gid| the directory is given to
// that group and made 0710; without, 0700 and 0710 are both accepted (other
// VMs' QEMUs may need the latter) and nothing is loosened.
Status EnsureGuestMemoryDir(const std::filesystem::path& dir, std::optional<gid_t> qemu_gid,
                            const std::string& what);

// Like EnsurePrivateDir, but an existing directory of ours that an older
// version left readable by others (e.g. 0755) is tightened to 0700 instead of
// refused (one others could write stays refused); |tightened| says whether it was. For caches whose
// content is not secret-by-construction yet must not be read or planted by other users.
Status TightenPrivateDir(const std::filesystem::path& dir, const std::string& what,
                         bool* tightened = nullptr);

// Creates a new file at |path| with O_CREAT|O_EXCL|O_NOFOLLOW and |mode|:
// never an existing file, never through a symlink. The error says what is
// already there.
Result<UniqueFd> CreateExclusiveFile(const std::filesystem::path& path, mode_t mode,
                                     const std::string& what);

// "owner uid N, mode 0755": for error messages.
std::string DescribeOwnerAndMode(const std::filesystem::path& path);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_PRIVATE_PATH_H_
