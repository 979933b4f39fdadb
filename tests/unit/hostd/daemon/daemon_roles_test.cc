// The daemon's roles from SO_PEERCRED/SO_PEERGROUPS against the real
// hvtraced binary: what an observer, an admin and a stranger may do, and
// that files reach clients only as checked, read-only descriptors.
#include "hostd/daemon/daemon_process.h"

namespace hvtrace::hostd {
namespace {

using namespace testing_daemon;  // NOLINT: the tests' own helpers.
namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

// One line per command: "cmd ok" or "cmd CODE: error".
std::string TryCommands(const fs::path& socket, const std::vector<std::string>& cmds) {
  auto c = ControlClient::Connect(socket, 2s);
  if (!c.ok()) return "connect failed: " + c.error().message;
  std::string report;
  for (const std::string& cmd : cmds) {
    json args = cmd == "ping" || cmd == "list" || cmd == "version" || cmd == "shutdown" ||
                        cmd == "formats-list"
                    ? json::object()
                    : json{{"name", "nosuchvm"}};
    auto r = c->Call(cmd, args, 5s);
    report +=
        cmd + " " +
        (r.ok() ? (r->ok ? std::string("ok") : r->code + ": " + r->error) : r.error().message) +
        "\n";
  }
  return report;
}

std::string LineOf(const std::string& report, const std::string& cmd) {
  std::istringstream in(report);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with(cmd + " ")) return line;
  }
  return "(no line for " + cmd + ")";
}

constexpr gid_t kObserverGid = 47011;
constexpr gid_t kAdminGid = 47012;

// Starts |d| with kObserverGid as its socket group and kAdminGid as its admin
// group, its directory open to uid 65534.
void StartWithRoles(DaemonProcess& d) {
  d.config_text = "socket_group = " + std::to_string(kObserverGid) +
                  "\nadmin_group = " + std::to_string(kAdminGid) + "\n";
  d.Start();
  ASSERT_EQ(::chmod(d.dir().c_str(), 0755), 0);
}

TEST(DaemonRolesTest, Malicious_ObserverMayLookButNotChangeAnything) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
  DaemonProcess d;
  ASSERT_NO_FATAL_FAILURE(StartWithRoles(d));
  const std::vector<std::string> looks = {"ping",     "version", "list",          "status",
                                          "captures", "stream",  "capture-files", "formats-list"};
  const std::vector<std::string> changes = {"boot",     "adopt",   "attach",
                                            "detach",   "capture", "stop",
                                            "shutdown", "setup",   "formats-harvest"};
  std::vector<std::string> all = looks;
  all.insert(all.end(), changes.begin(), changes.end());
  const std::string report = AsNobody({kObserverGid}, [&] { return TryCommands(d.socket(), all); });
  for (const std::string& cmd : looks) {
    // Allowed: ok, or an error about the VM, never permission_denied.
    EXPECT_EQ(LineOf(report, cmd).find(std::string(kErrDenied)), std::string::npos) << report;
  }
  EXPECT_EQ(LineOf(report, "formats-list"), "formats-list ok") << report;
  for (const std::string& cmd : changes) {
    const std::string line = LineOf(report, cmd);
    EXPECT_NE(line.find(std::string(kErrDenied) + ": '" + cmd + "' needs the admin role"),
              std::string::npos)
        << report;
    EXPECT_NE(line.find("gid " + std::to_string(kAdminGid)), std::string::npos) << line;
    EXPECT_NE(line.find("uid 65534"), std::string::npos) << line;
    EXPECT_NE(line.find("only an observer"), std::string::npos) << line;
  }
  // shutdown was refused: the daemon still answers.
  ExpectPing(d);
  EXPECT_TRUE(d.Alive());
}

