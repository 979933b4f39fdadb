// A private libvirtd + virtlogd for one e2e test, started with
// qemu-scripts/libvirt/private-libvirtd.sh in a fresh directory (own config,
// state, run and log dirs, own socket) and always stopped — with every QEMU
// it started — when the fixture goes away, however the test ends.
//
// TestDomain defines and starts a TCG domain with the 6.12 test guest, its
// serial console on a unix socket (plus a log file kept by virtlogd), and
// undefines it at the end.
#ifndef HVTRACE_TESTS_E2E_LIBVIRTD_FIXTURE_H_
#define HVTRACE_TESTS_E2E_LIBVIRTD_FIXTURE_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "disk_guest.h"
#include "guest_harness.h"
#include "host_command.h"
#include "hvtrace/result.h"
#include "libvirt_client.h"
#include "vm_console.h"

namespace hvtrace::e2e {

// Empty when a private libvirtd can run here (root, the daemons installed);
// otherwise why not (the test then skips).
std::string LibvirtdUnavailableReason();

class PrivateLibvirtd {
 public:
  static Result<std::unique_ptr<PrivateLibvirtd>> Start(const std::string& tag);
  ~PrivateLibvirtd();
  PrivateLibvirtd(const PrivateLibvirtd&) = delete;
  PrivateLibvirtd& operator=(const PrivateLibvirtd&) = delete;

  const std::string& dir() const { return dir_; }
  const std::string& uri() const { return uri_; }
  std::string socket_path() const { return dir_ + "/sock/libvirt-sock"; }

  // Stops and starts libvirtd only; running QEMUs stay.
  Status RestartLibvirtd();
  // Stops libvirtd only (StartLibvirtd brings it back); running QEMUs stay.
  Status StopLibvirtd();
  Status StartLibvirtd();
  // The tail of libvirtd's log, for failure messages.
  std::string LogTail() const;

 private:
  explicit PrivateLibvirtd(std::string dir);
  std::string dir_;
  std::string uri_;
};

struct TestDomainOptions {
  std::string on_crash = "preserve";
  std::string machine = "pc";
  bool start = true;
  std::string extra_devices;  // Raw XML inside <devices>.
  std::string raw_xml;        // Use this whole definition instead.
  bool via_virsh = false;     // Define and start with `virsh` (as a user would).
  // How long the guest may take to its ready line (a systemd guest: longer).
  std::chrono::milliseconds ready_timeout = kBootTimeout;
};

class TestDomain {
 public:
  TestDomain(PrivateLibvirtd& daemon, const std::string& tag);
  ~TestDomain();

  const std::string& name() const { return name_; }
  std::string console_socket() const { return daemon_.dir() + "/" + name_ + ".console"; }
  std::string console_log() const { return daemon_.dir() + "/" + name_ + ".log"; }

  // The default definition for |image|.
  std::string SerialXml() const;
  std::string MakeXml(const GuestImage& image, const TestDomainOptions& options) const;
  // A definition booting from |image|'s disk through a qcow2 overlay made in
  // the daemon's directory (the cached image is never written), with no
  // panic device and no NUMA: a plain VM as users define them. The console
  // is the image's root shell (qemu-scripts/debian/).
  Result<std::string> MakeDiskXml(const DiskImage& image, const TestDomainOptions& options) const;
  // Defines (and starts, connects the console and waits for the guest's
  // ready line, when options.start).
  Status Create(const GuestImage& image, const TestDomainOptions& options);
  // Starts a domain defined with start = false (`virsh start`), then as Create.
  Status Start();

  hostd::GuestConsole& console() { return *console_; }
  std::string Diagnostics() const;

 private:
  // Connects the console and waits for the guest's ready line.
  Status WaitReady();
  PrivateLibvirtd& daemon_;
  std::string name_;
  hostd::LibvirtConnectPtr conn_;
  std::unique_ptr<hostd::GuestConsole> console_;
  bool defined_ = false;
  std::chrono::milliseconds ready_timeout_ = kBootTimeout;
};

}  // namespace hvtrace::e2e

#endif  // HVTRACE_TESTS_E2E_LIBVIRTD_FIXTURE_H_
