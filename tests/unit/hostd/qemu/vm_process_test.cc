// Vm::Reattach and friends against real processes (a `sleep` standing in for
// a QEMU an earlier daemon started): identity checks by start time and
// command line, stop through the pidfd, Release leaving the process alone.
#include "vm_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// A long-lived process whose argv mentions |mark| (as $0 of `sh -c`), as a
// QEMU's argv mentions its QMP socket.
pid_t SpawnSleeper(const std::string& mark) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", "while :; do sleep 1; done", mark.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

void Reap(pid_t pid) {
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

TEST(ProcessStartTimeTest, KnowsLiveProcessesOnly) {
  EXPECT_TRUE(ProcessStartTime(::getpid()).has_value());
  EXPECT_FALSE(ProcessStartTime(0).has_value());
  EXPECT_FALSE(ProcessStartTime(0x3ffffff0).has_value());  // Above pid_max.
}

// /proc/PID/stat's comm field is chosen by the process: it may hold spaces
// and parentheses, and must not shift the fields after it.
TEST(ProcessStartTimeTest, Malicious_CommWithParenthesesAndSpaces) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(ready[0]);
    ::prctl(PR_SET_NAME, "x) (y z) 1 2", 0, 0, 0);
    char c = 1;
    if (::write(ready[1], &c, 1) != 1) ::_exit(1);
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  const std::string comm = [&] {
    std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
    std::string line;
    std::getline(in, line);
    return line;
  }();
  EXPECT_EQ(comm, "x) (y z) 1 2");
  auto renamed = ProcessStartTime(pid);
  // The start time is the 22nd field; compare with a parse that only trusts
  // the last ')' the same way the kernel documents it.
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::ostringstream text;
  text << in.rdbuf();  // Not istreambuf_iterator: GCC 12 warns falsely (-Wnull-dereference).
  const std::string stat = text.str();
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  for (int i = 3; i <= 22; ++i) rest >> field;
  ASSERT_TRUE(renamed.has_value());
  EXPECT_EQ(*renamed, std::stoull(field));
  EXPECT_GT(*renamed, 0u);
  Reap(pid);
}

TEST(VmReattachTest, TakesBackTheSameProcessAndStopsIt) {
  const std::string mark = "/tmp/hvt-reattach-" + std::to_string(::getpid()) + ".qmp";
  const pid_t pid = SpawnSleeper(mark);
  ASSERT_GT(pid, 0);
  std::this_thread::sleep_for(100ms);  // Let exec happen, so argv is the sleeper's.
  auto start = ProcessStartTime(pid);
  ASSERT_TRUE(start.has_value());
  const std::string owned = "/tmp/hvt-reattach-owned-" + std::to_string(::getpid());
  std::ofstream(owned) << "x";

  VmIdentity id{pid, *start, mark, {owned}};
  auto vm = Vm::Reattach("rt", id);
  ASSERT_TRUE(vm.ok()) << vm.error().message;
  EXPECT_EQ((*vm)->pid(), pid);
  EXPECT_TRUE((*vm)->Running());
  // SIGTERM through the pidfd; sleep dies of it. It is still our child, so
  // reap it once the pidfd said it exited.
  std::thread reaper([pid] { ::waitpid(pid, nullptr, 0); });
  EXPECT_TRUE((*vm)->Stop(nullptr, 2s).ok());
  EXPECT_FALSE((*vm)->Running());
  reaper.join();
  (*vm)->Cleanup();
  EXPECT_FALSE(fs::exists(owned));
}

