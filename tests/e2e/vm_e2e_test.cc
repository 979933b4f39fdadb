// Real guests under QEMU: the launcher, the QMP client and the console
// against the 6.12 and 6.1 guest images (qemu-scripts/build-guest.sh).
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "guest_harness.h"
#include "test_support.h"

namespace hvtrace::e2e {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

#define SKIP_UNLESS_QEMU_RUNS()                                    \
  do {                                                             \
    if (std::string why = QemuUnavailableReason(); !why.empty()) { \
      GTEST_SKIP() << "QEMU cannot run here: " << why;             \
    }                                                              \
  } while (0)

#define ASSERT_OK(expr)                         \
  do {                                          \
    auto&& _s = (expr);                         \
    ASSERT_TRUE(_s.ok()) << _s.error().message; \
  } while (0)

bool FileExists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

std::vector<uint8_t> ReadWholeFile(const std::string& path) {
  std::vector<uint8_t> data;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return data;
  struct stat st;
  if (fstat(fd, &st) == 0) {
    data.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = pread(fd, data.data() + done, data.size() - done, static_cast<off_t>(done));
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    data.resize(done);
  }
  close(fd);
  return data;
}

uint32_t LoadLe32(const std::vector<uint8_t>& data, size_t offset) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | data[offset + static_cast<size_t>(i)];
  return v;
}

std::string RandomMarker() {
  std::random_device rd;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "HVT-MARKER-%08x", rd());
  return buf;
}

// 6.12, 16 MiB host-backed boot range holding the persistent ring buffer:
// a marker written in the guest is in the host file after a panic, and every
// vCPU's chunk starts with the ring_buffer_meta magic.
TEST(VmE2eTest, BootMap612PanicLeavesBufferInHostFile) {
  SKIP_UNLESS_QEMU_RUNS();
  auto image = FindGuestImage("6.12");
  ASSERT_OK(image);
  TestGuest guest("bm");
  hostd::VmConfig config = guest.MakeConfig(*image);
  config.boot_range = hostd::BootRangeConfig{};
  config.boot_range->backing_path = guest.ShmPath("boot");
  config.boot_range->range_bytes = 16 * hostd::kMiB;
  config.boot_range->instance_name = "boot_map";
  config.boot_range->events = "sched:sched_switch,irq";
  ASSERT_OK(guest.Boot(config));
  const hostd::BootRangeLayout layout = *guest.vm().plan().boot_range;
  ASSERT_EQ(layout.range_gpa, 0x40000000u);

  auto cpus = guest.Run("cat /sys/devices/system/cpu/possible");
  ASSERT_OK(cpus);
  ASSERT_EQ(cpus->output, "0-1\n") << "expected 2 possible CPUs; " << guest.Diagnostics();
  auto instance = guest.Run("cat /sys/kernel/tracing/instances/boot_map/tracing_on");
  ASSERT_OK(instance);
  ASSERT_EQ(instance->status, 0) << "no boot_map instance; " << guest.Diagnostics();
  ASSERT_EQ(instance->output, "1\n");

  const std::string marker = RandomMarker();
  auto wrote =
      guest.Run("echo " + marker + " > /sys/kernel/tracing/instances/boot_map/trace_marker");
  ASSERT_OK(wrote);
  ASSERT_EQ(wrote->status, 0) << wrote->output << guest.Diagnostics();
  // The guest's own view (reading `trace` does not consume the buffer).
  auto seen = guest.Run("grep -c " + marker + " /sys/kernel/tracing/instances/boot_map/trace");
  ASSERT_OK(seen);
  EXPECT_EQ(seen->output, "1\n") << guest.Diagnostics();

  ASSERT_OK(guest.console().Send("echo c > /proc/sysrq-trigger\n"));
  auto panicked = guest.qmp().WaitForEvent("GUEST_PANICKED", 60s);
  ASSERT_TRUE(panicked.ok()) << panicked.error().message << "\n" << guest.Diagnostics();
  EXPECT_EQ(panicked->data.value("action", ""), "pause");
  auto stopped = guest.qmp().WaitForEvent("STOP", 10s);
  ASSERT_OK(stopped);
  auto status = guest.qmp().Execute("query-status");
  ASSERT_OK(status);
  EXPECT_EQ(status->value("status", ""), "guest-panicked");
  EXPECT_FALSE(status->value("running", true));

  // The VM is paused: the host file is stable.
  const std::vector<uint8_t> file = ReadWholeFile(config.boot_range->backing_path);
  ASSERT_EQ(file.size(), layout.node1_bytes);
  const size_t per_cpu = layout.range_bytes / 2;
  for (size_t cpu = 0; cpu < 2; ++cpu) {
    const size_t meta = layout.file_offset + cpu * per_cpu;
    EXPECT_EQ(LoadLe32(file, meta), 0x0BADFEEDu)
        << "CPU " << cpu << " meta at file offset " << meta;
    EXPECT_EQ(LoadLe32(file, meta + 4), 56u) << "CPU " << cpu << " struct_size";
  }
  const auto range_begin = file.begin() + static_cast<std::ptrdiff_t>(layout.file_offset);
  const auto range_end = range_begin + static_cast<std::ptrdiff_t>(layout.range_bytes);
  EXPECT_NE(std::search(range_begin, range_end, marker.begin(), marker.end()), range_end)
      << "marker " << marker << " not in the host-backed range";
}

