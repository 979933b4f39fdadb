// QEMU not as root (#30): hvtraced, running as root, boots a 6.12 guest with
// qemu_user = hvtrace-qemu (the package's system user; created here with
// useradd --system when missing and removed again afterwards). QEMU's
// /proc/PID/status shows that user's uid in all four fields, and everything
// that needs QEMU to open a file after it dropped root works: the metadata
// channel's build-id check (QMP memsave into a file the daemon made for
// QEMU's group), `hvtrace attach` (the hot-plugged region file, root's, 0660
// of QEMU's group, in the 0710 guest memory directory), `hvtrace stream`, the
// boot timeline (QEMU's trace log) and the panic capture of both the boot
// range and the attached region.
#include <grp.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "attach_region_host.h"
#include "guest_harness.h"
#include "hvtraced_harness.h"
#include "stream_reader.h"
#include "test_support.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using test_support::ReadText;
using test_support::RunCommandStatus;

constexpr const char* kQemuUser = "hvtrace-qemu";

// The package's user (hostd/packaging/hvtrace.sysusers): a system user with
// no login, in kvm. Created for the test when the host has none, and removed
// by the destructor only then.
class QemuUserFixture {
 public:
  Status Ensure() {
    if (::getpwnam(kQemuUser) != nullptr) return {};
    const auto r = RunCommandStatus(
        std::string("useradd --system --user-group --no-create-home --home-dir /nonexistent "
                    "--shell /usr/sbin/nologin ") +
        (::getgrnam("kvm") != nullptr ? "--groups kvm " : "") + kQemuUser + " 2>&1");
    if (r.status != 0) return Error{"useradd " + std::string(kQemuUser) + ": " + r.out};
    created_ = true;
    return {};
  }
  ~QemuUserFixture() {
    if (created_) (void)RunCommandStatus(std::string("userdel ") + kQemuUser + " 2>&1");
  }

 private:
  bool created_ = false;
};

// The four uids of /proc/PID/status's "Uid:" line (real, effective, saved, fs).
std::vector<uid_t> StatusUids(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (!line.starts_with("Uid:")) continue;
    std::istringstream fields(line.substr(4));
    std::vector<uid_t> uids;
    for (unsigned long id; fields >> id;) uids.push_back(static_cast<uid_t>(id));
    return uids;
  }
  return {};
}

// `trace-cmd report` of every trace.dat of a capture (not the host-clock
// copies), one after the other.
std::string ReportAll(const fs::path& capture) {
  std::string all;
  for (const auto& entry : fs::directory_iterator(capture)) {
    const std::string file = entry.path().filename().string();
    if (!file.ends_with(".trace.dat")) continue;
    all += "### " + file + "\n" +
           RunCommandStatus("trace-cmd report '" + entry.path().string() + "' 2>&1").out;
  }
  return all;
}

