// The one stream reader of the e2e tests: `hvtrace stream NAME --socket SOCK`
// (the CLI, as a user runs it) in a child process, its stdout (the events:
// trace-cmd text, or JSON lines with `json`) and its stderr (the CLI's
// "hvtrace stream: ..." lines: the daemon's notes such as "streaming VM",
// then "ended: REASON (...)" or the error) each in a file in the daemon's
// directory. Every wait is bounded and returns early once the CLI exited
// (nothing more can come). The destructor ends the CLI with SIGTERM (its
// Ctrl-C path: the daemon sees the client go), reaps it and removes the files.
#ifndef HVTRACE_TESTS_E2E_STREAM_READER_H_
#define HVTRACE_TESTS_E2E_STREAM_READER_H_

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hvtrace/result.h"
#include "hvtraced_harness.h"

namespace hvtrace::e2e {

struct StreamOptions {
  bool json = false;        // `--json`: one JSON object per event.
  bool from_start = false;  // `--from-start`: what the region already holds first.
};

class StreamReader {
 public:
  StreamReader(const HvtracedProcess& daemon, const std::string& name, StreamOptions options = {});
  ~StreamReader();
  StreamReader(const StreamReader&) = delete;
  StreamReader& operator=(const StreamReader&) = delete;

  // What the CLI printed so far: stdout (events), stderr (notes and the
  // end), both.
  std::string text() const;
  std::string notes() const;
  std::string output() const;
  // stdout's complete lines.
  std::vector<std::string> Lines() const;
  // stdout's complete lines as JSON (StreamOptions::json); an error naming
  // the first line that is not a JSON object.
  Result<std::vector<nlohmann::json>> Json() const;

  // True once the CLI exited (it is reaped here).
  bool done() const;
  // "" while it runs; then "exit STATUS: " and its last stderr line (the
  // end reason, or why it failed). STATUS is -1 after a signal.
  std::string end() const;

  // Waits until |pred(text())| holds (true) or |timeout| passed or the CLI
  // exited without it holding (false).
  bool WaitFor(const std::function<bool(const std::string&)>& pred,
               std::chrono::milliseconds timeout) const;
  // Waits until stdout holds |needle| / every one of |needles|.
  bool WaitForText(const std::string& needle, std::chrono::milliseconds timeout) const;
  bool WaitForAll(const std::vector<std::string>& needles, std::chrono::milliseconds timeout) const;
  // Waits until stderr holds |needle| (e.g. "streaming VM").
  bool WaitForNote(const std::string& needle, std::chrono::milliseconds timeout) const;
  // Waits until the CLI exits on its own; true when it did.
  bool WaitForExit(std::chrono::milliseconds timeout) const;

 private:
  // Polls |cond| until it holds, |timeout| passes or (with |stop_at_exit|)
  // the CLI exited; |cond|'s last answer.
  bool Poll(const std::function<bool()>& cond, std::chrono::milliseconds timeout,
            bool stop_at_exit) const;

  std::string out_path_, err_path_;
  mutable pid_t pid_ = -1;
  mutable int exit_status_ = -1;
  mutable bool exited_ = false;
};

}  // namespace hvtrace::e2e

#endif  // HVTRACE_TESTS_E2E_STREAM_READER_H_
