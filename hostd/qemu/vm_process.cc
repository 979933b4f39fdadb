#include "vm_process.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <thread>

#include "capped_file.h"
#include "daemon_log.h"
#include "qmp_client.h"

namespace hvtrace::hostd {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kPollInterval{5};

bool PathExists(const std::string& path) {
  struct stat st;
  return !path.empty() && lstat(path.c_str(), &st) == 0;
}

bool IsSocket(const std::string& path) {
  struct stat st;
  return !path.empty() && lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

}  // namespace

namespace {

// /proc/PID/stat after the last ')' ("S 1 ..."): comm may hold spaces and
// parentheses, so fields count from there. Empty when there is no process.
std::string StatAfterComm(pid_t pid) {
  if (pid <= 0) return {};
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos ? std::string() : stat.substr(paren + 1);
}

// starttime is field 22 of stat, the 20th after comm.
std::optional<uint64_t> StartTimeOf(const std::string& after_comm) {
  std::istringstream rest(after_comm);
  std::string field;
  for (int i = 0; i < 20 && rest >> field; ++i) {
  }
  if (!rest || field.empty()) return std::nullopt;
  try {
    return std::stoull(field);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::optional<uint64_t> ProcessStartTime(pid_t pid) { return StartTimeOf(StatAfterComm(pid)); }

bool StillRunning(pid_t pid, uint64_t start_time) {
  const std::optional<uint64_t> now = ProcessStartTime(pid);
  return now.has_value() && (start_time == 0 || *now == start_time);
}

namespace {

// Whether |fd| still is a pidfd. A descriptor some other code closed by
// mistake (and whose number was then reused, by a file that is always
// readable) would make poll() say "exited" and take signals nowhere:
// `vm_on_shutdown = stop` would then leave a re-adopted QEMU running.
bool IsPidfd(int fd) {
  if (fd < 0) return false;
  char link[64];
  const ssize_t n =
      ::readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), link, sizeof link - 1);
  return n > 0 && std::string_view(link, static_cast<size_t>(n)) == "anon_inode:[pidfd]";
}

// Alive by the /proc identity: the same start time, and not a zombie (one
// read of stat for both).
bool AliveByProc(pid_t pid, uint64_t start_time) {
  if (start_time == 0) return false;
  const std::string after_comm = StatAfterComm(pid);
  const size_t state = after_comm.find_first_not_of(' ');
  return state != std::string::npos && after_comm[state] != 'Z' && after_comm[state] != 'X' &&
         StartTimeOf(after_comm) == start_time;
}

}  // namespace

Result<std::unique_ptr<Vm>> Vm::Reattach(const std::string& name, const VmIdentity& identity) {
  const std::string vm = "VM '" + name + "': ";
  const std::string which = "pid " + std::to_string(identity.pid);
  if (identity.pid <= 0 || identity.start_time == 0) {
    return Error{vm + "no recorded QEMU pid and start time to check"};
  }
  auto check = [&]() -> Status {
    auto start = ProcessStartTime(identity.pid);
    if (!start) return Error{vm + "QEMU " + which + " no longer exists"};
    if (*start != identity.start_time) {
      return Error{vm + which + " started at tick " + std::to_string(*start) + ", not " +
                   std::to_string(identity.start_time) + ": the pid was reused by another process"};
    }
    return {};
  };
  if (Status s = check(); !s.ok()) return s.error();
  std::string cmdline = ReadFile("/proc/" + std::to_string(identity.pid) + "/cmdline");
  std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
  if (!identity.cmdline_mentions.empty() &&
      cmdline.find(identity.cmdline_mentions) == std::string::npos) {
    return Error{vm + which + " is not the QEMU we started: its command line does not mention " +
                 identity.cmdline_mentions};
  }
  const int pidfd = PidfdOpen(identity.pid);
  if (pidfd < 0) return Error{vm + "pidfd_open(" + which + "): " + std::strerror(errno)};
  // The pidfd pins whatever process had the pid when it was opened; checking
  // again now proves that is still our QEMU.
  if (Status s = check(); !s.ok()) {
    close(pidfd);
    return s.error();
  }
  std::unique_ptr<Vm> self(new Vm());
  self->config_.name = name;
  self->pid_ = identity.pid;
  self->start_time_ = identity.start_time;
  self->child_ = false;
  self->pidfd_ = pidfd;
  self->owned_files_ = identity.owned_paths;
  return self;
}

std::unique_ptr<Vm> Vm::Remnant(const std::string& name, std::vector<std::string> owned_paths) {
  std::unique_ptr<Vm> self(new Vm());
  self->config_.name = name;
  self->child_ = false;
  self->owned_files_ = std::move(owned_paths);
  return self;
}

// The files a started Vm removes in Cleanup(): its sockets (a stale one from
// an earlier run would make the readiness check pass before QEMU listens, so
// it goes now) and the backing files that did not exist before.
void Vm::TakeOwnedFiles() {
  const VmConfig& config = config_;
  for (const std::string* sock :
       {&config.qmp_socket, &config.console_socket, &config.meta_socket}) {
    if (sock->empty()) continue;
    if (IsSocket(*sock)) unlink(sock->c_str());
    owned_files_.push_back(*sock);
  }
  auto own_if_new = [&](const std::string& path, bool remove) {
    if (remove && !PathExists(path)) owned_files_.push_back(path);
  };
  if (config.boot_range && config.boot_range->prepared) {
    owned_files_.push_back(config.boot_range->backing_path);
  } else if (config.boot_range) {
    own_if_new(config.boot_range->backing_path, config.boot_range->remove_on_cleanup);
  }
  for (const IvshmemConfig& iv : config.ivshmem) own_if_new(iv.backing_path, iv.remove_on_cleanup);
}

// Forks and execs QEMU with stdin from /dev/null and stdout/stderr into
// config.qemu_log. Returns once exec succeeded (pid_ set) or failed (the
// error says why, the child is reaped). Everything the child touches is
// prepared before fork: after fork in a threaded process only
// async-signal-safe calls are allowed.
Status Vm::Spawn(VmLifetime lifetime) {
  const VmConfig& config = config_;
  const std::string vm = "VM '" + config.name + "': ";
  const std::string& log_path =
      config.qemu_log.empty() ? std::string("/dev/null") : config.qemu_log;
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0)
    return Error{vm + "cannot open QEMU log " + log_path + ": " + std::strerror(errno)};
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  int exec_pipe[2];
  if (null_fd < 0 || pipe2(exec_pipe, O_CLOEXEC) != 0) {
    const int err = errno;
    close(log_fd);
    if (null_fd >= 0) close(null_fd);
    return Error{vm + "cannot set up QEMU's stdio: " + std::strerror(err)};
  }
  std::vector<std::string> command = LaunchArgv(config.launcher, plan_.argv);
  std::vector<char*> argv;
  for (std::string& arg : command) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const bool independent = lifetime == VmLifetime::kIndependent;

  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    for (int fd : {log_fd, null_fd, exec_pipe[0], exec_pipe[1]}) close(fd);
    return Error{vm + "fork failed: " + std::strerror(err)};
  }
  if (pid == 0) {
    if (independent) {
      // Own session and process group: no terminal signal (Ctrl-C to the
      // daemon's group) reaches QEMU, and nothing ties it to the daemon.
      setsid();
    } else {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // The parent died before prctl.
    }
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, nullptr);
    signal(SIGPIPE, SIG_DFL);
    dup2(null_fd, STDIN_FILENO);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    // Keep no descriptor of ours open in QEMU (gtest's, other VMs' sockets).
    syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC);
    execvp(argv[0], argv.data());
    const int err = errno;
    ssize_t ignored = write(exec_pipe[1], &err, sizeof(err));
    (void)ignored;
    _exit(127);
  }
  // Also here, so the group exists before we signal it. (An independent
  // child makes its own with setsid, which fails if we already made it a
  // group leader; the exec pipe below waits until setsid has run.)
  if (!independent) setpgid(pid, pid);
  pid_ = pid;
  close(log_fd);
  close(null_fd);
  close(exec_pipe[1]);
  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(exec_pipe[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  close(exec_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof(exec_errno))) {
    WaitForExit(std::chrono::seconds(5));
    Cleanup();
    return Error{vm + "cannot execute " + config.qemu_binary + ": " + std::strerror(exec_errno)};
  }
  start_time_ = ProcessStartTime(pid).value_or(0);
  return {};
}

