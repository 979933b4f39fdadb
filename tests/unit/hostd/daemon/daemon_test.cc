// Starts the real hvtraced binary on a temporary state dir and socket and
// talks to it the way clients (and hostile clients) do.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "capture_store.h"
#include "control_client.h"
#include "control_protocol.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

const fs::path kBinDir = HVTRACE_BIN_DIR;

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class DaemonProcess {
 public:
  DaemonProcess() {
    std::string tmpl = (fs::temp_directory_path() / "hvtraced-test-XXXXXX").string();
    dir_ = ::mkdtemp(tmpl.data());
    socket_ = dir_ / "run/hvtraced.sock";
    state_ = dir_ / "state";
  }
  ~DaemonProcess() {
    Kill();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Starts hvtraced and waits until it answers; |extra| are more flags.
  void Start(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {(kBinDir / "hvtraced").string(),
                                     "--config",
                                     WriteConfig().string(),
                                     "--state-dir",
                                     state_.string(),
                                     "--socket",
                                     socket_.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = Spawn(args, dir_ / "daemon.log");
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
      auto c = ControlClient::Connect(socket_, 1s);
      if (c.ok()) {
        auto r = c->Call("ping", json::object(), 5s);
        if (r.ok() && r->ok) return;
      }
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL() << "hvtraced exited during start: " << Log();
      }
      std::this_thread::sleep_for(20ms);
    }
    FAIL() << "hvtraced did not answer within 10 s: " << Log();
  }

  // Runs a program to completion, capturing output; returns the exit status.
  static int Run(const std::vector<std::string>& args, std::string* output,
                 const fs::path& out_file) {
    pid_t pid = Spawn(args, out_file);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (output) *output = ReadFile(out_file);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // Sends |signo| and waits up to |timeout| for exit; returns the exit status
  // or -1 on timeout.
  int Signal(int signo, std::chrono::milliseconds timeout) {
    if (pid_ < 0) return -1;
    ::kill(pid_, signo);
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(10ms);
    }
    return -1;
  }

  // Waits for the daemon to exit by itself.
  int WaitExit(std::chrono::milliseconds timeout) { return Signal(0, timeout); }

  bool Alive() const { return pid_ > 0 && ::kill(pid_, 0) == 0; }

  ControlClient Client() {
    auto c = ControlClient::Connect(socket_, 2s);
    EXPECT_TRUE(c.ok()) << c.error().message;
    return std::move(*c);
  }

  std::string Log() const { return ReadFile(dir_ / "daemon.log"); }

  const fs::path& dir() const { return dir_; }
  const fs::path& socket() const { return socket_; }
  const fs::path& state() const { return state_; }
  std::string config_text = "socket_group =\n";

 private:
  fs::path WriteConfig() {
    fs::path p = dir_ / "hvtraced.conf";
    std::ofstream(p) << config_text;
    return p;
  }

  static pid_t Spawn(const std::vector<std::string>& args, const fs::path& log) {
    pid_t pid = ::fork();
    if (pid == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      _exit(127);
    }
    return pid;
  }

  void Kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  fs::path dir_, socket_, state_;
  pid_t pid_ = -1;
};

Reply Call(ControlClient& c, std::string_view cmd, const json& args = json::object()) {
  auto r = c.Call(cmd, args, 5s);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? *r : Reply{};
}

void ExpectPing(DaemonProcess& d) {
  auto c = d.Client();
  Reply r = Call(c, "ping");
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.result["pong"], true);
}

