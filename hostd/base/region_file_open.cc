#include "region_file_open.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace hvtrace::hostd {

bool ProcessMapsFile(pid_t pid, dev_t dev, ino_t ino) {
  // "start-end perms offset MAJ:MIN inode path" per line.
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream fields(line);
    std::string range, perms, offset, device;
    unsigned long long inode = 0;
    if (!(fields >> range >> perms >> offset >> device >> inode) || inode != ino) continue;
    unsigned major_id = 0, minor_id = 0;
    if (std::sscanf(device.c_str(), "%x:%x", &major_id, &minor_id) == 2 && major_id == major(dev) &&
        minor_id == minor(dev)) {
      return true;
    }
  }
  return false;
}

Result<int> OpenRegionFileChecked(const RegionFileExpectation& expect) {
  const std::string where = expect.owner_label + ": region " + expect.path.string();
  if (expect.size == 0) return Error{expect.owner_label + ": region size is 0"};
  const int fd = ::open(expect.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return Error{where + ": cannot open: " + std::strerror(errno)};
  auto fail = [fd](std::string message) -> Error {
    ::close(fd);
    return Error{std::move(message)};
  };
  struct stat st {};
  if (::fstat(fd, &st) != 0) return fail(where + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return fail(where + " is not a regular file; refusing to read it");
  if (expect.owner_uid && st.st_uid != *expect.owner_uid && st.st_uid != 0) {
    return fail(where + " belongs to uid " + std::to_string(st.st_uid) + ", not to QEMU's user (" +
                std::to_string(*expect.owner_uid) + ") or root");
  }
  if (static_cast<uint64_t>(st.st_size) < expect.offset + expect.size) {
    return fail(where + " has " + std::to_string(st.st_size) + " bytes, less than offset " +
                std::to_string(expect.offset) + " + size " + std::to_string(expect.size));
  }
  if (expect.mapped_by > 0 && !ProcessMapsFile(expect.mapped_by, st.st_dev, st.st_ino)) {
    return fail(where + " is not the file QEMU pid " + std::to_string(expect.mapped_by) +
                " maps (was it replaced?)");
  }
  return fd;
}

}  // namespace hvtrace::hostd