// QEMU creates its QMP socket early, with the chardevs, and sizes its
// memory-backend files later, with the machine. A caller that maps the boot
// range as soon as the socket is there could find the file still empty (a
// loaded machine, FleetUploadE2e of 2026-12-03: "region ... has 0 bytes,
// less than offset 0 + size 16777216", the VM failed). Waits for both, or
// reports why QEMU died.
Status Vm::AwaitStartup(std::chrono::milliseconds ready_timeout) {
  const std::string vm = "VM '" + config_.name + "': ";
  const auto deadline = Clock::now() + ready_timeout;
  while (!IsSocket(config_.qmp_socket) || !BackingFilesSized()) {
    if (!Running()) {
      std::string tail = QemuLogTail();
      Cleanup();
      return Error{vm + "QEMU " + DescribeExit() + " during startup: " + tail};
    }
    if (Clock::now() > deadline) {
      const bool socket = IsSocket(config_.qmp_socket);
      Kill();
      WaitForExit(std::chrono::seconds(5));
      std::string tail = QemuLogTail();
      Cleanup();
      return Error{vm + "QEMU did not " +
                   (socket ? std::string("size its memory-backend files")
                           : "create its QMP socket " + config_.qmp_socket) +
                   " within " + std::to_string(ready_timeout.count()) + " ms: " + tail};
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  return {};
}

bool Vm::BackingFilesSized() const {
  auto sized = [](const std::string& path, uint64_t bytes) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) >= bytes;
  };
  if (config_.boot_range && plan_.boot_range &&
      !sized(config_.boot_range->backing_path, plan_.boot_range->node1_bytes)) {
    return false;
  }
  for (const IvshmemConfig& iv : config_.ivshmem) {
    if (!sized(iv.backing_path, iv.size_bytes)) return false;
  }
  return true;
}

