// A private hvtraced for e2e tests: its own config, state and run
// directories under /tmp, started as a child process, killable with any
// signal and restartable on the same state dir.
//
// QEMUs hvtraced boots run in their own sessions and outlive the daemon
// (vm_on_shutdown = keep), so the destructor also kills every QEMU recorded in
// the state dir (checked by pid start time, never a stranger's process) and
// removes the sockets and /dev/shm files they own: nothing is left behind
// however the test ends.
#ifndef HVTRACE_TESTS_E2E_HVTRACED_PROCESS_H_
#define HVTRACE_TESTS_E2E_HVTRACED_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "hvtrace/result.h"

namespace hvtrace::e2e {

class HvtracedProcess {
 public:
  // |extra_config| is appended to the config file ("key = value" lines).
  explicit HvtracedProcess(const std::string& tag, const std::string& extra_config = "");
  ~HvtracedProcess();
  HvtracedProcess(const HvtracedProcess&) = delete;
  HvtracedProcess& operator=(const HvtracedProcess&) = delete;

  std::string socket() const { return dir_ + "/run/hvtraced.sock"; }
  std::string state_dir() const { return dir_ + "/state"; }
  std::string vm_dir(const std::string& name) const { return state_dir() + "/vms/" + name; }
  // Everything every daemon run wrote to stderr.
  std::string log() const;
  pid_t pid() const { return pid_; }

  // Set in the environment of the daemons started from now on (empty value:
  // no longer set).
  void SetEnv(const std::string& name, const std::string& value);

  // The daemon binary (in HVTRACE_BIN_DIR) the next Start runs: "hvtraced"
  // unless a test picks one of the fault-injecting ones (tests/tools/).
  void SetBinary(const std::string& name) { binary_ = name; }

  // Starts hvtraced and waits until its socket answers.
  Status Start();
  // Waits up to |timeout| for the daemon to exit on its own; its wait status,
  // or an error when it is still running (then it is left running).
  Result<int> WaitExit(std::chrono::milliseconds timeout);
  // Sends |signo|; waits up to |grace| for the exit, then SIGKILLs. Reaps.
  void Stop(int signo, std::chrono::milliseconds grace = std::chrono::seconds(10));

  // One request on a fresh connection; a daemon error reply is an Error
  // "cmd: message".
  Result<nlohmann::json> Call(const std::string& cmd, const nlohmann::json& args,
                              std::chrono::milliseconds timeout = std::chrono::seconds(60));

  // Polls `captures NAME` until one with |trigger| appears (its summary).
  Result<nlohmann::json> WaitForCapture(const std::string& name, const std::string& trigger,
                                        std::chrono::milliseconds timeout);

  // Kills the QEMUs recorded in the state dir and removes their files.
  void KillRecordedVms();

 private:
  std::string dir_;
  pid_t pid_ = -1;
  std::map<std::string, std::string> env_;
  std::string binary_ = "hvtraced";
};

std::string ReadWholeFile(const std::string& path);

}  // namespace hvtrace::e2e

#endif  // HVTRACE_TESTS_E2E_HVTRACED_PROCESS_H_