TEST(DaemonTest, SocketIsMode0660AndAnswersBasicCommands) {
  DaemonProcess d;
  d.Start();
  struct stat st;
  ASSERT_EQ(::stat(d.socket().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u);

  auto c = d.Client();
  Reply v = Call(c, "version");
  EXPECT_TRUE(v.ok);
  EXPECT_EQ(v.result["protocol"], 1);
  EXPECT_EQ(v.result["config"]["state_dir"], d.state().string());
  Reply l = Call(c, "list");
  EXPECT_TRUE(l.ok);
  EXPECT_EQ(l.result["vms"], json::array());
}

TEST(DaemonTest, Malicious_BadRequestsGetClearErrorsAndDaemonStaysUp) {
  DaemonProcess d;
  d.Start();
  auto c = d.Client();

  ASSERT_TRUE(c.SendRaw("{\"id\":1,\"cmd\":\n").ok());
  auto r = c.ReadReply(5s);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_FALSE(r->ok);
  EXPECT_EQ(r->code, kErrBadRequest);
  EXPECT_NE(r->error.find("malformed JSON"), std::string::npos) << r->error;

  // 200 KiB without a newline, then the end of that line: one too_large
  // error, and the same connection keeps working.
  ASSERT_TRUE(c.SendRaw(std::string(200 * 1024, 'A')).ok());
  r = c.ReadReply(5s);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->code, kErrTooLarge);
  EXPECT_NE(r->error.find("65536"), std::string::npos) << r->error;
  ASSERT_TRUE(c.SendRaw(std::string(1000, 'B') + "\n").ok());

  Reply unknown_vm = Call(c, "status", {{"name", "no-such-vm"}});
  EXPECT_FALSE(unknown_vm.ok);
  EXPECT_EQ(unknown_vm.code, kErrUnknownVm);
  EXPECT_NE(unknown_vm.error.find("no VM named 'no-such-vm'"), std::string::npos);

  Reply unknown_cmd = Call(c, "explode");
  EXPECT_FALSE(unknown_cmd.ok);
  EXPECT_EQ(unknown_cmd.code, kErrUnknownCommand);
  EXPECT_NE(unknown_cmd.error.find("unknown command 'explode'"), std::string::npos);

  Reply no_name = Call(c, "captures");
  EXPECT_EQ(no_name.code, kErrBadRequest);
  Reply bad_name = Call(c, "captures", {{"name", "../../etc"}});
  EXPECT_EQ(bad_name.code, kErrBadRequest);
  EXPECT_NE(bad_name.error.find("invalid VM name"), std::string::npos);

  ASSERT_TRUE(c.SendRaw("[1,2,3]\n\n   \n{\"id\":\"x\"}\n").ok());
  for (int i = 0; i < 2; ++i) {
    r = c.ReadReply(5s);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->code, kErrBadRequest);
    EXPECT_FALSE(r->id.has_value());
  }

  // Binary garbage with embedded NULs and invalid UTF-8.
  std::string garbage;
  for (int i = 0; i < 4096; ++i) {
    char ch = static_cast<char>((i * 37) & 0xff);
    garbage.push_back(ch == '\n' ? '\0' : ch);
  }
  ASSERT_TRUE(c.SendRaw(garbage + "\n").ok());
  r = c.ReadReply(5s);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->code, kErrBadRequest);

  Reply pong = Call(c, "ping");
  EXPECT_TRUE(pong.ok);
  ExpectPing(d);
  EXPECT_TRUE(d.Alive());
}

TEST(DaemonTest, FragmentedAndPipelinedRequestsAnsweredInOrder) {
  DaemonProcess d;
  d.Start();
  auto c = d.Client();
  std::string req = R"({"id":41,"cmd":"ping"})"
                    "\n";
  for (char ch : req) {
    ASSERT_TRUE(c.SendRaw(std::string_view(&ch, 1)).ok());
  }
  auto r = c.ReadReply(5s);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->id, 41);
  EXPECT_TRUE(r->ok);

  std::string batch;
  for (int i = 0; i < 10; ++i) {
    batch += i % 3 == 2 ? "{oops\n"
                        : R"({"id":)" + std::to_string(100 + i) +
                              R"(,"cmd":"ping"})"
                              "\n";
  }
  ASSERT_TRUE(c.SendRaw(batch).ok());
  for (int i = 0; i < 10; ++i) {
    r = c.ReadReply(5s);
    ASSERT_TRUE(r.ok());
    if (i % 3 == 2) {
      EXPECT_FALSE(r->id.has_value()) << i;
    } else {
      EXPECT_EQ(r->id, 100 + i);
    }
  }
}