Result<std::unique_ptr<Vm>> Vm::Start(const VmConfig& config, bool kvm_usable,
                                      std::chrono::milliseconds ready_timeout,
                                      VmLifetime lifetime) {
  const std::string vm = "VM '" + config.name + "': ";
  Result<std::shared_ptr<const QemuCaps>> caps = QemuCapsFor(config.qemu_binary);
  if (!caps.ok()) return Error{vm + caps.error().message};
  Result<QemuPlan> plan = BuildQemuPlan(config, kvm_usable, **caps);
  if (!plan.ok()) return plan.error();
  for (const std::string* path : {&config.kernel, &config.initrd}) {
    if (!path->empty() && access(path->c_str(), R_OK) != 0) {
      return Error{vm + "cannot read " + *path + ": " + std::strerror(errno)};
    }
  }
  std::unique_ptr<Vm> self(new Vm());
  self->config_ = config;
  self->plan_ = std::move(plan.value());
  self->TakeOwnedFiles();
  if (Status s = self->Spawn(lifetime); !s.ok()) return s.error();
  if (Status s = self->AwaitStartup(ready_timeout); !s.ok()) return s.error();
  return self;
}

Vm::~Vm() {
  if (!released_) {
    if (pid_ > 0 && Running()) (void)Stop(nullptr, std::chrono::seconds(2));
    Cleanup();
  }
  if (pidfd_ >= 0) close(pidfd_);
}

void Vm::Release() { released_ = true; }

VmIdentity Vm::Identity() const {
  VmIdentity id;
  id.pid = pid_;
  id.start_time = start_time_;
  id.cmdline_mentions = config_.qmp_socket;
  id.owned_paths = owned_files_;
  return id;
}

