// The one way e2e tests run hvtraced: a private daemon with its own config,
// state and run directories under /tmp (/tmp/hvt-d-TAG-PID-N: short, socket
// paths have 107 bytes), started as a child process, killable with any
// signal and restartable on the same state dir, talked to over its control
// socket (Call) or through the real `hvtrace` CLI (Hvtrace).
//
// Options cover what the tests need: extra config lines, a libvirt URI, the
// daemon binary (hvtraced, or a fault-injecting build from tests/tools/ such
// as hvtraced-crash-after-region, switchable between runs), environment
// variables, and running it as another uid. For another uid the state and
// run dirs are handed over and a copy of the binary is run from the test's
// own directory, because the build tree may sit below a directory that uid
// cannot enter (a clone in /root or in a 0700 mktemp dir); when even that
// directory is unreachable, Start says which directory and why.
//
// QEMUs hvtraced boots run in their own sessions and outlive the daemon
// (vm_on_shutdown = keep), so the destructor also kills every QEMU recorded in
// the state dir (checked by pid start time, never a stranger's process) and
// removes the sockets and /dev/shm files they own. With reap_orphans the test
// process becomes a child subreaper, so QEMUs whose daemon died are
// re-parented to it and can be waited for. HVTRACE_KEEP_TMP keeps the
// directory for a look after the test.
#ifndef HVTRACE_TESTS_E2E_HVTRACED_HARNESS_H_
#define HVTRACE_TESTS_E2E_HVTRACED_HARNESS_H_

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "host_command.h"
#include "hvtrace/result.h"
#include "vm_console.h"

namespace hvtrace::e2e {

// Every member has a default, so tests name only what they set
// ({.tag = "x", .libvirt_uri = uri}).
struct HvtracedOptions {
  std::string tag{};                // Names the directory (keep it short).
  std::string config{};             // Appended to the config file ("key = value\n" lines).
  std::string libvirt_uri{};        // Written as libvirt_uri when not empty.
  std::string socket_group{};       // socket_group (a name or gid); empty: none.
  std::string binary = "hvtraced";  // In HVTRACE_BIN_DIR; SetBinary changes it.
  uid_t uid = 0;                    // Not 0: the daemon runs as this uid (and gid).
  bool reap_orphans = false;        // Make the test process a child subreaper.
};

class HvtracedProcess {
 public:
  explicit HvtracedProcess(HvtracedOptions options);
  ~HvtracedProcess();
  HvtracedProcess(const HvtracedProcess&) = delete;
  HvtracedProcess& operator=(const HvtracedProcess&) = delete;

  const std::string& dir() const { return dir_; }
  std::string socket() const { return dir_ + "/run/hvtraced.sock"; }
  std::string state_dir() const { return dir_ + "/state"; }
  std::string vm_dir(const std::string& name) const { return state_dir() + "/vms/" + name; }
  std::string captures_dir(const std::string& name) const { return vm_dir(name) + "/captures"; }
  // Everything every daemon run wrote to stderr, and its last 6000 bytes
  // (for failure messages).
  std::string log() const;
  std::string LogTail() const;
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }

  // The daemon binary (in HVTRACE_BIN_DIR) the next Start runs.
  void SetBinary(const std::string& name) { options_.binary = name; }
  // Set in the environment of the daemons started from now on (empty value:
  // no longer set).
  void SetEnv(const std::string& name, const std::string& value);

  // Starts the daemon and waits (20 s at most) until it answers `ping`.
  Status Start();
  // Waits up to |timeout| for the daemon to exit on its own; its wait status,
  // or an error when it is still running (then it is left running).
  Result<int> WaitExit(std::chrono::milliseconds timeout);
  // Sends |signo|, waits up to |grace| for the exit, then SIGKILLs; reaps.
  // How long the exit took in ms; -1 when SIGKILL was needed; 0 when no
  // daemon ran. The state dir stays.
  double Stop(int signo = SIGTERM, std::chrono::milliseconds grace = std::chrono::seconds(10));

  // One request on a fresh connection; a daemon error reply is an Error
  // "cmd: message (code)".
  Result<nlohmann::json> Call(const std::string& cmd, const nlohmann::json& args,
                              std::chrono::milliseconds timeout = std::chrono::seconds(90)) const;
  // Polls `captures NAME` until one with |trigger| appears (its summary).
  Result<nlohmann::json> WaitForCapture(const std::string& name, const std::string& trigger,
                                        std::chrono::milliseconds timeout) const;

  // `hvtrace ARGS... --socket SOCK`, the CLI as a user runs it.
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
  // Polls the log until it holds |needle| (true) or |timeout| passes.
  bool WaitForLog(const std::string& needle, std::chrono::milliseconds timeout) const;

  // Kills the QEMUs recorded in the state dir and removes their files.
  void KillRecordedVms();

 private:
  // The binary to exec: options_.binary, or its reachable copy for a uid.
  Result<std::string> BinaryToRun();

  HvtracedOptions options_;
  std::string dir_;
  pid_t pid_ = -1;
  std::map<std::string, std::string> env_;
};

// A guest the daemon booted: the `boot` reply and its ttyS0 console.
struct DaemonGuest {
  std::string name;
  nlohmann::json reply;
  std::unique_ptr<hostd::GuestConsole> console;
};

// `boot` of |kernel| and |initrd| as |name| under TCG with a 16 MiB boot
// range (members of |extra| are added to or replace the request's), then
// connects the console. Errors carry the daemon's log.
Result<DaemonGuest> BootDaemonGuest(const HvtracedProcess& daemon, const std::string& name,
                                    const std::string& kernel, const std::string& initrd,
                                    const nlohmann::json& extra = nlohmann::json::object());

// BootDaemonGuest, then waits for the guest to be ready and runs |setup|
// (e.g. sysctls) and `insmod` of the test module hvt_beta (guest_harness.h
// GuestImageWithTestModules: |kernel| and |initrd| are that image's).
// Errors carry the console's tail and the daemon's log.
Result<DaemonGuest> BootGuestWithHvtBeta(const HvtracedProcess& daemon, const std::string& name,
                                         const std::string& kernel, const std::string& initrd,
                                         const std::string& setup);

// The guest console's last |lines| lines and the daemon's log, for failure
// messages.
std::string ConsoleAndLog(const DaemonGuest& guest, const HvtracedProcess& daemon,
                          size_t lines = 40);

// Opens |daemon|'s directory to other users (0755) and copies the built
// CLI into it (0755, where build/ may be closed to them); the copy's path.
// For tests that run the CLI as uid 65534 in one of the daemon's groups.
Result<std::string> CliForOtherUsers(const HvtracedProcess& daemon);

}  // namespace hvtrace::e2e

#endif  // HVTRACE_TESTS_E2E_HVTRACED_HARNESS_H_