TEST(DaemonTest, ListsCapturesOfVmsFoundInStateDir) {
  DaemonProcess d;
  CaptureStore store(d.state() / "vms/vm1/captures");
  auto p = store.Begin("panic", HostTime{1718187330123000000LL, 1});
  ASSERT_TRUE(p.ok());
  std::vector<std::byte> region(4096, std::byte{0x5a});
  ASSERT_TRUE((*p)->WriteFile("region.bin", region).ok());
  CaptureManifest m;
  m.vm = "vm1";
  m.trigger = "panic";
  m.cpus.push_back({0, 42, 3, 0, {}});
  ASSERT_TRUE((*p)->Commit(m).ok());
  // A capture left half-written by a crashed daemon is swept at start.
  fs::create_directories(store.dir() / ".tmp-20240101T000000.000Z-panic-abc");

  d.Start();
  EXPECT_FALSE(fs::exists(store.dir() / ".tmp-20240101T000000.000Z-panic-abc"));
  auto c = d.Client();
  Reply list = Call(c, "list");
  ASSERT_TRUE(list.ok);
  ASSERT_EQ(list.result["vms"].size(), 1u);
  EXPECT_EQ(list.result["vms"][0]["name"], "vm1");
  EXPECT_EQ(list.result["vms"][0]["state"], "offline");

  Reply status = Call(c, "status", {{"name", "vm1"}});
  ASSERT_TRUE(status.ok);
  EXPECT_EQ(status.result["kind"], "none");

  Reply caps = Call(c, "captures", {{"name", "vm1"}});
  ASSERT_TRUE(caps.ok) << caps.error;
  ASSERT_EQ(caps.result["captures"].size(), 1u);
  EXPECT_EQ(caps.result["captures"][0]["id"], "20240612T101530.123Z-panic");
  EXPECT_EQ(caps.result["captures"][0]["totals"]["events"], 42);

  Reply unknown = Call(c, "captures", {{"name", "vm2"}});
  EXPECT_EQ(unknown.code, kErrUnknownVm);
  EXPECT_NE(unknown.error.find("known: vm1"), std::string::npos) << unknown.error;
}

TEST(DaemonTest, Malicious_UnprivilegedPeerIsRefusedEvenIfSocketModeIsLoosened) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
  DaemonProcess d;
  d.Start();
  // Open the filesystem path to everyone so only SO_PEERCRED stands between
  // an unprivileged user and the daemon.
  ASSERT_EQ(::chmod(d.dir().c_str(), 0755), 0);
  ASSERT_EQ(::chmod(d.socket().parent_path().c_str(), 0755), 0);
  ASSERT_EQ(::chmod(d.socket().c_str(), 0666), 0);
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(pipefd[0]);
    gid_t nogroup = 65534;
    if (::setgroups(0, nullptr) != 0 || ::setgid(nogroup) != 0 || ::setuid(65534) != 0) _exit(10);
    auto c = ControlClient::Connect(d.socket(), 2s);
    std::string report;
    if (!c.ok()) {
      report = "connect failed: " + c.error().message;
    } else {
      auto r = c->Call("ping", json::object(), 5s);
      report = r.ok() ? (r->ok ? "ALLOWED" : r->code + ": " + r->error) : r.error().message;
    }
    ssize_t ignored = ::write(pipefd[1], report.data(), report.size());
    (void)ignored;
    _exit(0);
  }
  ::close(pipefd[1]);
  std::string report;
  char buf[512];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0) report.append(buf, static_cast<size_t>(n));
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child setup failed";
  EXPECT_NE(report.find(std::string(kErrDenied)), std::string::npos) << report;
  EXPECT_NE(report.find("uid 65534"), std::string::npos) << report;
  ExpectPing(d);
}

TEST(DaemonTest, ConnectionLimitRefusesExtraClientsClearly) {
  DaemonProcess d;
  d.config_text = "socket_group =\nmax_connections = 2\n";
  d.Start();
  auto a = d.Client();
  auto b = d.Client();
  EXPECT_TRUE(Call(a, "ping").ok);
  EXPECT_TRUE(Call(b, "ping").ok);
  auto third = d.Client();
  auto r = third.ReadReply(5s);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->code, kErrBusy);
  EXPECT_TRUE(third.WaitForClose(5s));
  // Closing one frees a slot.
  { ControlClient gone = std::move(a); }
  auto deadline = std::chrono::steady_clock::now() + 5s;
  bool served = false;
  while (!served && std::chrono::steady_clock::now() < deadline) {
    auto c = d.Client();
    auto reply = c.Call("ping", json::object(), 5s);
    served = reply.ok() && reply->ok;
    if (!served) std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(served);
}

TEST(DaemonTest, SecondDaemonOnSameSocketIsRefused) {
  DaemonProcess d;
  d.Start();
  std::string out;
  int rc = DaemonProcess::Run({(kBinDir / "hvtraced").string(), "--state-dir", d.state().string(),
                               "--socket", d.socket().string()},
                              &out, d.dir() / "second.log");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("another hvtraced already serves " + d.socket().string()), std::string::npos)
      << out;
  ExpectPing(d);
}