TEST(DaemonRolesTest, AdminGroupMayChangeStateAndStrangersMayNotConnect) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
  DaemonProcess d;
  ASSERT_NO_FATAL_FAILURE(StartWithRoles(d));
  // A stranger (neither group) is refused on connect even with the socket opened up.
  ASSERT_EQ(::chmod(d.socket().c_str(), 0666), 0);
  const std::string stranger = AsNobody({12345}, [&] { return TryCommands(d.socket(), {"ping"}); });
  EXPECT_NE(stranger.find(std::string(kErrDenied)), std::string::npos) << stranger;
  // An admin (admin group only, not in socket_group) gets past the role check:
  // capture and stop fail on the unknown VM, not on permission.
  const std::string admin = AsNobody({kAdminGid}, [&] {
    return TryCommands(d.socket(), {"list", "capture", "stop", "formats-harvest"});
  });
  EXPECT_EQ(LineOf(admin, "list"), "list ok") << admin;
  EXPECT_NE(LineOf(admin, "capture").find(std::string(kErrUnknownVm)), std::string::npos) << admin;
  EXPECT_NE(LineOf(admin, "stop").find(std::string(kErrUnknownVm)), std::string::npos) << admin;
  EXPECT_NE(LineOf(admin, "formats-harvest").find(std::string(kErrBadRequest)), std::string::npos)
      << admin;
  const std::string shutdown =
      AsNobody({kAdminGid}, [&] { return TryCommands(d.socket(), {"shutdown"}); });
  EXPECT_EQ(LineOf(shutdown, "shutdown"), "shutdown ok") << shutdown;
  EXPECT_EQ(d.WaitExit(10s), 0) << d.Log();
}

// capture-files: an admin who is not in socket_group, and so cannot open
// the state dir, reads a capture through read-only descriptors; names that
// are no capture of the VM (a path, "..") are unknown, never opened.
TEST(DaemonRolesTest, Malicious_AdminReadsCapturesOnlyThroughReadOnlyDescriptors) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
  DaemonProcess d;
  CaptureStore store(d.state() / "vms/vm1/captures");
  auto p = store.Begin("panic", HostTime{1718187330123000000LL, 1});
  ASSERT_TRUE(p.ok());
  const std::string trace = "trace.dat stand-in";
  const std::string region(8192, 'r');
  ASSERT_TRUE((*p)->WriteFile("boot-0.trace.dat", std::as_bytes(std::span(trace))).ok());
  ASSERT_TRUE((*p)->WriteFile("region.bin", std::as_bytes(std::span(region))).ok());
  CaptureManifest m;
  m.vm = "vm1";
  m.trigger = "panic";
  auto committed = (*p)->Commit(m);
  ASSERT_TRUE(committed.ok()) << committed.error().message;
  const std::string id = committed->id;
  ASSERT_NO_FATAL_FAILURE(StartWithRoles(d));

  const std::string report = AsNobody({kAdminGid}, [&] {
    std::string out;
    // The files themselves are not this user's to open.
    if (::open((committed->dir / "region.bin").c_str(), O_RDONLY) < 0 && errno == EACCES)
      out += "direct open: EACCES\n";
    auto c = ControlClient::Connect(d.socket(), 2s);
    if (!c.ok()) return "connect failed: " + c.error().message;
    auto read_files = [&](const json& args) {
      auto r = c->CallForFiles(
          "capture-files", args, 5s, [&](const json& item, std::vector<SharedFd> fds) -> Status {
            if (fds.size() != 1) return Error{"want one descriptor"};
            const int fd = fds[0]->get();
            const int flags = ::fcntl(fd, F_GETFL);
            std::string data(item["bytes"].get<size_t>(), '\0');
            const ssize_t n = ::pread(fd, data.data(), data.size(), 0);
            out += item["file"].get<std::string>() + " " +
                   ((flags & O_ACCMODE) == O_RDONLY ? "ro" : "WRITABLE") + " " + std::to_string(n) +
                   " " +
                   (data == trace    ? "trace"
                    : data == region ? "region"
                                     : "?") +
                   (::write(fd, "x", 1) < 0 ? " write-refused" : " WROTE") + "\n";
            return {};
          });
      out += r.ok() ? (r->ok ? "end " + r->result.dump() : r->code + ": " + r->error)
                    : r.error().message;
      out += "\n";
    };
    read_files({{"name", "vm1"}, {"capture", id}});
    read_files({{"capture", id}});  // The one VM that has it.
    read_files({{"name", "vm1"}, {"capture", "../../../../etc"}});
    read_files({{"name", "vm1"}, {"capture", "."}});
    return out;
  });
  EXPECT_NE(report.find("direct open: EACCES"), std::string::npos) << report;
  EXPECT_NE(report.find("boot-0.trace.dat ro 18 trace write-refused"), std::string::npos) << report;
  EXPECT_NE(report.find("region.bin ro 8192 region write-refused"), std::string::npos) << report;
  EXPECT_EQ(report.find("WRITABLE"), std::string::npos) << report;
  EXPECT_EQ(report.find("WROTE"), std::string::npos) << report;
  EXPECT_NE(report.find("\"capture\":\"" + id + "\""), std::string::npos) << report;
  EXPECT_NE(report.find("\"files\":3"), std::string::npos) << report;  // + manifest.json
  EXPECT_NE(
      report.find(std::string(kErrUnknownCapture) + ": VM 'vm1' has no capture '../../../../etc'"),
      std::string::npos)
      << report;
  EXPECT_NE(report.find(std::string(kErrUnknownCapture) + ": VM 'vm1' has no capture '.'"),
            std::string::npos)
      << report;
  // A stranger gets nothing.
  const std::string stranger = AsNobody({12345}, [&] {
    auto c = ControlClient::Connect(d.socket(), 2s);
    if (!c.ok()) return "connect: " + c.error().message;
    auto r = c->CallForFiles("capture-files", {{"name", "vm1"}, {"capture", id}}, 5s,
                             [](const json&, std::vector<SharedFd>) -> Status {
                               return Error{"a stranger got a file"};
                             });
    return r.ok() ? (r->ok ? std::string("ok") : r->code + ": " + r->error) : r.error().message;
  });
  EXPECT_EQ(stranger.find("ok"), std::string::npos) << stranger;
  EXPECT_EQ(stranger.find("a stranger got a file"), std::string::npos) << stranger;
}

