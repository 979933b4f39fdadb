// Vm::Reattach and friends against real processes (a `sleep` standing in for
// a QEMU an earlier daemon started): identity checks by start time and
// command line, stop through the pidfd, Release leaving the process alone.
#include "vm_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// A long-lived process whose argv mentions |mark| (as $0 of `sh -c`), as a
// QEMU's argv mentions its QMP socket.
pid_t SpawnSleeper(const std::string& mark) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", "while :; do sleep 1; done", mark.c_str(), static_cast<char*>(nullptr));
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
  EXPECT_NE(vm.error().message.find("is not the QEMU we started"), std::string::npos) << vm.error().message;
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
  EXPECT_NE(gone.error().message.find("no longer exists"), std::string::npos) << gone.error().message;
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
