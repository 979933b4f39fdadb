#include "vm_console.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace hvtrace::hostd {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

Result<std::unique_ptr<GuestConsole>> GuestConsole::Connect(const std::string& socket_path,
                                                            std::chrono::milliseconds timeout) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(addr.sun_path)) {
    return Error{"console socket path too long: " + socket_path};
  }
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  const auto deadline = Clock::now() + timeout;
  int last_errno = 0;
  while (true) {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Error{std::string("console: socket(): ") + std::strerror(errno)};
    if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
      return std::unique_ptr<GuestConsole>(new GuestConsole(fd));
    }
    last_errno = errno;
    close(fd);
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Error{"console: cannot connect to " + socket_path + " within " +
               std::to_string(timeout.count()) + " ms: " + std::strerror(last_errno)};
}

GuestConsole::GuestConsole(int fd) : fd_(fd) {
  if (pipe2(stop_pipe_, O_CLOEXEC) != 0) stop_pipe_[0] = stop_pipe_[1] = -1;
  reader_ = std::thread([this] { ReadLoop(); });
}

GuestConsole::~GuestConsole() {
  if (stop_pipe_[1] >= 0) {
    const char c = 'x';
    ssize_t ignored = write(stop_pipe_[1], &c, 1);
    (void)ignored;
  } else {
    shutdown(fd_, SHUT_RDWR);
  }
  if (reader_.joinable()) reader_.join();
  close(fd_);
  for (int fd : stop_pipe_) {
    if (fd >= 0) close(fd);
  }
}

