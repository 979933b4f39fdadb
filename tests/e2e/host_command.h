// Running host programs from e2e tests (argv, no shell) and reading the
// files they leave: what the hvtraced harness, the stream reader and the
// libvirtd fixture share.
#ifndef HVTRACE_TESTS_E2E_HOST_COMMAND_H_
#define HVTRACE_TESTS_E2E_HOST_COMMAND_H_

#include <cstddef>
#include <string>
#include <vector>

#include "hvtrace/result.h"

namespace hvtrace::e2e {

// The whole file ("" when unreadable).
std::string ReadWhole(const std::string& path);
// Its last |max_bytes| bytes ("" when unreadable).
std::string FileTail(const std::string& path, size_t max_bytes);

// build/bin/|tool| (hvtrace, hvtraced, hvtrace-agent).
std::string BinPath(const std::string& tool);

// Runs argv; the exit status and stdout+stderr, whatever the status.
struct RunResult {
  int status = -1;  // Exit code; -1 when killed by a signal.
  std::string output;
};
RunResult RunArgvStatus(const std::vector<std::string>& argv);

// Runs argv, returns stdout+stderr; an error naming the command when the
// exit status is not 0.
Result<std::string> RunArgv(const std::vector<std::string>& argv);

// Why this process cannot run commands as another user (uid 65534 through
// setpriv), or "" when it can: it needs root and setpriv.
std::string OtherUserUnavailableReason();

// "exit N: OUTPUT", for a failed expectation's message.
std::string Describe(const RunResult& r);

// Copies the file |from| into |dir| readable by everyone (the guest images
// may sit in a tree another test user cannot enter); the copy's path.
std::string PublicCopy(const std::string& from, const std::string& dir);

}  // namespace hvtrace::e2e

#endif  // HVTRACE_TESTS_E2E_HOST_COMMAND_H_
