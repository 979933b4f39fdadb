#include "hvtraced_harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "control_client.h"
#include "guest_harness.h"
#include "qmp_vm.h"
#include "vm_process.h"

namespace hvtrace::e2e {

using nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

HvtracedProcess::HvtracedProcess(HvtracedOptions options) : options_(std::move(options)) {
  static std::atomic<int> counter{0};
  // Unix socket paths are limited to 107 bytes: keep the directory short.
  // "hvt-d-": never a TestGuest's /tmp/hvt-TAG-PID-N of the same tag.
  dir_ = "/tmp/hvt-d-" + options_.tag + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(counter++);
  fs::remove_all(dir_);
  fs::create_directories(dir_);
  std::ofstream conf(dir_ + "/hvtraced.conf");
  conf << "socket_group = " << options_.socket_group << "\naccel = tcg\n";
  if (!options_.libvirt_uri.empty()) conf << "libvirt_uri = " << options_.libvirt_uri << "\n";
  // The QEMU the test runs against (tests/CMakeLists.txt's Qemu10 tests: Debian
  // 13's, through tests/tools/qemu-from-root.sh), as for the harness's own VMs.
  if (const char* qemu = std::getenv("HVTRACE_QEMU"); qemu != nullptr && *qemu != '\0') {
    conf << "qemu_binary = " << qemu << "\n";
  }
  conf << options_.config;
  // QEMUs whose daemon died are re-parented to us, not to a PID 1 that may
  // never reap them, so a killed QEMU really disappears (and can be waited for).
  if (options_.reap_orphans) ::prctl(PR_SET_CHILD_SUBREAPER, 1);
}

HvtracedProcess::~HvtracedProcess() {
  Stop(SIGTERM);
  KillRecordedVms();
  std::error_code ec;
  if (std::getenv("HVTRACE_KEEP_TMP") == nullptr) fs::remove_all(dir_, ec);
}

std::string HvtracedProcess::log() const { return ReadWhole(dir_ + "/hvtraced.log"); }

std::string HvtracedProcess::LogTail() const { return FileTail(dir_ + "/hvtraced.log", 6000); }

void HvtracedProcess::SetEnv(const std::string& name, const std::string& value) {
  if (value.empty()) {
    env_.erase(name);
  } else {
    env_[name] = value;
  }
}

Result<std::string> HvtracedProcess::BinaryToRun() {
  const std::string bin = BinPath(options_.binary);
  const uid_t uid = options_.uid;
  if (uid == 0) return bin;
  const std::string who = "uid " + std::to_string(uid);
  for (const char* sub : {"", "/state", "/run"}) {
    fs::create_directories(dir_ + sub);
    if (::chown((dir_ + sub).c_str(), uid, uid) != 0) {
      return Error{"cannot hand " + dir_ + sub + " over to " + who + ": " + std::strerror(errno)};
    }
  }
  // The build tree may sit below a directory |uid| cannot enter: run a copy
  // from the test's own directory, which it can.
  const std::string copy = dir_ + "/" + options_.binary;
  std::error_code ec;
  fs::copy_file(bin, copy, fs::copy_options::overwrite_existing, ec);
  if (ec) return Error{"cannot copy " + bin + " to " + copy + " for " + who + ": " + ec.message()};
  if (::chmod(dir_.c_str(), 0755) != 0 || ::chmod(copy.c_str(), 0755) != 0) {
    return Error{"cannot make " + copy + " reachable for " + who};
  }
  for (fs::path p = dir_; p.has_relative_path(); p = p.parent_path()) {
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0 && (st.st_mode & S_IXOTH) == 0) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
      return Error{who + " cannot enter " + p.string() + " (mode " + mode +
                   "), where this test keeps the copy of " + options_.binary + " it runs"};
    }
  }
  return copy;
}

