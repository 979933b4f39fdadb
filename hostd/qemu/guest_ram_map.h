// Asks a running QEMU where the guest's RAM sits in its memory (guest_ram.h),
// over its QMP session: HMP `info mtree -f`, then `gpa2hva` per RAM range,
// then one read to check the daemon may read that QEMU's memory at all
// (ptrace rules: the same user and a dumpable QEMU, or CAP_SYS_PTRACE).
#ifndef HVTRACE_HOSTD_QEMU_GUEST_RAM_MAP_H_
#define HVTRACE_HOSTD_QEMU_GUEST_RAM_MAP_H_

#include <sys/types.h>

#include <functional>
#include <memory>

#include "guest_ram.h"
#include "qmp_client.h"

namespace hvtrace::hostd {

using GuestRamDone = std::function<void(Result<std::shared_ptr<const GuestRam>>)>;

// Calls |done| once, on |qmp|'s executor; an error says which step failed
// and for which QEMU pid. |pid| must be the process that answers on |qmp|
// (QmpClient::peer_pid): the reads go to it at the addresses it gave.
void AsyncMapGuestRam(std::shared_ptr<QmpClient> qmp, pid_t pid, GuestRamDone done);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_QEMU_GUEST_RAM_MAP_H_