// Boot and adopt take their files as descriptors only, checked before
// anything is read or allocated.
TEST(DaemonRolesTest, Malicious_FilesMustComeAsCheckedDescriptors) {
  DaemonProcess d;
  d.Start();
  auto c = d.Client();
  // A path alone is never opened by the daemon.
  Reply path_only = Call(c, "boot", {{"name", "vm1"}, {"kernel", "/etc/shadow"}});
  EXPECT_EQ(path_only.code, kErrBadRequest);
  EXPECT_NE(path_only.error.find("must come as an open file descriptor"), std::string::npos)
      << path_only.error;
  EXPECT_NE(path_only.error.find("VM 'vm1'"), std::string::npos) << path_only.error;
  // A FIFO (would block a worker forever) is refused by type.
  const fs::path fifo = d.dir() / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  int fifo_fd = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(fifo_fd, 0);
  const int fds[] = {fifo_fd};
  auto r =
      c.Call("boot", {{"name", "vm1"}, {"kernel", fifo.string()}, {"kernel_fd", 0}}, 5s, {}, fds);
  ::close(fifo_fd);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->code, kErrBadRequest);
  EXPECT_NE(r->error.find("is not a regular file"), std::string::npos) << r->error;
  // An O_PATH descriptor needs no read permission on the file: refused.
  int path_fd = ::open("/etc/shadow", O_PATH | O_CLOEXEC);
  ASSERT_GE(path_fd, 0);
  const int path_fds[] = {path_fd};
  auto o_path = c.Call("boot", {{"name", "vm1"}, {"kernel", "/etc/shadow"}, {"kernel_fd", 0}}, 5s,
                       {}, path_fds);
  ::close(path_fd);
  ASSERT_TRUE(o_path.ok()) << o_path.error().message;
  EXPECT_EQ(o_path->code, kErrBadRequest);
  EXPECT_NE(o_path->error.find("not open for reading"), std::string::npos) << o_path->error;
  // formats-harvest: the same, for the kernel it would boot as root.
  Reply harvest_path = Call(c, "formats-harvest", {{"kernel", "/etc/shadow"}});
  EXPECT_EQ(harvest_path.code, kErrBadRequest);
  EXPECT_NE(harvest_path.error.find("kernel /etc/shadow must come as an open file descriptor"),
            std::string::npos)
      << harvest_path.error;
  int harvest_o_path = ::open("/etc/shadow", O_PATH | O_CLOEXEC);
  ASSERT_GE(harvest_o_path, 0);
  const int harvest_fds[] = {harvest_o_path};
  auto harvest_unreadable =
      c.Call("formats-harvest", {{"kernel", "/etc/shadow"}, {"kernel_fd", 0}}, 5s, {}, harvest_fds);
  ::close(harvest_o_path);
  ASSERT_TRUE(harvest_unreadable.ok()) << harvest_unreadable.error().message;
  EXPECT_EQ(harvest_unreadable->code, kErrBadRequest);
  EXPECT_NE(harvest_unreadable->error.find("not open for reading"), std::string::npos)
      << harvest_unreadable->error;
  // A descriptor index the request does not carry.
  Reply bad_index = Call(c, "boot", {{"name", "vm1"}, {"kernel", "k"}, {"kernel_fd", 3}});
  EXPECT_NE(bad_index.error.find("carries 0"), std::string::npos) << bad_index.error;
  // adopt's SIZE is capped before any buffer is sized from it (64 GiB here).
  const fs::path region = d.dir() / "region";
  std::ofstream(region) << "x";
  json adopt = {{"name", "vm2"},
                {"qmp", (d.dir() / "no.qmp").string()},
                {"boot_region", region.string() + "@0x100000000:64G"}};
  auto big = c.CallWithFiles("adopt", adopt, 5s);
  ASSERT_TRUE(big.ok()) << big.error().message;
  EXPECT_EQ(big->code, kErrBadRequest);
  EXPECT_NE(big->error.find("exceeds 1073741824 bytes"), std::string::npos) << big->error;
  // Within the cap but longer than the file passed.
  adopt["boot_region"] = region.string() + "@0x100000000:16M";
  auto short_file = c.CallWithFiles("adopt", adopt, 5s);
  ASSERT_TRUE(short_file.ok()) << short_file.error().message;
  EXPECT_NE(short_file->error.find("is shorter than 16777216"), std::string::npos)
      << short_file->error;
  // A request that declares descriptors it did not send.
  ASSERT_TRUE(c.SendRaw("{\"id\":9,\"cmd\":\"boot\",\"fds\":2,\"args\":{}}\n").ok());
  auto lying = c.ReadReply(5s);
  ASSERT_TRUE(lying.ok()) << lying.error().message;
  EXPECT_NE(lying->error.find("declares 2 file descriptors but 0 arrived"), std::string::npos)
      << lying->error;
  ExpectPing(d);
}

