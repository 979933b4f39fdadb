// Who may do what, tried the way a local user would: hvtraced runs as root
// with socket_group and admin_group set to numeric gids, and the real
// `hvtrace` CLI runs as uid 65534 (nobody) through setpriv with one of those
// gids as its only supplementary group (the daemon reads SO_PEERGROUPS, so
// no /etc/group entry is needed).
//
//   observer (socket_group): list, status, captures and `hvtrace show` of a
//     capture work; boot, attach, capture, stop and daemon-shutdown are
//     refused naming the group they need; the daemon keeps running.
//   anyone: `hvtrace boot --initrd /etc/shadow` fails in the CLI with a
//     permission error (the CLI opens input files as its user and passes the
//     descriptors), so the daemon never sees, let alone reads, the file.
//   admin (admin_group): boots a 6.12 guest (TCG) from files it can read,
//     captures it and stops it; the daemon booted private copies of the
//     kernel and initrd (byte-identical, in a 0700 directory).
//   files: capture dirs are setgid and group socket_group, capture files
//     0640 of that group; a user in neither group can read none of them.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "guest_harness.h"
#include "host_command.h"
#include "hvtraced_harness.h"
#include "vm_console.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr gid_t kObserverGid = 47021;
constexpr gid_t kAdminGid = 47022;
constexpr gid_t kStrangerGid = 47023;
constexpr uid_t kUser = 65534;

// The CLI as uid 65534 with |gid| as its only supplementary group, run from a
// copy in the daemon's test dir (the build tree may be unreachable for it).
class UserCli {
 public:
  UserCli(const HvtracedProcess& daemon, const std::string& cli, gid_t gid)
      : daemon_(daemon), cli_(cli), gid_(gid) {}
  RunResult Run(std::vector<std::string> args, bool with_socket = true) const {
    std::vector<std::string> argv = {"setpriv",
                                     "--reuid=" + std::to_string(kUser),
                                     "--regid=" + std::to_string(kUser),
                                     "--groups=" + std::to_string(gid_),
                                     "--",
                                     cli_};
    argv.insert(argv.end(), args.begin(), args.end());
    if (with_socket) {
      argv.push_back("--socket");
      argv.push_back(daemon_.socket());
    }
    return RunArgvStatus(argv);
  }
  // Whether this user can open |path| for reading.
  bool CanRead(const std::string& path) const {
    return RunArgvStatus({"setpriv", "--reuid=" + std::to_string(kUser),
                          "--regid=" + std::to_string(kUser), "--groups=" + std::to_string(gid_),
                          "--", "head", "-c", "1", path})
               .status == 0;
  }

 private:
  const HvtracedProcess& daemon_;
  std::string cli_;
  gid_t gid_;
};

