// GuestConsole: the guest's serial console (ttyS0) over QEMU's unix socket.
//
// A reader thread collects complete lines ("\r" dropped) so waits can match
// whole lines and failures can show the console's tail. Run() implements the
// guest contract: it types `echo __HVT_BEG''IN_<n>__; CMD; echo
// __HVT_DONE_<n>_$?` and takes the lines between `__HVT_BEGIN_<n>__` and
// `__HVT_DONE_<n>_<status>` as the output; the echo of the typed line holds
// `''` and a literal `$?`, so it never matches either marker.
//
// Everything here comes from the guest: lines are capped in length and count,
// and nothing is interpreted beyond matching text.
#ifndef HVTRACE_HOSTD_VM_CONSOLE_H_
#define HVTRACE_HOSTD_VM_CONSOLE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

class GuestConsole {
 public:
  static constexpr size_t kMaxLineBytes = 64 * 1024;  // Longer lines are split.
  static constexpr size_t kMaxKeptLines = 50000;      // Older lines are dropped.

  // Connects to QEMU's console socket, retrying until |timeout|.
  static Result<std::unique_ptr<GuestConsole>> Connect(const std::string& socket_path,
                                                       std::chrono::milliseconds timeout);
  ~GuestConsole();
  GuestConsole(const GuestConsole&) = delete;
  GuestConsole& operator=(const GuestConsole&) = delete;

  // Waits for a line, after the last line a previous wait matched, that
  // contains |needle| / matches |pattern| (std::regex_search). Returns the
  // line and moves the cursor past it. Errors carry the console tail.
  Result<std::string> WaitForLine(std::string_view needle, std::chrono::milliseconds timeout);
  // For a pattern: the match groups ([0] is the whole match).
  Result<std::vector<std::string>> WaitForMatch(const std::regex& pattern,
                                                std::chrono::milliseconds timeout);

  struct CommandResult {
    int status = -1;
    std::string output;  // What the command printed (\r dropped).
  };
  // Runs |command| in the guest shell (one line, no newline inside).
  Result<CommandResult> Run(const std::string& command, std::chrono::milliseconds timeout);

  // Writes raw text to the guest (add "\n" yourself), e.g. a command that
  // never returns such as `echo c > /proc/sysrq-trigger`.
  Status Send(std::string_view text);

  // The last |max_lines| lines (and the unterminated line, if any).
  std::string Tail(size_t max_lines = 40) const;
  // True once QEMU closed the socket.
  bool closed() const;

 private:
  explicit GuestConsole(int fd);
  void ReadLoop();
  void AddLine(std::string line);  // Called with |mutex_| held.
  // Waits for a line after the cursor satisfying |match|; moves the cursor.
  template <typename Match>
  Result<std::string> WaitFor(const std::string& what, std::chrono::milliseconds timeout,
                              Match&& match);

  int fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  std::thread reader_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::string> lines_;
  uint64_t first_line_index_ = 0;  // Index of lines_.front() since connect.
  uint64_t cursor_ = 0;            // Next line index a wait looks at.
  std::string partial_;
  bool closed_ = false;
  uint64_t next_command_ = 1;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_VM_CONSOLE_H_