// adopt/attach --qmp: root connects only to a QMP socket served by the
// requesting user or by root.
TEST(DaemonRolesTest, Malicious_QmpSocketOfAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
  DaemonProcess d;
  d.Start();
  ASSERT_EQ(::chmod(d.dir().c_str(), 0777), 0);
  const fs::path sock = d.dir() / "other.qmp";
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t server = ::fork();
  ASSERT_GE(server, 0);
  if (server == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(10);
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr {};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", sock.c_str());
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 4) != 0)
      _exit(11);
    ssize_t ignored = ::write(ready[1], "r", 1);
    (void)ignored;
    ::pause();
    _exit(0);
  }
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  auto c = d.Client();
  Reply adopt = Call(c, "adopt", {{"name", "vm3"}, {"qmp", sock.string()}});
  Reply attach = Call(c, "attach", {{"name", "vm4"}, {"qmp", sock.string()}, {"wait_ms", 0}});
  ::kill(server, SIGKILL);
  ::waitpid(server, nullptr, 0);
  for (const Reply& r : {adopt, attach}) {
    EXPECT_EQ(r.code, kErrBadRequest) << r.error;
    EXPECT_NE(r.error.find("is served by uid 65534, not by the requesting user (uid 0) or root"),
              std::string::npos)
        << r.error;
  }
  Reply list = Call(c, "list");
  EXPECT_EQ(list.result["vms"], json::array());
}

}  // namespace
}  // namespace hvtrace::hostd