void GuestConsole::ReadLoop() {
  // QEMU's serial writes the socket one byte per write, each its own socket buffer, so a reader
  // that falls behind soon fills it (a few hundred bytes, by wmem_default over a buffer's size: an
  // estimate). QEMU then logs a refused byte and logs it again when its retry succeeds, and the
  // guest's writes overflow the UART's FIFO meanwhile, so the console shows doubled and lost
  // characters. On a host whose cores run TCG guests a reader at normal priority falls that far
  // behind: the 7.3 guest's boot console beside 3 busy loops on 2 cores had 13-32 garbled lines in
  // 3 of 3 runs (one of them a line lost outright), 13-15 at nice -10, and none at the lowest
  // real-time priority. The thread sleeps in poll() between reads and reads no faster than QEMU
  // writes.
  // Needs CAP_SYS_NICE (or an RLIMIT_RTPRIO); without it the console is read as before.
  sched_param realtime{};
  realtime.sched_priority = sched_get_priority_min(SCHED_FIFO);
  (void)pthread_setschedparam(pthread_self(), SCHED_FIFO, &realtime);
  char buf[4096];
  while (true) {
    pollfd fds[2] = {{fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    const int nfds = stop_pipe_[0] >= 0 ? 2 : 1;
    if (poll(fds, nfds, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (nfds == 2 && fds[1].revents != 0) return;  // Destructor: not a guest event.
    const ssize_t n = read(fd_, buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    std::lock_guard lock(mutex_);
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      const char c = buf[i];
      if (c == '\n') {
        AddLine(std::move(partial_));
        partial_.clear();
      } else if (c != '\r') {
        partial_.push_back(c);
        if (partial_.size() >= kMaxLineBytes) {
          AddLine(std::move(partial_));
          partial_.clear();
        }
      }
    }
    changed_.notify_all();
  }
  std::lock_guard lock(mutex_);
  if (!partial_.empty()) {
    AddLine(std::move(partial_));
    partial_.clear();
  }
  closed_ = true;
  changed_.notify_all();
}

void GuestConsole::AddLine(std::string line) {
  lines_.push_back(std::move(line));
  while (lines_.size() > kMaxKeptLines) {
    lines_.pop_front();
    ++first_line_index_;
  }
}

template <typename Match>
Result<std::string> GuestConsole::WaitFor(const std::string& what,
                                          std::chrono::milliseconds timeout, Match&& match) {
  const auto deadline = Clock::now() + timeout;
  std::unique_lock lock(mutex_);
  while (true) {
    if (cursor_ < first_line_index_) cursor_ = first_line_index_;
    for (; cursor_ < first_line_index_ + lines_.size(); ++cursor_) {
      const std::string& line = lines_[cursor_ - first_line_index_];
      if (match(line)) {
        ++cursor_;
        return line;
      }
    }
    if (closed_) {
      lock.unlock();
      return Error{"console closed (QEMU exited?) before " + what + "; console tail:\n" + Tail()};
    }
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout &&
        cursor_ == first_line_index_ + lines_.size()) {
      lock.unlock();
      return Error{"no console line " + what + " within " + std::to_string(timeout.count()) +
                   " ms; console tail:\n" + Tail()};
    }
  }
}

Result<std::string> GuestConsole::WaitForLine(std::string_view needle,
                                              std::chrono::milliseconds timeout) {
  return WaitFor(
      "containing '" + std::string(needle) + "'", timeout,
      [needle](const std::string& line) { return line.find(needle) != std::string::npos; });
}

Result<std::vector<std::string>> GuestConsole::WaitForMatch(const std::regex& pattern,
                                                            std::chrono::milliseconds timeout) {
  auto matched = WaitFor("matching the pattern", timeout, [&pattern](const std::string& line) {
    return std::regex_search(line, pattern);
  });
  if (!matched.ok()) return matched.error();
  std::smatch m;
  std::regex_search(matched.value(), m, pattern);
  std::vector<std::string> groups;
  for (const auto& g : m) groups.push_back(g.str());
  return groups;
}

Status GuestConsole::Send(std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = send(fd_, text.data(), text.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error{std::string("console: write failed: ") + std::strerror(errno)};
    }
    text.remove_prefix(static_cast<size_t>(n));
  }
  return {};
}

Result<GuestConsole::CommandResult> GuestConsole::Run(const std::string& command,
                                                      std::chrono::milliseconds timeout) {
  if (command.find('\n') != std::string::npos) return Error{"console: command must be one line"};
  const auto deadline = Clock::now() + timeout;
  auto left = [&deadline] {
    return std::max(std::chrono::milliseconds(0),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  };
  uint64_t n;
  {
    std::lock_guard lock(mutex_);
    n = next_command_++;
    cursor_ = first_line_index_ + lines_.size();
  }
  // The shell echoes what we type, and its line editor wraps and redraws long
  // lines, so the echo cannot be found reliably. Instead the output is framed
  // by two markers that the echo can never contain as such: the begin marker
  // is typed with '' inside it, the end marker with a literal $? after it.
  const std::string id = std::to_string(n);
  const std::string begin = "__HVT_BEGIN_" + id + "__";
  const std::string marker = "__HVT_DONE_" + id + "_";
  if (Status s = Send("echo __HVT_BEG''IN_" + id + "__; " + command + "; echo " + marker + "$?\n");
      !s.ok()) {
    return s.error();
  }
  const std::string what = "after `" + command + "`";
  auto begin_line = WaitFor("'" + begin + "' " + what, left(), [&begin](const std::string& l) {
    return l.find(begin) != std::string::npos;
  });
  if (!begin_line.ok()) return begin_line.error();
  uint64_t first_output;
  {
    std::lock_guard lock(mutex_);
    first_output = cursor_;
  }
  // The serial console carries the kernel's printk output beside the shell's:
  // a message printed while the echo runs can follow the status on the same
  // line ("__HVT_DONE_3_0[   16.846943] RIP: ..."). The status ends at the
  // line's end or where such a stamp starts; the typed echo has "$?" there.
  const std::regex done(marker + "([0-9]+)(?=$|\\[ *[0-9]+\\.[0-9]+\\])");
  auto line = WaitFor("'" + marker + "<status>' " + what, left(),
                      [&done](const std::string& l) { return std::regex_search(l, done); });
  if (!line.ok()) return line.error();

  CommandResult result;
  std::smatch m;
  std::regex_search(line.value(), m, done);
  result.status = std::stoi(m[1].str());
  std::lock_guard lock(mutex_);
  const uint64_t done_index = cursor_ - 1;
  for (uint64_t i = std::max(first_output, first_line_index_); i < done_index; ++i) {
    result.output += lines_[i - first_line_index_];
    result.output += '\n';
  }
  // Output without a trailing newline shares the marker's line.
  result.output += line.value().substr(0, static_cast<size_t>(m.position(0)));
  return result;
}

std::string GuestConsole::Tail(size_t max_lines) const {
  std::lock_guard lock(mutex_);
  std::string out;
  const size_t from = lines_.size() > max_lines ? lines_.size() - max_lines : 0;
  for (size_t i = from; i < lines_.size(); ++i) {
    out += "  | " + lines_[i] + "\n";
  }
  if (!partial_.empty()) out += "  | " + partial_ + "\n";
  return out;
}

bool GuestConsole::closed() const {
  std::lock_guard lock(mutex_);
  return closed_;
}

}  // namespace hvtrace::hostd