Status HvtracedProcess::Start() {
  if (pid_ > 0) return Error{"hvtraced already running as pid " + std::to_string(pid_)};
  Result<std::string> bin = BinaryToRun();
  if (!bin.ok()) return bin.error();
  const std::string log_path = dir_ + "/hvtraced.log", conf = dir_ + "/hvtraced.conf",
                    state = state_dir(), run = dir_ + "/run";
  const uid_t uid = options_.uid;
  pid_ = ::fork();
  if (pid_ < 0) return Error{"fork failed"};
  if (pid_ == 0) {
    const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd < 0 || ::dup2(fd, 2) < 0) ::_exit(126);
    for (const auto& [name, value] : env_) ::setenv(name.c_str(), value.c_str(), 1);
    if (uid != 0 && (::setgid(uid) != 0 || ::setuid(uid) != 0)) ::_exit(126);
    // If the test process dies (a ctest timeout SIGKILLs it), the daemon gets
    // SIGTERM and applies vm_on_shutdown (set after setuid, which clears it).
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    ::execl(bin->c_str(), bin->c_str(), "--config", conf.c_str(), "--state-dir", state.c_str(),
            "--run-dir", run.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto c = hostd::ControlClient::Connect(socket(), 1s); c.ok()) {
      if (auto r = c->Call("ping", json::object(), 5s); r.ok() && r->ok) return {};
    }
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return Error{options_.binary + " exited during start-up (wait status " +
                   std::to_string(status) + "):\n" + LogTail()};
    }
    std::this_thread::sleep_for(100ms);
  }
  return Error{options_.binary + " did not answer ping on " + socket() + " within 20 s:\n" +
               LogTail()};
}

Result<int> HvtracedProcess::WaitExit(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return Error{"hvtraced is not running"};
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return status;
    }
    std::this_thread::sleep_for(20ms);
  }
  return Error{"hvtraced (pid " + std::to_string(pid_) + ") still running after " +
               std::to_string(timeout.count()) + " ms"};
}

double HvtracedProcess::Stop(int signo, std::chrono::milliseconds grace) {
  if (pid_ <= 0) return 0;
  const auto start = std::chrono::steady_clock::now();
  ::kill(pid_, signo);
  bool exited = ::waitpid(pid_, nullptr, WNOHANG) == pid_;
  while (!exited && std::chrono::steady_clock::now() - start < grace) {
    std::this_thread::sleep_for(5ms);
    exited = ::waitpid(pid_, nullptr, WNOHANG) == pid_;
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!exited) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  pid_ = -1;
  return exited ? ms : -1;
}

Result<json> HvtracedProcess::Call(const std::string& cmd, const json& args,
                                   std::chrono::milliseconds timeout) const {
  auto c = hostd::ControlClient::Connect(socket(), 5s);
  if (!c.ok()) return c.error();
  auto r = c->CallWithFiles(cmd, args, timeout);
  if (!r.ok()) return r.error();
  if (!r->ok) return Error{cmd + ": " + r->error + (r->code.empty() ? "" : " (" + r->code + ")")};
  return r->result;
}

Result<json> HvtracedProcess::WaitForCapture(const std::string& name, const std::string& trigger,
                                             std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last;
  while (std::chrono::steady_clock::now() < deadline) {
    auto list = Call("captures", {{"name", name}});
    if (list.ok()) {
      for (const json& c : (*list)["captures"]) {
        if (c.value("trigger", "") == trigger) return c;
      }
      last = list->dump();
    } else {
      last = list.error().message;
    }
    std::this_thread::sleep_for(200ms);
  }
  return Error{"no '" + trigger + "' capture of " + name + " within " +
               std::to_string(timeout.count()) + " ms; last answer: " + last};
}

RunResult HvtracedProcess::Hvtrace(std::vector<std::string> args) const {
  std::vector<std::string> argv = {std::string(HVTRACE_BIN_DIR) + "/hvtrace"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--socket");
  argv.push_back(socket());
  return RunArgvStatus(argv);
}

Result<json> HvtracedProcess::HvtraceJson(std::vector<std::string> args) const {
  args.push_back("--json");
  std::string cmd;
  for (const auto& a : args) cmd += (cmd.empty() ? "" : " ") + a;
  RunResult r = Hvtrace(args);
  if (r.status != 0) {
    return Error{"`hvtrace " + cmd + "` exited " + std::to_string(r.status) + ": " + r.output};
  }
  json j = json::parse(r.output, nullptr, false);
  if (j.is_discarded()) return Error{"`hvtrace " + cmd + "` printed no JSON: " + r.output};
  return j;
}

Result<json> HvtracedProcess::WaitForCaptures(const std::string& name, size_t count,
                                              std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last;
  while (std::chrono::steady_clock::now() < deadline) {
    Result<json> j = HvtraceJson({"captures", name});
    if (j.ok() && (*j)["captures"].is_array() && (*j)["captures"].size() >= count) return j;
    last = j.ok() ? j->dump() : j.error().message;
    std::this_thread::sleep_for(200ms);
  }
  return Error{"no " + std::to_string(count) + " capture(s) of " + name + " within " +
               std::to_string(timeout.count()) + " ms; last: " + last + "\nhvtraced log:\n" +
               LogTail()};
}

Result<json> HvtracedProcess::WaitForLibvirt(const std::function<bool(const json&)>& pred,
                                             std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last;
  while (std::chrono::steady_clock::now() < deadline) {
    Result<json> j = HvtraceJson({"ping"});
    if (j.ok() && j->contains("libvirt") && pred((*j)["libvirt"])) return (*j)["libvirt"];
    last = j.ok() ? j->dump() : j.error().message;
    std::this_thread::sleep_for(200ms);
  }
  return Error{"libvirt state not reached within " + std::to_string(timeout.count()) +
               " ms; last ping: " + last + "\nhvtraced log:\n" + LogTail()};
}

bool HvtracedProcess::WaitForLog(const std::string& needle,
                                 std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (log().find(needle) == std::string::npos) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(100ms);
  }
  return true;
}