bool Vm::kvm() const {
  auto it = std::find(plan_.argv.begin(), plan_.argv.end(), "-accel");
  return it != plan_.argv.end() && std::next(it) != plan_.argv.end() && *std::next(it) == "kvm";
}

bool Vm::Running() {
  if (pid_ <= 0 || wait_status_) return false;
  if (!child_) {
    // Not our child: the pidfd turns readable when the process exits; a
    // pidfd that is no longer one (IsPidfd) leaves the /proc identity.
    if (IsPidfd(pidfd_)) {
      pollfd p{pidfd_, POLLIN, 0};
      if (poll(&p, 1, 0) == 0) return true;
    } else {
      NotePidfdLost();
      if (AliveByProc(pid_, start_time_)) return true;
    }
    wait_status_ = -1;
    return false;
  }
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    wait_status_ = status;
    return false;
  }
  if (r < 0 && errno == ECHILD) {
    // Someone else reaped it (a SIGCHLD handler set to SIG_IGN): it is gone.
    wait_status_ = -1;
    return false;
  }
  return true;
}

bool Vm::WaitForExit(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Running()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(kPollInterval);
  }
  return true;
}

std::string Vm::DescribeExit() const {
  if (!wait_status_) return "running";
  const int s = *wait_status_;
  if (s == -1) return "exited (status unknown)";
  if (WIFEXITED(s)) return "exited with status " + std::to_string(WEXITSTATUS(s));
  if (WIFSIGNALED(s)) return "killed by signal " + std::to_string(WTERMSIG(s));
  return "ended (wait status " + std::to_string(s) + ")";
}

Status Vm::Stop(QmpSyncClient* qmp, std::chrono::milliseconds grace) {
  if (!Running()) return {};
  if (qmp != nullptr && qmp->connected()) {
    // QEMU may close the socket before it replies; the exit is what counts.
    (void)qmp->Execute("quit", nlohmann::json::object(), grace);
    if (WaitForExit(grace)) return {};
  }
  Signal(SIGTERM);
  if (WaitForExit(grace)) return {};
  Kill();
  if (WaitForExit(std::chrono::seconds(10))) return {};
  return Error{"VM '" + config_.name + "': QEMU pid " + std::to_string(pid_) + " survived SIGKILL"};
}

void Vm::Kill() {
  if (pid_ > 0 && !wait_status_) Signal(SIGKILL);
}

void Vm::Signal(int signo) {
  if (child_) {
    kill(-pid_, signo);  // The group: anything QEMU forked goes too.
  } else if (IsPidfd(pidfd_)) {
    // Through the pidfd: never a process that merely reuses the pid.
    syscall(SYS_pidfd_send_signal, pidfd_, signo, nullptr, 0);
  } else {
    NotePidfdLost();
    if (AliveByProc(pid_, start_time_)) kill(pid_, signo);  // Checked by start time just now.
  }
}

void Vm::NotePidfdLost() {
  if (pidfd_ < 0 || pidfd_lost_noted_) return;
  pidfd_lost_noted_ = true;
  // Logged once: it means other code closed a descriptor it did not own.
  std::error_code ec;
  const std::string now =
      std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(pidfd_), ec).string();
  LogWarning("VM " + config_.name + ": pidfd " + std::to_string(pidfd_) + " of QEMU pid " +
             std::to_string(pid_) + " is no longer a pidfd (now '" + (ec ? "closed" : now) +
             "'): another part of hvtraced closed it; the QEMU is " +
             "followed by its pid and start time instead");
}

void Vm::Cleanup() {
  if (cleaned_) return;
  if (Running()) {
    // Removing backing files under a live QEMU would only unlink the name;
    // stop it first so "cleaned up" means it.
    (void)Stop(nullptr, std::chrono::seconds(2));
  }
  for (const std::string& path : owned_files_) unlink(path.c_str());
  cleaned_ = true;
}

std::vector<std::string> Vm::OwnedPaths() const { return owned_files_; }

std::string Vm::QemuLogTail(size_t max_bytes) const {
  return ReadFileTail(config_.qemu_log, max_bytes);
}

}  // namespace hvtrace::hostd