TEST(RolesE2e, ObserverLooksAdminBootsNoOneReadsThroughTheDaemon) {
  if (std::string why = QemuUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  if (std::string why = OtherUserUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  auto image = FindGuestImage("6.12");
  ASSERT_TRUE(image.ok()) << image.error().message;

  HvtracedProcess daemon(
      {.tag = "roles",
       .config = "vm_on_shutdown = stop\nadmin_group = " + std::to_string(kAdminGid) + "\n",
       .socket_group = std::to_string(kObserverGid)});
  ASSERT_TRUE(daemon.Start().ok()) << daemon.log();
  Result<std::string> shared_cli = CliForOtherUsers(daemon);
  ASSERT_TRUE(shared_cli.ok()) << shared_cli.error().message;
  const std::string cli = *shared_cli;
  const std::string kernel = PublicCopy(image->kernel, daemon.dir());
  const std::string initrd = PublicCopy(image->initrd, daemon.dir());
  UserCli observer(daemon, cli, kObserverGid);
  UserCli admin(daemon, cli, kAdminGid);
  UserCli stranger(daemon, cli, kStrangerGid);
  const std::string name = "roles-" + std::to_string(::getpid());
  const std::string admin_group = "gid " + std::to_string(kAdminGid);

  // An observer may not boot: refused by the daemon, naming the group and
  // the command typed (`boot` asks for a harvest first, which is refused
  // too; that refusal is not the one shown).
  RunResult boot =
      observer.Run({"boot", name, "--kernel", kernel, "--initrd", initrd, "--accel", "tcg"});
  std::printf("[roles e2e] observer boot: %s", Describe(boot).c_str());
  EXPECT_EQ(boot.status, 7) << Describe(boot);
  EXPECT_NE(boot.output.find("'boot' needs the admin role"), std::string::npos) << boot.output;
  EXPECT_EQ(boot.output.find("formats-harvest"), std::string::npos) << boot.output;
  EXPECT_NE(boot.output.find(admin_group), std::string::npos) << boot.output;

  // /etc/shadow as the initrd: neither an observer nor an admin can read it,
  // so the CLI stops before it connects; the daemon never hears of it.
  for (const UserCli* user : {&observer, &admin}) {
    RunResult shadow = user->Run({"boot", name + "-shadow", "--kernel", kernel, "--initrd",
                                  "/etc/shadow", "--accel", "tcg", "--no-harvest"});
    std::printf("[roles e2e] boot --initrd /etc/shadow: %s", Describe(shadow).c_str());
    EXPECT_EQ(shadow.status, 7) << Describe(shadow);
    EXPECT_NE(shadow.output.find("cannot open initrd /etc/shadow as uid 65534: Permission denied"),
              std::string::npos)
        << shadow.output;
  }
  EXPECT_EQ(daemon.log().find("shadow"), std::string::npos) << daemon.log();
  EXPECT_FALSE(fs::exists(daemon.vm_dir(name + "-shadow")));

  // An admin boots from files it can read; the daemon boots its own copies.
  RunResult booted = admin.Run({"boot", name, "--kernel", kernel, "--initrd", initrd, "--accel",
                                "tcg", "--no-harvest", "--json"});
  ASSERT_EQ(booted.status, 0) << Describe(booted) << "\n" << daemon.LogTail();
  const fs::path inputs = fs::path(daemon.vm_dir(name)) / "inputs";
  struct stat st;
  ASSERT_EQ(::stat(inputs.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(fs::file_size(inputs / "kernel"), fs::file_size(kernel));
  EXPECT_EQ(fs::file_size(inputs / "initrd"), fs::file_size(initrd));
  EXPECT_EQ(ReadWhole((inputs / "kernel").string()), ReadWhole(kernel));
  const json boot_reply = json::parse(booted.output.substr(booted.output.find('{')));
  auto console = hostd::GuestConsole::Connect(boot_reply["console_socket"], 10s);
  ASSERT_TRUE(console.ok()) << console.error().message;
  ASSERT_TRUE((*console)->WaitForLine("HVTRACE-GUEST-READY", kBootTimeout).ok())
      << (*console)->Tail(40);
  auto marked = (*console)->Run(
      "echo hvt-roles-mark > /sys/kernel/tracing/instances/boot_map/trace_marker", kCommandTimeout);
  ASSERT_TRUE(marked.ok() && marked->status == 0);

  // An observer may not take a capture; an admin may.
  RunResult observer_capture = observer.Run({"capture", name});
  EXPECT_EQ(observer_capture.status, 7) << Describe(observer_capture);
  EXPECT_NE(observer_capture.output.find(admin_group), std::string::npos);
  RunResult captured = admin.Run({"capture", name, "--json"});
  ASSERT_EQ(captured.status, 0) << Describe(captured) << "\n" << daemon.LogTail();
  const std::string id = json::parse(captured.output.substr(captured.output.find('{')))["capture"];

  // What an observer may do.
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"list"}, {"status", name}, {"captures", name}}) {
    RunResult r = observer.Run(args);
    EXPECT_EQ(r.status, 0) << args[0] << ": " << Describe(r);
  }
  RunResult listed = observer.Run({"captures", name, "--json"});
  EXPECT_NE(listed.output.find(id), std::string::npos) << listed.output;
  const std::string capture_dir = daemon.captures_dir(name) + "/" + id;
  RunResult shown = observer.Run({"show", capture_dir}, /*with_socket=*/false);
  EXPECT_EQ(shown.status, 0) << Describe(shown);
  EXPECT_NE(shown.output.find("hvt-roles-mark"), std::string::npos) << shown.output.substr(0, 2000);

  // The capture's files belong to the observers' group, and nobody else.
  ASSERT_EQ(::stat(capture_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, kObserverGid);
  EXPECT_EQ(st.st_mode & 07777, 02750u);
  ASSERT_EQ(::stat((capture_dir + "/region.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, kObserverGid);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  EXPECT_TRUE(observer.CanRead(capture_dir + "/region.bin"));
  EXPECT_FALSE(stranger.CanRead(capture_dir + "/region.bin"));
  EXPECT_FALSE(observer.CanRead((inputs / "kernel").string()));
  // The guest-memory file is QEMU's backing file (issue #11 item 2, made
  // elsewhere); reported here, not asserted.
  const std::string region_file = boot_reply["region"].value("file", std::string());
  std::printf("[roles e2e] guest-memory file %s readable by a stranger: %s\n", region_file.c_str(),
              stranger.CanRead(region_file) ? "yes" : "no");
  // A user in neither group: the socket's mode (0660, socket_group, plus an
  // ACL entry for admin_group) refuses the connection itself.
  RunResult no_role = stranger.Run({"list"});
  EXPECT_EQ(no_role.status, 7) << Describe(no_role);
  EXPECT_NE(no_role.output.find("permission denied"), std::string::npos) << no_role.output;

  // Nor may an observer attach, stop or shut the daemon down.
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"attach", name, "--wait-ms", "0"}, {"stop", name}, {"daemon-shutdown"}}) {
    RunResult r = observer.Run(args);
    std::printf("[roles e2e] observer %s: %s", args[0].c_str(), Describe(r).c_str());
    EXPECT_EQ(r.status, 7) << args[0] << ": " << Describe(r);
    EXPECT_NE(r.output.find(admin_group), std::string::npos) << r.output;
  }
  EXPECT_TRUE(daemon.Call("ping", json::object()).ok()) << daemon.LogTail();

  RunResult stopped = admin.Run({"stop", name});
  EXPECT_EQ(stopped.status, 0) << Describe(stopped);
}

}  // namespace
}  // namespace hvtrace::e2e