void HvtracedProcess::KillRecordedVms() {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(state_dir() + "/vms", ec)) {
    auto spec = hostd::LoadQmpVmSpec(entry.path());
    if (!spec.ok() || !spec->booted_by_daemon) continue;
    if (spec->pid > 0 && spec->pid_start_time != 0 &&
        hostd::ProcessStartTime(spec->pid).value_or(0) == spec->pid_start_time) {
      std::fprintf(stderr, "[hvtraced harness] killing QEMU pid %d left by the test\n", spec->pid);
      ::kill(spec->pid, SIGKILL);
      for (int i = 0;
           i < 250 && hostd::ProcessStartTime(spec->pid).value_or(0) == spec->pid_start_time; ++i) {
        ::waitpid(spec->pid, nullptr, WNOHANG);  // Ours once its daemon died (subreaper).
        std::this_thread::sleep_for(20ms);
      }
    } else if (spec->pid > 0) {
      ::waitpid(spec->pid, nullptr, WNOHANG);  // A zombie the new daemon killed.
    }
    for (const std::string& path : spec->owned_paths) fs::remove(path, ec);
  }
}

Result<DaemonGuest> BootDaemonGuest(const HvtracedProcess& daemon, const std::string& name,
                                    const std::string& kernel, const std::string& initrd,
                                    const nlohmann::json& extra) {
  nlohmann::json request = {{"name", name},
                            {"kernel", kernel},
                            {"initrd", initrd},
                            {"accel", "tcg"},
                            {"trace_size_mib", 16}};
  request.update(extra);
  auto booted = daemon.Call("boot", request);
  if (!booted.ok()) return Error{booted.error().message + "\n--- hvtraced ---\n" + daemon.log()};
  auto console =
      hostd::GuestConsole::Connect((*booted)["console_socket"], std::chrono::seconds(10));
  if (!console.ok()) return Error{"console of " + name + ": " + console.error().message};
  return DaemonGuest{name, std::move(*booted), std::move(*console)};
}

Result<DaemonGuest> BootGuestWithHvtBeta(const HvtracedProcess& daemon, const std::string& name,
                                         const std::string& kernel, const std::string& initrd,
                                         const std::string& setup) {
  Result<DaemonGuest> guest = BootDaemonGuest(daemon, name, kernel, initrd);
  if (!guest.ok()) return guest;
  if (!guest->console->WaitForLine("HVTRACE-GUEST-READY", kBootTimeout).ok())
    return Error{name + " did not become ready:\n" + ConsoleAndLog(*guest, daemon)};
  auto loaded = guest->console->Run(
      setup + " && insmod /lib/modules/$(uname -r)/hvtrace-test/hvt_beta.ko", kCommandTimeout);
  if (!loaded.ok() || loaded->status != 0)
    return Error{name + ": " + setup + " and insmod hvt_beta failed:\n" +
                 ConsoleAndLog(*guest, daemon)};
  return guest;
}

std::string ConsoleAndLog(const DaemonGuest& guest, const HvtracedProcess& daemon, size_t lines) {
  return guest.console->Tail(lines) + "\n--- hvtraced ---\n" + daemon.log();
}

Result<std::string> CliForOtherUsers(const HvtracedProcess& daemon) {
  if (::chmod(daemon.dir().c_str(), 0755) != 0)
    return Error{"chmod 0755 " + daemon.dir() + ": " + std::strerror(errno)};
  const std::string cli = PublicCopy(BinPath("hvtrace"), daemon.dir());
  if (::chmod(cli.c_str(), 0755) != 0)
    return Error{"chmod 0755 " + cli + ": " + std::strerror(errno)};
  return cli;
}

}  // namespace hvtrace::e2e
