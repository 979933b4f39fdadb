#include "stream_reader.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "host_command.h"

namespace hvtrace::e2e {

using nlohmann::json;
using namespace std::chrono_literals;

StreamReader::StreamReader(const HvtracedProcess& daemon, const std::string& name,
                           StreamOptions options) {
  static std::atomic<int> counter{0};
  const std::string base = daemon.dir() + "/stream-" + name + "-" + std::to_string(counter++);
  out_path_ = base + ".out";
  err_path_ = base + ".err";
  std::vector<std::string> argv = {std::string(HVTRACE_BIN_DIR) + "/hvtrace", "stream", name};
  if (options.json) argv.push_back("--json");
  if (options.from_start) argv.push_back("--from-start");
  argv.insert(argv.end(), {"--socket", daemon.socket()});
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ == 0) {
    const int out = ::open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const int err = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out < 0 || err < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0) ::_exit(126);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  if (pid_ < 0) {
    exited_ = true;
    std::ofstream(err_path_) << "hvtrace stream: fork failed\n";
  }
}

StreamReader::~StreamReader() {
  if (!done()) {
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
  }
  std::error_code ec;
  std::filesystem::remove(out_path_, ec);
  std::filesystem::remove(err_path_, ec);
}

std::string StreamReader::text() const { return ReadWhole(out_path_); }

std::string StreamReader::notes() const { return ReadWhole(err_path_); }

std::string StreamReader::output() const {
  return "--- hvtrace stream stdout ---\n" + text() + "--- hvtrace stream stderr ---\n" + notes();
}

std::vector<std::string> StreamReader::Lines() const {
  std::vector<std::string> lines;
  std::istringstream in(text());
  for (std::string line; std::getline(in, line);) {
    if (in.eof()) break;  // Not yet complete: no newline after it.
    lines.push_back(std::move(line));
  }
  return lines;
}

Result<std::vector<json>> StreamReader::Json() const {
  std::vector<json> events;
  for (const std::string& line : Lines()) {
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return Error{"`hvtrace stream --json` printed a line that is not a JSON object: " + line};
    }
    events.push_back(std::move(j));
  }
  return events;
}

bool StreamReader::done() const {
  if (!exited_ && pid_ > 0) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
  }
  return exited_;
}

std::string StreamReader::end() const {
  if (!done()) return "";
  std::string err = notes();
  while (!err.empty() && err.back() == '\n') err.pop_back();
  const size_t nl = err.rfind('\n');
  return "exit " + std::to_string(exit_status_) + ": " +
         (nl == std::string::npos ? err : err.substr(nl + 1));
}

bool StreamReader::Poll(const std::function<bool()>& cond, std::chrono::milliseconds timeout,
                        bool stop_at_exit) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    // Once it exited its files are complete: one last look decides.
    if (stop_at_exit && done()) return cond();
    std::this_thread::sleep_for(50ms);
  }
  return cond();
}

bool StreamReader::WaitFor(const std::function<bool(const std::string&)>& pred,
                           std::chrono::milliseconds timeout) const {
  return Poll([&] { return pred(text()); }, timeout, true);
}

bool StreamReader::WaitForText(const std::string& needle, std::chrono::milliseconds timeout) const {
  return WaitFor([&](const std::string& t) { return t.find(needle) != std::string::npos; },
                 timeout);
}

bool StreamReader::WaitForAll(const std::vector<std::string>& needles,
                              std::chrono::milliseconds timeout) const {
  return WaitFor(
      [&](const std::string& t) {
        for (const std::string& n : needles) {
          if (t.find(n) == std::string::npos) return false;
        }
        return true;
      },
      timeout);
}

bool StreamReader::WaitForNote(const std::string& needle, std::chrono::milliseconds timeout) const {
  return Poll([&] { return notes().find(needle) != std::string::npos; }, timeout, true);
}

bool StreamReader::WaitForExit(std::chrono::milliseconds timeout) const {
  return Poll([&] { return done(); }, timeout, false);
}

}  // namespace hvtrace::e2e