// Another part of the process closes the Vm's pidfd by mistake and the
// number is reused by a plain file (always readable): the Vm must not take
// that for "exited", and Stop still ends the process, by its /proc identity.
// (The service test's "vm_on_shutdown = stop left hvtrace-vm-demo.scope":
// the daemon's Stop returned at once and the QEMU ran on.)
TEST(VmReattachTest, APidfdClobberedByOtherCodeStillStopsTheProcess) {
  const std::string mark = "/tmp/hvt-reattach-clobber-" + std::to_string(::getpid()) + ".qmp";
  const pid_t pid = SpawnSleeper(mark);
  ASSERT_GT(pid, 0);
  std::this_thread::sleep_for(100ms);
  auto start = ProcessStartTime(pid);
  ASSERT_TRUE(start.has_value());
  auto pidfds = [] {
    std::vector<int> out;
    for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      if (fs::read_symlink(e.path(), ec).string() == "anon_inode:[pidfd]") {
        out.push_back(std::stoi(e.path().filename().string()));
      }
    }
    return out;
  };
  const std::vector<int> before = pidfds();
  auto vm = Vm::Reattach("rt", VmIdentity{pid, *start, mark, {}});
  ASSERT_TRUE(vm.ok()) << vm.error().message;
  int pidfd = -1;
  for (int fd : pidfds()) {
    if (std::find(before.begin(), before.end(), fd) == before.end()) pidfd = fd;
  }
  ASSERT_GE(pidfd, 0);
  const int file = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(file, 0);
  ASSERT_EQ(::dup2(file, pidfd), pidfd);  // Closes the pidfd; the number now reads a file.
  ::close(file);
  EXPECT_TRUE((*vm)->Running());
  EXPECT_TRUE((*vm)->Stop(nullptr, 2s).ok());
  bool reaped = false;  // Our child: reaped here once it is gone.
  for (int i = 0; i < 30 && !reaped; ++i) {
    reaped = ::waitpid(pid, nullptr, WNOHANG) == pid;
    if (!reaped) std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(reaped) << "Stop left pid " << pid << " running";
  if (!reaped) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
}

TEST(VmReattachTest, RefusesAReusedPid) {
  const std::string mark = "/tmp/hvt-reused-" + std::to_string(::getpid()) + ".qmp";
  const pid_t pid = SpawnSleeper(mark);
  std::this_thread::sleep_for(100ms);
  auto start = ProcessStartTime(pid);
  ASSERT_TRUE(start.has_value());
  auto vm = Vm::Reattach("rt", VmIdentity{pid, *start + 1, mark, {}});
  ASSERT_FALSE(vm.ok());
  EXPECT_NE(vm.error().message.find("the pid was reused"), std::string::npos) << vm.error().message;
  EXPECT_NE(vm.error().message.find("VM 'rt'"), std::string::npos) << vm.error().message;
  EXPECT_EQ(::kill(pid, 0), 0);  // Refusing never signals the stranger.
  Reap(pid);
}

TEST(VmReattachTest, RefusesAProcessThatIsNotThatQemu) {
  const pid_t pid = SpawnSleeper("/tmp/something-else");
  std::this_thread::sleep_for(100ms);
  auto start = ProcessStartTime(pid);
  ASSERT_TRUE(start.has_value());
  auto vm = Vm::Reattach("rt", VmIdentity{pid, *start, "/run/hvtrace/rt.qmp", {}});
  ASSERT_FALSE(vm.ok());
  EXPECT_NE(vm.error().message.find("is not the QEMU we started"), std::string::npos)
      << vm.error().message;
  Reap(pid);
}

TEST(VmReattachTest, RefusesAGoneProcessAndMissingIdentity) {
  const pid_t pid = SpawnSleeper("/tmp/gone");
  std::this_thread::sleep_for(100ms);
  auto start = ProcessStartTime(pid);
  ASSERT_TRUE(start.has_value());
  Reap(pid);
  auto gone = Vm::Reattach("rt", VmIdentity{pid, *start, "", {}});
  ASSERT_FALSE(gone.ok());
  EXPECT_NE(gone.error().message.find("no longer exists"), std::string::npos)
      << gone.error().message;
  auto unknown = Vm::Reattach("rt", VmIdentity{-1, 0, "", {}});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("no recorded QEMU pid"), std::string::npos);
}

TEST(VmReattachTest, ReleaseLeavesTheProcessRunning) {
  const std::string mark = "/tmp/hvt-release-" + std::to_string(::getpid()) + ".qmp";
  const pid_t pid = SpawnSleeper(mark);
  std::this_thread::sleep_for(100ms);
  auto start = ProcessStartTime(pid);
  ASSERT_TRUE(start.has_value());
  const std::string owned = "/tmp/hvt-release-owned-" + std::to_string(::getpid());
  std::ofstream(owned) << "x";
  {
    auto vm = Vm::Reattach("rt", VmIdentity{pid, *start, mark, {owned}});
    ASSERT_TRUE(vm.ok()) << vm.error().message;
    (*vm)->Release();
  }
  EXPECT_EQ(ProcessStartTime(pid), start);  // Still alive, same process.
  EXPECT_TRUE(fs::exists(owned));           // Its files stay for the next daemon.
  fs::remove(owned);
  Reap(pid);
}

}  // namespace
}  // namespace hvtrace::hostd