TEST(QemuUserE2e, BootedVmRunsAsTheQemuUserAndAttachStreamCaptureWork) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  ASSERT_EQ(::geteuid(), 0u) << "hvtraced must run as root to start QEMU as another user";
  ASSERT_EQ(access((std::string(HVTRACE_BIN_DIR) + "/hvtrace-agent").c_str(), X_OK), 0)
      << "hvtrace-agent not built";
  QemuUserFixture user;
  ASSERT_TRUE(user.Ensure().ok());
  const passwd* pw = ::getpwnam(kQemuUser);
  ASSERT_NE(pw, nullptr);
  const uid_t qemu_uid = pw->pw_uid;
  const gid_t qemu_gid = pw->pw_gid;
  auto image = ImageWithThisAgent("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;

  HvtracedProcess daemon(
      {.tag = "qu",
       .config = "vm_on_shutdown = stop\nqemu_user = " + std::string(kQemuUser) + "\n"});
  ASSERT_TRUE(daemon.Start().ok()) << daemon.LogTail();
  // QEMU's user must reach <run_dir>/mem as it reaches /run/hvtrace/mem
  // under systemd (/run/hvtrace is 0755).
  ASSERT_EQ(::chmod(daemon.dir().c_str(), 0755), 0);
  const std::string name = "qu-" + std::to_string(::getpid());
  auto guest = BootDaemonGuest(
      daemon, name, image->kernel, image->initrd,
      {{"trace_boot", true}, {"devices", {"virtio-blk", "virtio-net", "virtio-serial"}}});
  ASSERT_TRUE(guest.ok()) << guest.error().message;
  hostd::GuestConsole& console = *guest->console;
  auto tail = [&] { return ConsoleAndLog(*guest, daemon); };
  ASSERT_TRUE(console.WaitForLine("HVTRACE-GUEST-READY", kBootTimeout).ok()) << tail();

  // QEMU dropped root for good: real, effective, saved and fs uid.
  const pid_t qemu_pid = guest->reply["pid"].get<pid_t>();
  const std::vector<uid_t> uids = StatusUids(qemu_pid);
  ASSERT_EQ(uids.size(), 4u) << "pid " << qemu_pid;
  for (uid_t uid : uids) EXPECT_EQ(uid, qemu_uid) << "QEMU pid " << qemu_pid << tail();
  std::printf("[qemu-user] QEMU pid %d runs as uid %u (%s)\n", qemu_pid, qemu_uid, kQemuUser);
  const fs::path mem = fs::path(daemon.dir()) / "run" / "mem";
  struct stat st {};
  ASSERT_EQ(::stat(mem.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0710u);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_gid, qemu_gid);
  // The boot range's file stays the daemon's alone: QEMU opened it as root.
  ASSERT_EQ(::stat((mem / ("hvtrace-" + name)).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_uid, 0u);

  // The agent's metadata, its build id checked in guest memory (memsave).
  ASSERT_TRUE(console.Run("(hvtrace-agent > /tmp/agent.log 2>&1 &)", kCommandTimeout).ok());
  json meta;
  for (const auto deadline = std::chrono::steady_clock::now() + 300s;
       std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(500ms)) {
    auto status = daemon.Call("status", {{"name", name}});
    ASSERT_TRUE(status.ok()) << status.error().message;
    meta = (*status)["meta"];
    if (meta.is_object() && meta.value("boots_accepted", 0) >= 1) break;
  }
  ASSERT_EQ(meta.value("boots_accepted", 0), 1) << meta.dump(2) << tail();
  EXPECT_EQ(meta["last_boot"]["verified"]["build_id"], "verified") << meta.dump(2) << tail();

  // attach: the region file is the daemon's, QEMU's group may read and write it.
  auto attached = daemon.HvtraceJson(
      {"attach", name, "--size", "16M", "--pump-ms", "50", "--wait-ms", "60000"});
  ASSERT_TRUE(attached.ok()) << attached.error().message << tail();
  ASSERT_FALSE((*attached)["guest"].is_null()) << attached->dump(2) << tail();
  EXPECT_EQ((*attached)["transport"]["qemu_uid"], qemu_uid) << attached->dump(2);
  const std::string region_file = (*attached)["region"]["file"];
  EXPECT_EQ(region_file, (mem / ("hvtrace-" + name + "-attach")).string());
  ASSERT_EQ(::stat(region_file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_gid, qemu_gid);

  StreamReader stream(daemon, name);
  ASSERT_TRUE(stream.WaitForNote("streaming VM", 10s)) << stream.output();
  std::this_thread::sleep_for(300ms);  // The stream's first look is taken.
  ASSERT_TRUE(console
                  .Run("echo HVT-QU-ATTACH > /sys/kernel/tracing/instances/hvtrace/trace_marker",
                       kCommandTimeout)
                  .ok());
  ASSERT_TRUE(stream.WaitForText("HVT-QU-ATTACH", 30s)) << stream.output() << tail();

  ASSERT_TRUE(console
                  .Run("echo HVT-QU-BOOT > /sys/kernel/tracing/instances/boot_map/trace_marker",
                       kCommandTimeout)
                  .ok());
  ASSERT_TRUE(console.Send("echo c > /proc/sysrq-trigger\n").ok());
  auto panic = daemon.WaitForCapture(name, "panic", 120s);
  ASSERT_TRUE(panic.ok()) << panic.error().message << tail();
  const fs::path dir = fs::path(daemon.captures_dir(name)) / (*panic)["id"].get<std::string>();
  const json manifest = json::parse(ReadText(dir / "manifest.json"));
  const std::string report = ReportAll(dir);
  EXPECT_NE(report.find("HVT-QU-ATTACH"), std::string::npos) << report.substr(0, 3000);
  EXPECT_NE(report.find("HVT-QU-BOOT"), std::string::npos) << report.substr(0, 3000);
  // The boot timeline: QEMU's own trace log, opened before it dropped root.
  EXPECT_TRUE(fs::exists(dir / "host.dat")) << manifest["files"].dump();
  ASSERT_TRUE(manifest["extra"].contains("timeline")) << manifest["extra"].dump(2);
  EXPECT_GT(manifest["extra"]["timeline"].value("pairs", 0), 0)
      << manifest["extra"]["timeline"].dump(2);
  std::printf("[qemu-user] panic capture %s: files %s, timeline pairs %s\n",
              (*panic)["id"].get<std::string>().c_str(), manifest["files"].dump().c_str(),
              manifest["extra"]["timeline"]["pairs"].dump().c_str());
  EXPECT_TRUE(stream.WaitForExit(30s)) << stream.output();
}

}  // namespace
}  // namespace hvtrace::e2e
