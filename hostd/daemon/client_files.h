// Files a client hands hvtraced as open descriptors (fd_passing.h): checked,
// and for boot copied into a file the daemon creates itself.
//
// Why a copy and not /proc/self/fd/N: the kernel and initrd are read more
// than once and at different times (the KVM probe, QEMU's -kernel/-initrd,
// the kernel's SHA-256 that keys the formats cache, a later formats harvest
// and a re-adopting daemon after a restart). The client still owns its file
// and could rewrite it between those reads, and a descriptor does not
// survive a daemon restart; a private copy in a root-only directory is the
// same bytes every time. The cost is one copy (a 6.12 bzImage is ~13 MiB),
// within the caps below.
#ifndef HVTRACE_HOSTD_CLIENT_FILES_H_
#define HVTRACE_HOSTD_CLIENT_FILES_H_

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "fd_passing.h"
#include "hvtrace/result.h"

namespace hvtrace::hostd {

// Largest kernel and initrd hvtraced copies; more is refused before a byte is
// copied.
inline constexpr uint64_t kMaxKernelBytes = 256ull << 20;
inline constexpr uint64_t kMaxInitrdBytes = 1ull << 30;
// Largest boot range `adopt --boot-region` may name: the same as boot's
// --trace-size limit; the capture service sizes its copy buffers from it.
inline constexpr uint64_t kMaxAdoptRegionBytes = 1ull << 30;

// |fd| must be a regular file opened for reading of at most |max_bytes|;
// |what| ("kernel /path") names it in errors. Its size on success.
Result<uint64_t> CheckClientFile(int fd, const std::string& what, uint64_t max_bytes);

// Copies the whole of |fd| (already checked) into |dest|, which is created
// O_EXCL|O_NOFOLLOW, mode 0600 (an old file there is removed first), reading
// at most |max_bytes| + 1 so a file that grows meanwhile is refused, not
// copied without end.
Status CopyClientFile(int fd, const std::string& what, const std::filesystem::path& dest,
                      uint64_t max_bytes);

// The uid owning the peer end of the Unix socket |path| (SO_PEERCRED after a
// non-blocking connect): how hvtraced checks, on the connection itself, that
// a QMP socket a client names belongs to that client or to root.
Result<uid_t> UnixSocketPeerUid(const std::string& path);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CLIENT_FILES_H_
