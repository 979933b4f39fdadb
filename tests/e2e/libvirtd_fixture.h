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

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "guest_harness.h"
#include "hvtrace/result.h"
#include "libvirt_client.h"
#include "vm_console.h"

namespace hvtrace::e2e {

// Empty when a private libvirtd can run here (root, the daemons installed);
// otherwise why not (the test then skips).
std::string LibvirtdUnavailableReason();

// The whole file ("" when unreadable).
std::string ReadWhole(const std::string& path);

// Runs argv, returns stdout+stderr; an error when the exit status is not 0.
Result<std::string> RunArgv(const std::vector<std::string>& argv);

// Runs argv; the exit status and stdout+stderr, whatever the status.
struct RunResult {
  int status = -1;  // Exit code; -1 when killed by a signal.
  std::string output;
};
RunResult RunArgvStatus(const std::vector<std::string>& argv);

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

// hvtraced as a user runs it, in a private state/run dir, configured with
// |libvirt_uri|; SIGTERMed (then SIGKILLed) and reaped however the test ends.
// Hvtrace() runs the real `hvtrace` CLI against its socket.
class PrivateHvtraced {
 public:
  PrivateHvtraced(const std::string& tag, const std::string& libvirt_uri);
  ~PrivateHvtraced();
  PrivateHvtraced(const PrivateHvtraced&) = delete;
  PrivateHvtraced& operator=(const PrivateHvtraced&) = delete;

  // Starts it (as |uid| when not 0: the state/run dirs are handed over) and
  // waits until it answers `ping`.
  Status Start(uid_t uid = 0);
  // SIGTERM, wait (10 s at most) for the exit, then SIGKILL; the state dir
  // stays. Returns how long the exit took in ms, or -1 when SIGKILL was
  // needed.
  double Stop();

  const std::string& dir() const { return dir_; }
  std::string socket() const { return dir_ + "/run/hvtraced.sock"; }
  std::string state_dir() const { return dir_ + "/state"; }
  std::string Log() const;

  // `hvtrace ARGS... --socket SOCK`.
  RunResult Hvtrace(std::vector<std::string> args) const;
  // `hvtrace ARGS... --json --socket SOCK`, parsed; an error with the output
  // when it fails or prints no JSON.
  Result<nlohmann::json> HvtraceJson(std::vector<std::string> args) const;
  // Polls `hvtrace captures NAME --json` until it lists |count| captures.
  Result<nlohmann::json> WaitForCaptures(const std::string& name, size_t count,
                                         std::chrono::milliseconds timeout) const;
  // Polls `hvtrace ping --json` until |pred| holds for its "libvirt" object.
  Result<nlohmann::json> WaitForLibvirt(const std::function<bool(const nlohmann::json&)>& pred,
                                        std::chrono::milliseconds timeout) const;

 private:
  std::string dir_;
  pid_t pid_ = -1;
};

struct TestDomainOptions {
  std::string on_crash = "preserve";
  std::string machine = "pc";
  bool start = true;
  std::string extra_devices;  // Raw XML inside <devices>.
  std::string raw_xml;        // Use this whole definition instead.
  bool via_virsh = false;     // Define and start with `virsh` (as a user would).
};

class TestDomain {
 public:
  TestDomain(PrivateLibvirtd& daemon, const std::string& tag);
  ~TestDomain();

  const std::string& name() const { return name_; }
  std::string console_socket() const { return daemon_.dir() + "/" + name_ + ".console"; }
  std::string console_log() const { return daemon_.dir() + "/" + name_ + ".log"; }

  // The default definition for |image|.
  std::string MakeXml(const GuestImage& image, const TestDomainOptions& options) const;
  // Defines (and starts, connects the console and waits for the guest's
  // ready line, when options.start).
  Status Create(const GuestImage& image, const TestDomainOptions& options);

  hostd::GuestConsole& console() { return *console_; }
  std::string Diagnostics() const;

 private:
  PrivateLibvirtd& daemon_;
  std::string name_;
  hostd::LibvirtConnectPtr conn_;
  std::unique_ptr<hostd::GuestConsole> console_;
  bool defined_ = false;
};

}  // namespace hvtrace::e2e

#endif  // HVTRACE_TESTS_E2E_LIBVIRTD_FIXTURE_H_
