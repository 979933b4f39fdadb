// End-to-end harness: boots a real guest under QEMU (KVM when usable, TCG
// otherwise; HVTRACE_ACCEL=tcg|kvm forces one), connects the QMP client and
// the serial console, and tears everything down however the test ends.
//
// Each TestGuest gets unique socket, log and /dev/shm names (pid + counter),
// because ctest runs the discovered tests in parallel processes.
#ifndef HVTRACE_TESTS_E2E_GUEST_HARNESS_H_
#define HVTRACE_TESTS_E2E_GUEST_HARNESS_H_

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "formats_harvest.h"
#include "hvtrace/result.h"
#include "qmp_client.h"
#include "vm_config.h"
#include "vm_console.h"
#include "vm_process.h"

namespace hvtrace::e2e {

using namespace std::chrono_literals;

// Generous for TCG with two guests sharing two cores; a boot takes ~7 s alone.
inline constexpr std::chrono::milliseconds kBootTimeout = 120s;
inline constexpr std::chrono::milliseconds kCommandTimeout = 30s;

struct GuestImage {
  std::string kernel;
  std::string initrd;
  std::string release;  // uname -r of the guest kernel.
};

// Empty when QEMU can run here; otherwise why not (the test then skips).
std::string QemuUnavailableReason();

// A kernel version's name in a parameterized test's name: "6.12" -> "Linux6_12".
std::string KernelParamName(const std::string& version);

// Finds build/guest/<version>/ in the source tree, running
// qemu-scripts/build-guest.sh once when the image is missing.
Result<GuestImage> FindGuestImage(const std::string& version);

// The |version| ("6.12", "7.3") image with this build's agent, the test
// modules (tests/guest/modules: hvt_alpha, hvt_beta under
// /lib/modules/<release>/hvtrace-test/, built with the kernel's own
// compiler) and kexec, in build/guest-modules/<version> (the modules change
// the initramfs other tests use): |initrd| is its initrd-kexec.img. Built by
// qemu-scripts/build-guest.sh, cached.
Result<GuestImage> GuestImageWithTestModules(const std::string& version);

// The formats of |image|'s kernel, harvested with its own initramfs into
// the cache at |cache_root| (a cache hit when already there).
Result<hostd::HarvestResult> HarvestImage(const GuestImage& image,
                                          const std::filesystem::path& cache_root);
// The default cache root (formats_cache.h DefaultCacheRoot), holding |image|'s
// kernel formats (HarvestImage: a cache hit after the first run), for a
// daemon's cache_dir, so its captures decode as in production.
Result<std::filesystem::path> CacheWithFormatsOf(const GuestImage& image);

// The 6.12 guest's initrd that also holds /boot/vmlinuz (so the guest can
// kexec its own kernel), next to |image|'s initrd; built once when missing.
Result<std::string> FindKexecInitrd(const GuestImage& image);

// Adds a second QMP monitor to |config| for hvtraced (the harness keeps the
// first) and returns its socket path, unique per |tag| and process.
std::string AddDaemonMonitor(hostd::VmConfig& config, const std::string& tag);

class TestGuest {
 public:
  explicit TestGuest(const std::string& tag);
  ~TestGuest();

  // A config with this guest's unique paths and the contract's defaults
  // (2 vCPUs, 1088 MiB, console socket + log, QMP socket, pvpanic, pause).
  hostd::VmConfig MakeConfig(const GuestImage& image) const;
  // A unique /dev/shm path for a backing file.
  std::string ShmPath(const std::string& suffix) const;

  // Starts QEMU, connects QMP and the console, waits for HVTRACE-GUEST-READY.
  Status Boot(const hostd::VmConfig& config);

  hostd::Vm& vm() { return *vm_; }
  hostd::QmpSyncClient& qmp() { return *qmp_; }
  hostd::GuestConsole& console() { return *console_; }
  bool booted() const { return vm_ != nullptr && qmp_ && console_; }

  // Runs a command, failing with the console tail when it cannot complete.
  Result<hostd::GuestConsole::CommandResult> Run(const std::string& command);

  // Console tail and QEMU's stderr, for failure messages.
  std::string Diagnostics() const;

 private:
  std::string dir_;
  std::string shm_prefix_;
  std::unique_ptr<hostd::Vm> vm_;
  std::unique_ptr<hostd::QmpSyncClient> qmp_;
  std::unique_ptr<hostd::GuestConsole> console_;
};

}  // namespace hvtrace::e2e

#endif  // HVTRACE_TESTS_E2E_GUEST_HARNESS_H_
