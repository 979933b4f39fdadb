// Starts the real hvtraced binary on a temporary state dir and socket and
// talks to it the way clients (and hostile clients) do.
#include "hostd/daemon/daemon_process.h"

namespace hvtrace::hostd {
namespace {

using namespace testing_daemon;  // NOLINT: the tests' own helpers.
namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

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
  const std::string report = AsNobody({}, [&] {
    auto c = ControlClient::Connect(d.socket(), 2s);
    if (!c.ok()) return "connect failed: " + c.error().message;
    auto r = c->Call("ping", json::object(), 5s);
    return r.ok() ? (r->ok ? std::string("ALLOWED") : r->code + ": " + r->error)
                  : r.error().message;
  });
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
}  // namespace
}  // namespace hvtrace::hostd
