// Opening a VM's region file (the host file behind a guest-physical range)
// by its path, as hvtraced does when it adopts a libvirt domain or takes a
// QMP VM back after a restart. The path comes from a record or from
// libvirt's view of QEMU's command line, both of which a local user may
// have influenced (a directory they can write, a file they replaced), and
// the bytes read from it are the guest's. So the file must be what QEMU
// maps, not something standing at that path: never through a symlink,
// never a FIFO or device (O_NONBLOCK: no wait on one), a regular file as
// large as the range, owned by QEMU's user or root, and mapped by QEMU's
// process when that process is known and alive.
#ifndef HVTRACE_HOSTD_BASE_REGION_FILE_OPEN_H_
#define HVTRACE_HOSTD_BASE_REGION_FILE_OPEN_H_

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

struct RegionFileExpectation {
  std::string owner_label;  // "domain 'web1'", "VM 'demo'": names the VM in errors.
  std::filesystem::path path;
  uint64_t offset = 0;  // Of the range in the file.
  uint64_t size = 0;    // What hostd configured; never read from the guest.
  // The file must belong to this user or to root; nullopt: not checked.
  std::optional<uid_t> owner_uid;
  // When > 0, this process (QEMU) must map the file (/proc/PID/maps).
  pid_t mapped_by = -1;
};

// A read-only descriptor of the checked file (the caller owns it). Errors
// name the VM, the path and the check that failed.
Result<int> OpenRegionFileChecked(const RegionFileExpectation& expect);

// Whether process |pid| maps the file with device |dev| and inode |ino|.
bool ProcessMapsFile(pid_t pid, dev_t dev, ino_t ino);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_BASE_REGION_FILE_OPEN_H_
