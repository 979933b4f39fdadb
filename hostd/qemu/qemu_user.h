// Which user the QEMUs hvtraced boots run as (config qemu_user; QEMU's
// -run-with user= or -runas, qemu_caps.h), and what a running QEMU's credentials are.
//
// A QEMU device-emulation escape gets the rights of QEMU's user, so QEMU
// does not run as root unless the configuration says so: by default it is
// kDefaultQemuUser, a system user the package creates (sysusers.d) in group
// kvm. QEMU starts as root, opens everything on its command line (the boot
// range's backing file, /dev/kvm, its sockets, logs and the kernel), then
// drops to that user. What it opens later is made for that user by the
// daemon, which keeps ownership and grants QEMU's group what it needs: the
// guest memory directory (traverse only) and the files QEMU opens by name
// after the drop (an attach region, a memsave target).
#ifndef HVTRACE_HOSTD_QEMU_USER_H_
#define HVTRACE_HOSTD_QEMU_USER_H_

#include <sys/types.h>

#include <optional>
#include <string>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

inline constexpr const char* kDefaultQemuUser = "hvtrace-qemu";

struct QemuUser {
  std::string run_as;  // Who QEMU drops to (RunAsArgs); empty: QEMU stays root.
  uid_t uid = 0;
  gid_t gid = 0;
  // Set when QEMU will run as root: why, for the daemon's log.
  std::string warning;
};

// Resolves config qemu_user for VM |vm|: "root" (or a user whose uid is 0)
// runs QEMU as root, with a warning; empty means kDefaultQemuUser when that
// user exists, else root with a warning that says how to create it; any
// other name must exist (the error names it and the VM).
Result<QemuUser> ResolveQemuUser(const std::string& configured, const std::string& vm);

// The effective uid and gid of process |pid| (/proc/PID/status): who a
// running QEMU is now, after any -runas.
struct ProcessCredentials {
  uid_t uid = 0;
  gid_t gid = 0;
};
std::optional<ProcessCredentials> ReadProcessCredentials(pid_t pid);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_QEMU_USER_H_