// 6.1 has no persistent buffer; the launcher, QMP and the console work there
// too, and pvpanic still reports the crash.
TEST(VmE2eTest, Guest61QmpAndPanic) {
  SKIP_UNLESS_QEMU_RUNS();
  auto image = FindGuestImage("6.1");
  ASSERT_OK(image);
  TestGuest guest("g61");
  ASSERT_OK(guest.Boot(guest.MakeConfig(*image)));

  auto status = guest.qmp().Execute("query-status");
  ASSERT_OK(status);
  EXPECT_EQ(status->value("status", ""), "running");
  EXPECT_TRUE(status->value("running", false));
  // The QEMU the harness ran (HVTRACE_QEMU, else the host's: 7.2 on Debian
  // 12, 10.0 on Debian 13) is the one QMP greets with.
  const auto& qemu = guest.qmp().greeting()["version"]["qemu"];
  const std::string dotted =
      qemu["major"].dump() + "." + qemu["minor"].dump() + "." + qemu["micro"].dump();
  const char* binary = std::getenv("HVTRACE_QEMU");
  const std::string said = test_support::RunCommand(
      std::string(binary != nullptr && *binary != '\0' ? binary : "qemu-system-x86_64") +
      " -version");
  EXPECT_NE(said.find("version " + dotted), std::string::npos) << said;

  auto uname = guest.Run("uname -r");
  ASSERT_OK(uname);
  EXPECT_EQ(uname->status, 0);
  EXPECT_EQ(uname->output, image->release + "\n");
  auto failing = guest.Run("ls /nonexistent-hvtrace");
  ASSERT_OK(failing);
  EXPECT_NE(failing->status, 0);

  // An unknown command is a QMP error, not a dead connection.
  auto bad = guest.qmp().Execute("no-such-command");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.error().message, HasSubstr("CommandNotFound"));

  ASSERT_OK(guest.console().Send("echo c > /proc/sysrq-trigger\n"));
  auto panicked = guest.qmp().WaitForEvent("GUEST_PANICKED", 60s);
  ASSERT_TRUE(panicked.ok()) << panicked.error().message << "\n" << guest.Diagnostics();
  ASSERT_OK(guest.qmp().WaitForEvent("STOP", 10s));

  // Stop via QMP quit: a clean exit, then nothing is left behind.
  const std::vector<std::string> owned = guest.vm().OwnedPaths();
  ASSERT_OK(guest.vm().Stop(&guest.qmp()));
  EXPECT_EQ(guest.vm().DescribeExit(), "exited with status 0");
  guest.vm().Cleanup();
  for (const std::string& path : owned) EXPECT_FALSE(FileExists(path)) << path;
}

// QEMU dies under us (SIGKILL from outside): the QMP client reports EOF at
// once, commands fail fast, and the launcher removes sockets and shm files.
TEST(VmE2eTest, QemuKilledFromOutside) {
  SKIP_UNLESS_QEMU_RUNS();
  auto image = FindGuestImage("6.12");
  ASSERT_OK(image);
  TestGuest guest("kill");
  hostd::VmConfig config = guest.MakeConfig(*image);
  config.ivshmem.push_back({"ivs0", guest.ShmPath("ivs0"), 4 * hostd::kMiB, true});
  ASSERT_OK(guest.Boot(config));

  // The cold-plugged ivshmem device is there (PCI 1af4:1110) and its backing
  // file exists on the host.
  auto pci = guest.Run(
      "cat /sys/bus/pci/devices/*/device /sys/bus/pci/devices/*/vendor | sort -u | tr '\\n' ' '");
  ASSERT_OK(pci);
  EXPECT_THAT(pci->output, HasSubstr("0x1110"));
  EXPECT_THAT(pci->output, HasSubstr("0x1af4"));
  const std::vector<std::string> owned = guest.vm().OwnedPaths();
  ASSERT_EQ(owned.size(), 3u);  // QMP socket, console socket, ivshmem file.
  for (const std::string& path : owned) ASSERT_TRUE(FileExists(path)) << path;

  const auto killed_at = Clock::now();
  ASSERT_EQ(kill(guest.vm().pid(), SIGKILL), 0);
  auto eof = guest.qmp().WaitForDisconnect(5s);
  ASSERT_TRUE(eof.has_value()) << "no EOF from QMP within 5 s";
  EXPECT_THAT(eof->message, HasSubstr("closed by QEMU"));
  const auto latency = *guest.qmp().disconnected_at() - killed_at;
  EXPECT_LT(latency, 1s) << "EOF noticed after "
                         << std::chrono::duration_cast<std::chrono::milliseconds>(latency).count()
                         << " ms";
  std::printf("QMP EOF noticed %lld us after SIGKILL\n",
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::microseconds>(latency).count()));

  const auto before = Clock::now();
  auto after_eof = guest.qmp().Execute("query-status", nlohmann::json::object(), 10s);
  ASSERT_FALSE(after_eof.ok());
  EXPECT_LT(Clock::now() - before, 100ms) << "a command after EOF must fail at once";
  EXPECT_FALSE(guest.qmp().WaitForEvent("SHUTDOWN", 10s).ok());

  ASSERT_TRUE(guest.vm().WaitForExit(5s));
  EXPECT_EQ(guest.vm().DescribeExit(), "killed by signal 9");
  guest.vm().Cleanup();
  for (const std::string& path : owned) EXPECT_FALSE(FileExists(path)) << path;
}

}  // namespace
}  // namespace hvtrace::e2e