TEST(DaemonTest, StaleSocketIsReplacedButOtherFilesAreNot) {
  DaemonProcess d;
  fs::create_directories(d.socket().parent_path());
  // A socket file nobody listens on, as a crashed daemon leaves it.
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un addr {};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, d.socket().c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ::close(fd);
  d.Start();
  ExpectPing(d);
  EXPECT_EQ(d.Signal(SIGTERM, 5s), 0);

  std::ofstream(d.socket()) << "precious";
  std::string out;
  int rc = DaemonProcess::Run({(kBinDir / "hvtraced").string(), "--state-dir", d.state().string(),
                               "--socket", d.socket().string()},
                              &out, d.dir() / "third.log");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("is not a socket"), std::string::npos) << out;
}

TEST(DaemonTest, SigtermAndShutdownCommandStopCleanly) {
  {
    DaemonProcess d;
    d.Start();
    auto c = d.Client();  // An idle client must not hold the daemon up.
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(d.Signal(SIGTERM, 5s), 0) << d.Log();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
    EXPECT_FALSE(fs::exists(d.socket()));
    EXPECT_NE(d.Log().find("shutting down (signal"), std::string::npos) << d.Log();
  }
  {
    DaemonProcess d;
    d.Start();
    auto c = d.Client();
    Reply r = Call(c, "shutdown");
    EXPECT_TRUE(r.ok);
    EXPECT_EQ(r.result["stopping"], true);
    EXPECT_EQ(d.WaitExit(5s), 0) << d.Log();
    EXPECT_FALSE(fs::exists(d.socket()));
  }
}

TEST(DaemonTest, BadConfigIsRefusedWithFileAndLine) {
  DaemonProcess d;
  fs::path conf = d.dir() / "bad.conf";
  std::ofstream(conf) << "# ok\npanic_policy = maybe\n";
  std::string out;
  int rc = DaemonProcess::Run({(kBinDir / "hvtraced").string(), "--config", conf.string()}, &out,
                              d.dir() / "bad.log");
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find(conf.string() + ":2: panic_policy"), std::string::npos) << out;
}

TEST(DaemonTest, CliTalksToDaemon) {
  DaemonProcess d;
  CaptureStore store(d.state() / "vms/web1/captures");
  auto p = store.Begin("manual", HostTime{1718187330123000000LL, 1});
  ASSERT_TRUE(p.ok());
  CaptureManifest m;
  m.vm = "web1";
  m.trigger = "manual";
  ASSERT_TRUE((*p)->Commit(m).ok());
  d.Start();
  std::string hvtrace = (kBinDir / "hvtrace").string();
  std::string sock = d.socket().string();
  std::string out;
  fs::path log = d.dir() / "cli.log";

  EXPECT_EQ(DaemonProcess::Run({hvtrace, "ping", "--socket", sock}, &out, log), 0) << out;
  EXPECT_NE(out.find("hvtraced (pid"), std::string::npos) << out;

  EXPECT_EQ(DaemonProcess::Run({hvtrace, "list", "--socket", sock}, &out, log), 0) << out;
  EXPECT_NE(out.find("web1"), std::string::npos) << out;
  EXPECT_NE(out.find("offline"), std::string::npos) << out;

  EXPECT_EQ(DaemonProcess::Run({hvtrace, "captures", "web1", "--socket", sock}, &out, log), 0)
      << out;
  EXPECT_NE(out.find("20240612T101530.123Z-manual"), std::string::npos) << out;

  // Exit statuses follow the daemon's error codes: 4 for unknown_vm.
  EXPECT_EQ(DaemonProcess::Run({hvtrace, "status", "nope", "--socket", sock}, &out, log), 4);
  EXPECT_NE(out.find("no VM named 'nope'"), std::string::npos) << out;

  // HVTRACE_SOCKET is honoured when --socket is absent.
  ::setenv("HVTRACE_SOCKET", sock.c_str(), 1);
  EXPECT_EQ(DaemonProcess::Run({hvtrace, "status", "web1", "--json"}, &out, log), 0) << out;
  ::unsetenv("HVTRACE_SOCKET");
  EXPECT_EQ(json::parse(out)["name"], "web1");

  EXPECT_EQ(DaemonProcess::Run({hvtrace, "ping", "--socket", (d.dir() / "none.sock").string()},
                               &out, log),
            5);  // No daemon there.
  EXPECT_NE(out.find("hvtraced is not running"), std::string::npos) << out;

  EXPECT_EQ(DaemonProcess::Run({hvtrace, "daemon-shutdown", "--socket", sock}, &out, log), 0)
      << out;
  EXPECT_EQ(d.WaitExit(5s), 0);
}

