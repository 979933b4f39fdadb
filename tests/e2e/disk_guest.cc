#include "disk_guest.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>

#include "host_command.h"

namespace hvtrace::e2e {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

}  // namespace

void PrintTo(const DebianRelease& release, std::ostream* os) {
  *os << release.guest << " (" << release.suite << ", " << release.kernel << ")";
}

Result<DiskImage> FindDebianImage(std::string* skip_reason, const DebianRelease& release) {
  // One run at a time per process; the script locks each image across
  // processes (two suites build at once in two processes).
  static std::mutex build_mutex;
  std::lock_guard lock(build_mutex);
  const std::string script =
      std::string(HVTRACE_SOURCE_DIR) + "/qemu-scripts/build-debian-image.sh";
  // $HVTRACE_AGENT_DEB (tests/run.sh: the package scripts/build-packages.sh
  // built) installs the agent from its .deb; else the build tree's binary.
  const std::string deb = EnvOr("HVTRACE_AGENT_DEB", "");
  const std::string flag = deb.empty() ? "--agent" : "--agent-deb";
  const std::string agent = deb.empty() ? std::string(HVTRACE_BIN_DIR) + "/hvtrace-agent" : deb;
  const std::vector<std::string> argv = {script, "--suite", release.suite, flag, agent};
  RunResult r = RunArgvStatus(argv);
  std::string command;
  for (const std::string& a : argv) command += (command.empty() ? "" : " ") + a;
  if (r.status == 75) {
    *skip_reason = "the " + release.guest +
                   " image cannot be built here (no network, nothing cached): " + r.output;
    return Error{*skip_reason};
  }
  if (r.status != 0) {
    return Error{"`" + command + "` failed (status " + std::to_string(r.status) + "):\n" +
                 r.output};
  }
  const std::string dir = std::string(HVTRACE_SOURCE_DIR) + "/build/guest/" + release.guest;
  DiskImage image{dir + "/disk.qcow2", FirstLine(ReadWhole(dir + "/kernel-release"))};
  if (access(image.disk.c_str(), R_OK) != 0 || image.release.empty()) {
    return Error{"`" + command + "` succeeded but " + dir +
                 " lacks disk.qcow2 or kernel-release:\n" + r.output};
  }
  // The suite's kernel, not some other one the package lists resolved to.
  if (image.release.rfind(release.kernel + ".", 0) != 0) {
    return Error{dir + " holds kernel " + image.release + ", not a " + release.kernel + " one (`" +
                 command + "`)"};
  }
  return image;
}

DiskGuest::DiskGuest(const std::string& tag) {
  static std::atomic<int> counter{0};
  // Unix socket paths are limited to 107 bytes: keep the directory short.
  dir_ = "/tmp/hvt-" + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
  fs::create_directories(dir_);
}

DiskGuest::~DiskGuest() {
  if (pid_ > 0) {
    if (qmp_ && qmp_->connected()) (void)qmp_->Execute("quit", nlohmann::json::object(), 3s);
    if (!Reap(3s)) {
      ::kill(pid_, SIGKILL);
      Reap(10s);
    }
  }
  qmp_.reset();
  console_.reset();
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
}

Status DiskGuest::Boot(const DiskImage& image, const std::vector<std::string>& extra_args) {
  if (pid_ > 0) return Error{"DiskGuest " + dir_ + " already booted"};
  // KVM's usability probe (hostd/qemu/kvm_probe.h) needs a kernel file; a
  // disk guest uses KVM only when HVTRACE_ACCEL=kvm says so. TCG runs one
  // thread for the same reason as hostd::BuildQemuPlan (text patching races).
  const bool kvm = EnvOr("HVTRACE_ACCEL", "") == "kvm";
  std::vector<std::string> argv = {
      EnvOr("HVTRACE_QEMU", "qemu-system-x86_64"), "-name", fs::path(dir_).filename().string(),
      "-no-user-config", "-nodefaults", "-display", "none", "-machine", "pc", "-accel",
      kvm ? "kvm" : "tcg,thread=single", "-smp", "2", "-m", "1024M", "-drive",
      "file=" + image.disk + ",if=virtio,format=qcow2,snapshot=on",
      // wait=on: QEMU runs the guest only once the console is connected.
      "-chardev",
      "socket,id=con,path=" + dir_ + "/console.sock,server=on,wait=on,logfile=" + dir_ +
          "/console.log",
      "-serial", "chardev:con", "-chardev",
      "socket,id=qmp,path=" + dir_ + "/qmp.sock,server=on,wait=off", "-mon",
      "chardev=qmp,mode=control", "-device", "pvpanic", "-action", "panic=pause"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());

  const std::string qemu_log = dir_ + "/qemu.log";
  pid_ = ::fork();
  if (pid_ < 0) return Error{"fork failed for QEMU of " + dir_};
  if (pid_ == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // QEMU dies with the test.
    const int log = ::open(qemu_log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (log < 0 || ::dup2(log, 1) < 0 || ::dup2(log, 2) < 0) ::_exit(126);
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  auto console = hostd::GuestConsole::Connect(dir_ + "/console.sock", 10s);
  if (!console.ok()) return Error{console.error().message + "\n" + Diagnostics()};
  console_ = std::move(console.value());
  auto qmp = hostd::QmpSyncClient::Connect(dir_ + "/qmp.sock", 10s);
  if (!qmp.ok()) return Error{qmp.error().message + "\n" + Diagnostics()};
  qmp_ = std::move(qmp.value());
  std::printf("[disk-guest] %s: %s, %s\n", dir_.c_str(), kvm ? "KVM" : "TCG", image.disk.c_str());
  return {};
}

bool DiskGuest::Reap(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const pid_t r = ::waitpid(pid_, &wait_status_, WNOHANG);
    if (r == pid_ || r < 0) {
      pid_ = -1;
      return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(50ms);
  }
}

Status DiskGuest::PowerOff(std::chrono::milliseconds timeout) {
  if (pid_ <= 0 || !qmp_) return Error{"DiskGuest " + dir_ + " is not running"};
  auto r = qmp_->Execute("system_powerdown");
  if (!r.ok()) return Error{"system_powerdown: " + r.error().message};
  if (!Reap(timeout)) {
    return Error{"the guest did not power off within " +
                 std::to_string(std::chrono::duration_cast<std::chrono::seconds>(timeout).count()) +
                 " s of system_powerdown\n" + Diagnostics()};
  }
  if (!WIFEXITED(wait_status_) || WEXITSTATUS(wait_status_) != 0) {
    return Error{"QEMU ended with wait status " + std::to_string(wait_status_) +
                 " after system_powerdown\n" + Diagnostics()};
  }
  return {};
}

std::string DiskGuest::ConsoleLog() const { return ReadWhole(dir_ + "/console.log"); }

std::string DiskGuest::Diagnostics() const {
  std::string out = "console log tail:\n" + FileTail(dir_ + "/console.log", 4000);
  out += "\nQEMU stderr:\n" + FileTail(dir_ + "/qemu.log", 2000);
  return out;
}

}  // namespace hvtrace::e2e
