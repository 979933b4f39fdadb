// Disk-booted guests for e2e tests: a VM that boots from its own disk image
// (boot loader, kernel and initrd inside it), like the distro VMs users run.
// hostd::Vm always boots a kernel file, so this launches QEMU itself with the
// same conventions as the harness (console socket + log file, QMP socket,
// pvpanic with panic=pause, single-threaded TCG) and the disk with
// snapshot=on: the cached image is never written.
#ifndef HVTRACE_TESTS_E2E_DISK_GUEST_H_
#define HVTRACE_TESTS_E2E_DISK_GUEST_H_

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "hvtrace/result.h"
#include "qmp_client.h"
#include "vm_console.h"

namespace hvtrace::e2e {

struct DiskImage {
  std::string disk;     // qcow2, to be opened with snapshot=on only.
  std::string release;  // uname -r of the kernel inside the image.
};

// A Debian release qemu-scripts/build-debian-image.sh builds an image of:
// `--suite |suite|` writes build/guest/|guest|/, with the backports kernel
// build-guest.sh resolves for `--kernel |kernel|`.
struct DebianRelease {
  std::string suite;   // "bookworm"
  std::string guest;   // "debian12": the output directory's name.
  std::string kernel;  // "6.12": the kernel series inside the image.
};
inline const DebianRelease kDebian12{"bookworm", "debian12", "6.12"};
inline const DebianRelease kDebian13{"trixie", "debian13", "7.3"};
// "debian13 (trixie, 7.3)" in gtest's messages about a parameter.
void PrintTo(const DebianRelease& release, std::ostream* os);

// The image of |release| (qemu-scripts/build-debian-image.sh), brought up to
// date by running the script (cached: a no-op unless the agent or the recipe
// changed). |skip_reason| is set, and an error returned, when the image cannot
// be built for a reason outside the project (the script's exit status 75: no
// network and nothing cached); every other failure is a plain error, and so
// is an image whose kernel is not of |release|.kernel's series.
Result<DiskImage> FindDebianImage(std::string* skip_reason,
                                  const DebianRelease& release = kDebian12);

class DiskGuest {
 public:
  explicit DiskGuest(const std::string& tag);
  // Quits QEMU (QMP, then SIGKILL) and removes its sockets and logs.
  ~DiskGuest();
  DiskGuest(const DiskGuest&) = delete;
  DiskGuest& operator=(const DiskGuest&) = delete;

  // Starts QEMU on |image| (plus |extra_args|), connects the console (QEMU
  // waits for it, so nothing of the boot is missed) and QMP. Does not wait
  // for the guest: tests wait for the console lines they care about.
  Status Boot(const DiskImage& image, const std::vector<std::string>& extra_args = {});

  // ACPI power button (QMP system_powerdown), then waits for QEMU to exit.
  Status PowerOff(std::chrono::milliseconds timeout);

  hostd::GuestConsole& console() { return *console_; }
  hostd::QmpSyncClient& qmp() { return *qmp_; }
  // Everything the guest wrote to ttyS0 so far (QEMU's log file of it).
  std::string ConsoleLog() const;
  // Console tail and QEMU's stderr, for failure messages.
  std::string Diagnostics() const;

 private:
  bool Reap(std::chrono::milliseconds timeout);

  std::string dir_;
  pid_t pid_ = -1;
  int wait_status_ = 0;
  std::unique_ptr<hostd::GuestConsole> console_;
  std::unique_ptr<hostd::QmpSyncClient> qmp_;
};

}  // namespace hvtrace::e2e

#endif  // HVTRACE_TESTS_E2E_DISK_GUEST_H_