// Runs |body| in a child process with uid/gid 65534 and the supplementary
// groups |groups| (numeric gids: no /etc/group entry is needed, the daemon
// reads SO_PEERGROUPS); returns what |body| returned.
std::string AsNobody(const std::vector<gid_t>& groups, const std::function<std::string()>& body) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) return "pipe failed";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipefd[0]);
    if (::setgroups(groups.size(), groups.data()) != 0 || ::setgid(65534) != 0 ||
        ::setuid(65534) != 0) {
      _exit(10);
    }
    std::string report = body();
    ssize_t ignored = ::write(pipefd[1], report.data(), report.size());
    (void)ignored;
    _exit(0);
  }
  ::close(pipefd[1]);
  std::string report;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0) report.append(buf, static_cast<size_t>(n));
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "child setup failed";
  return report;
}

// One line per command: "cmd ok" or "cmd CODE: error".
std::string TryCommands(const fs::path& socket, const std::vector<std::string>& cmds) {
  auto c = ControlClient::Connect(socket, 2s);
  if (!c.ok()) return "connect failed: " + c.error().message;
  std::string report;
  for (const std::string& cmd : cmds) {
    json args = cmd == "ping" || cmd == "list" || cmd == "version" || cmd == "shutdown"
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

TEST(DaemonRolesTest, Malicious_ObserverMayLookButNotChangeAnything) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
  DaemonProcess d;
  d.config_text = "socket_group = " + std::to_string(kObserverGid) +
                  "\nadmin_group = " + std::to_string(kAdminGid) + "\n";
  d.Start();
  ASSERT_EQ(::chmod(d.dir().c_str(), 0755), 0);
  const std::vector<std::string> looks = {"ping",     "version", "list",         "status",
                                          "captures", "stream",  "capture-files"};
  const std::vector<std::string> changes = {"boot",    "adopt", "attach",   "detach",
                                            "capture", "stop",  "shutdown", "setup"};
  std::vector<std::string> all = looks;
  all.insert(all.end(), changes.begin(), changes.end());
  const std::string report = AsNobody({kObserverGid}, [&] { return TryCommands(d.socket(), all); });
  for (const std::string& cmd : looks) {
    // Allowed: ok, or an error about the VM, never permission_denied.
    EXPECT_EQ(LineOf(report, cmd).find(std::string(kErrDenied)), std::string::npos) << report;
  }
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
  d.config_text = "socket_group = " + std::to_string(kObserverGid) +
                  "\nadmin_group = " + std::to_string(kAdminGid) + "\n";
  d.Start();
  ASSERT_EQ(::chmod(d.dir().c_str(), 0755), 0);
  // A stranger (neither group) is refused on connect even with the socket opened up.
  ASSERT_EQ(::chmod(d.socket().c_str(), 0666), 0);
  const std::string stranger = AsNobody({12345}, [&] { return TryCommands(d.socket(), {"ping"}); });
  EXPECT_NE(stranger.find(std::string(kErrDenied)), std::string::npos) << stranger;
  // An admin (admin group only, not in socket_group) gets past the role check:
  // capture and stop fail on the unknown VM, not on permission.
  const std::string admin = AsNobody({kAdminGid}, [&] {
    return TryCommands(d.socket(), {"list", "capture", "stop"});
  });
  EXPECT_EQ(LineOf(admin, "list"), "list ok") << admin;
  EXPECT_NE(LineOf(admin, "capture").find(std::string(kErrUnknownVm)), std::string::npos) << admin;
  EXPECT_NE(LineOf(admin, "stop").find(std::string(kErrUnknownVm)), std::string::npos) << admin;
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
  d.config_text = "socket_group = " + std::to_string(kObserverGid) +
                  "\nadmin_group = " + std::to_string(kAdminGid) + "\n";
  d.Start();
  ASSERT_EQ(::chmod(d.dir().c_str(), 0755), 0);

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
