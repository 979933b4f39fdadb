// The agent's side of the metadata channel (guest-agent/src/meta_writer.h,
// meta_sender.h): port discovery without udev, a writer that never blocks,
// drops what a gone host would have got and starts every connection with the
// boot frame. A pty stands in for the virtio-serial port where a test needs
// the host to leave and come back on the same fd: like the port, the master
// reports POLLHUP while no slave is open and POLLOUT again once one is.
#include "meta_writer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <termios.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include "agent.h"
#include "boot_archive.h"
#include "meta_sender.h"

namespace hvtrace::agent {
namespace {

namespace fs = std::filesystem;

void Put(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

std::vector<std::byte> Frame(meta::MetaType type, uint32_t seq, const std::string& payload) {
  return meta::EncodeMetaFrame(type, meta::BootId{1, 2, 3}, seq, payload, false);
}

// Reads what |fd| has (non-blocking) into |decoder|; returns the frames.
std::vector<meta::MetaFrame> Drain(int fd, meta::MetaDecoder* decoder) {
  std::vector<meta::MetaFrame> out;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) {
    decoder->Feed(std::span(reinterpret_cast<const std::byte*>(buf), static_cast<size_t>(n)));
  }
  while (auto f = decoder->Next()) {
    EXPECT_TRUE(f->ok()) << f->error().message;
    if (f->ok()) out.push_back(std::move(**f));
  }
  return out;
}

class MetaWriterTest : public ::testing::Test {
 protected:
  void SetUp() override { std::signal(SIGPIPE, SIG_IGN); }
};

TEST_F(MetaWriterTest, FindsThePortByItsSysfsNameOrUdevLink) {
  const fs::path root =
      fs::temp_directory_path() / ("hvtrace-meta-port-" + std::to_string(getpid()));
  fs::remove_all(root);
  EXPECT_EQ(FindMetaPort(root / "sys", root / "dev"), "");  // No virtio-ports class at all.
  Put(root / "sys/vport0p0/name", "org.qemu.guest_agent.0\n");
  Put(root / "sys/vport1p1/name", "");
  EXPECT_EQ(FindMetaPort(root / "sys", root / "dev"), "");
  Put(root / "sys/vport1p2/name", "org.hvtrace.agent.0\n");
  EXPECT_EQ(FindMetaPort(root / "sys", root / "dev"), (root / "dev/vport1p2").string());
  Put(root / "dev/virtio-ports/org.hvtrace.agent.0", "");
  EXPECT_EQ(FindMetaPort(root / "sys", root / "dev"),
            (root / "dev/virtio-ports/org.hvtrace.agent.0").string());
  fs::remove_all(root);
}

TEST_F(MetaWriterTest, BootFirstThenOthersAndAGoneHostDropsTheQueue) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
  MetaWriter w;
  w.Adopt(sv[0]);
  EXPECT_FALSE(w.connected());
  // Nothing is queued for a host not seen yet.
  EXPECT_FALSE(w.Queue(meta::MetaType::kBoot, Frame(meta::MetaType::kBoot, 0, "boot")));
  ASSERT_TRUE(w.Service());
  EXPECT_TRUE(w.connected());
  EXPECT_TRUE(w.needs_boot());
  // Comms before the boot frame would reach a host that cannot use them.
  EXPECT_FALSE(w.Queue(meta::MetaType::kComms, Frame(meta::MetaType::kComms, 1, "1 init\n")));
  ASSERT_TRUE(w.Queue(meta::MetaType::kBoot, Frame(meta::MetaType::kBoot, 0, "boot")));
  ASSERT_TRUE(w.Queue(meta::MetaType::kComms, Frame(meta::MetaType::kComms, 1, "1 init\n")));
  EXPECT_FALSE(w.needs_boot());
  EXPECT_EQ(w.PollEvents(), POLLIN | POLLOUT);
  ASSERT_TRUE(w.Service());
  EXPECT_EQ(w.queued_bytes(), 0u);
  EXPECT_EQ(w.PollEvents(), POLLIN) << "a hello may come";
  meta::MetaDecoder host;
  auto frames = Drain(sv[1], &host);
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0].type, meta::MetaType::kBoot);
  EXPECT_EQ(frames[1].payload, "1 init\n");

  // Fill the socket until the writer must queue, then the host leaves: the
  // queue is dropped, the writer does not block, and nothing more is queued.
  const std::string big(1 << 20, 'c');
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(w.Queue(meta::MetaType::kComms, Frame(meta::MetaType::kComms, 2 + i, big)));
    ASSERT_TRUE(w.Service());
  }
  EXPECT_GT(w.queued_bytes(), 0u);
  close(sv[1]);
  ASSERT_TRUE(w.Service());
  EXPECT_FALSE(w.connected());
  EXPECT_EQ(w.queued_bytes(), 0u);
  EXPECT_FALSE(w.Queue(meta::MetaType::kClock, Frame(meta::MetaType::kClock, 9, "{}")));
  w.Close();
}

TEST_F(MetaWriterTest, ANewerBootFrameLetsTheOnePartlyWrittenFinish) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
  MetaWriter w;
  w.Adopt(sv[0]);
  ASSERT_TRUE(w.Service());
  const std::string big(4 << 20, 'b');  // More than the socket takes at once.
  ASSERT_TRUE(w.Queue(meta::MetaType::kBoot, Frame(meta::MetaType::kBoot, 0, big)));
  ASSERT_TRUE(w.Service());
  ASSERT_GT(w.queued_bytes(), 0u);
  ASSERT_TRUE(w.Queue(meta::MetaType::kComms, Frame(meta::MetaType::kComms, 1, "1 init\n")));
  // The set of events changed: a newer archive replaces what waits, but the
  // frame being written is finished, so the host loses nothing to a cut.
  ASSERT_TRUE(w.Queue(meta::MetaType::kBoot, Frame(meta::MetaType::kBoot, 0, "newer")));
  meta::MetaDecoder host;
  std::vector<meta::MetaFrame> frames;
  for (int i = 0; i < 1000 && w.queued_bytes() != 0; ++i) {
    ASSERT_TRUE(w.Service());
    for (auto& f : Drain(sv[1], &host)) frames.push_back(std::move(f));
  }
  for (auto& f : Drain(sv[1], &host)) frames.push_back(std::move(f));
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0].payload.size(), big.size());
  EXPECT_EQ(frames[1].type, meta::MetaType::kBoot);
  EXPECT_EQ(frames[1].payload, "newer");
  EXPECT_EQ(host.skipped_bytes(), 0u);
  w.Close();
  close(sv[1]);
}

TEST_F(MetaWriterTest, OverTheCapCommsAndClockAreDroppedNeverBoot) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
  MetaWriter w;
  w.Adopt(sv[0]);
  ASSERT_TRUE(w.Service());
  ASSERT_TRUE(w.Queue(meta::MetaType::kBoot, Frame(meta::MetaType::kBoot, 0, "boot")));
  const std::string mib(1 << 20, 'x');
  size_t accepted = 0;
  // The host reads nothing: the socket fills, then the queue up to its cap.
  for (int i = 0; i < 40; ++i) {
    accepted += w.Queue(meta::MetaType::kComms, Frame(meta::MetaType::kComms, 1, mib)) ? 1 : 0;
    ASSERT_TRUE(w.Service());
  }
  EXPECT_LT(accepted, 40u);
  EXPECT_LE(w.queued_bytes(), MetaWriter::kMaxQueued);
  EXPECT_GT(w.frames_dropped(), 0u);
  close(sv[1]);
  w.Close();
}

// A pty master as the agent's port, its slave as the host.
struct FakePort {
  int master = -1;
  std::string slave_path;
  int slave = -1;
  FakePort() {
    master = posix_openpt(O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
    grantpt(master);
    unlockpt(master);
    slave_path = ptsname(master);
  }
  void Connect() {
    slave = open(slave_path.c_str(), O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
    termios t;
    tcgetattr(slave, &t);
    cfmakeraw(&t);
    tcsetattr(slave, TCSANOW, &t);
  }
  void Disconnect() {
    close(slave);
    slave = -1;
  }
};

// A host gone and back before the guest's kernel noticed (no hangup on the
// port) says hello: the writer starts the connection over. A connection's
// own hello, read before anything was written, and other frames from the
// host do not.
TEST_F(MetaWriterTest, AHelloAfterWritingStartsTheConnectionOver) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
  auto host_writes = [&](const std::vector<std::byte>& frame) {
    ASSERT_EQ(write(sv[1], frame.data(), frame.size()), static_cast<ssize_t>(frame.size()));
  };
  MetaWriter w;
  w.Adopt(sv[0]);
  host_writes(meta::EncodeHello("test"));
  ASSERT_TRUE(w.Service());
  EXPECT_FALSE(w.ReadFromHost()) << "this connection's own hello";
  EXPECT_EQ(w.hellos(), 1u);
  ASSERT_TRUE(w.needs_boot());
  ASSERT_TRUE(w.Queue(meta::MetaType::kBoot, Frame(meta::MetaType::kBoot, 0, "boot")));
  ASSERT_TRUE(w.Queue(meta::MetaType::kComms, Frame(meta::MetaType::kComms, 1, "1 init\n")));
  ASSERT_TRUE(w.Service());
  meta::MetaDecoder host;
  EXPECT_EQ(Drain(sv[1], &host).size(), 2u);

  // Garbage and an ack no one waits for change nothing.
  const std::string noise = "noise";
  ASSERT_EQ(write(sv[1], noise.data(), noise.size()), 5);
  host_writes(meta::EncodeMetaFrame(meta::MetaType::kAck, meta::BootId{1, 2, 3}, 0,
                                    std::string(meta::kLeavePayloadSize, '\0'), false));
  EXPECT_FALSE(w.ReadFromHost());
  EXPECT_FALSE(w.needs_boot());

  // A new host, no hangup seen: what was queued for the old one goes, and
  // the next frame is the boot frame.
  ASSERT_TRUE(w.Queue(meta::MetaType::kClock, Frame(meta::MetaType::kClock, 2, "{}")));
  host_writes(meta::EncodeHello("test"));
  EXPECT_TRUE(w.ReadFromHost());
  EXPECT_EQ(w.hellos(), 2u);
  EXPECT_EQ(w.connections(), 2u);
  EXPECT_TRUE(w.connected());
  ASSERT_TRUE(w.needs_boot());
  EXPECT_EQ(w.queued_bytes(), 0u);
  ASSERT_TRUE(w.Queue(meta::MetaType::kBoot, Frame(meta::MetaType::kBoot, 0, "boot")));
  ASSERT_TRUE(w.Service());
  const auto frames = Drain(sv[1], &host);
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].type, meta::MetaType::kBoot);
  close(sv[1]);
  w.Close();
}

TEST_F(MetaWriterTest, AHostThatComesBackGetsTheBootFrameAgain) {
  FakePort port;
  ASSERT_GE(port.master, 0);
  port.Connect();
  MetaWriter w;
  w.Adopt(port.master);
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(w.Service());
    ASSERT_TRUE(w.needs_boot()) << "round " << round;
    ASSERT_TRUE(w.Queue(meta::MetaType::kBoot, Frame(meta::MetaType::kBoot, 0, "boot")));
    ASSERT_TRUE(w.Service());
    meta::MetaDecoder host;
    auto frames = Drain(port.slave, &host);
    ASSERT_EQ(frames.size(), 1u) << "round " << round;
    EXPECT_EQ(frames[0].type, meta::MetaType::kBoot);
    port.Disconnect();
    ASSERT_TRUE(w.Service());
    EXPECT_FALSE(w.connected()) << "round " << round;
    port.Connect();
  }
  EXPECT_EQ(w.connections(), 2u);
  port.Disconnect();
}

TEST_F(MetaWriterTest, SenderSendsBootCommsAndClockFromAFakeGuest) {
  const fs::path root =
      fs::temp_directory_path() / ("hvtrace-meta-send-" + std::to_string(getpid()));
  fs::remove_all(root);
  const fs::path fx = fs::path(HVTRACE_FIXTURES_DIR) / "boot_map";
  fs::create_directories(root / "tracing");
  fs::create_directories(root / "proc");
  fs::copy(fx / "formats", root / "tracing/events", fs::copy_options::recursive);
  fs::copy(fx / "header_page", root / "tracing/events/header_page");
  fs::copy(fx / "header_event", root / "tracing/events/header_event");
  Put(root / "tracing/printk_formats", "");
  Put(root / "tracing/saved_cmdlines", "1 systemd\n");
  Put(root / "proc/version", "Linux version 6.12.0-test\n");
  Put(root / "proc/sys/kernel/random/boot_id", "0b1e5a1d-2c3d-4e5f-8a9b-0c1d2e3f4a5b\n");
  fs::copy(fx / "kallsyms", root / "proc/kallsyms");

  FakePort port;
  // The agent opens the port by path: here the pty's slave, and the test
  // reads the master (one connection; the master cannot come back). Raw
  // (termios belong to the tty, not the fd) before the agent opens it.
  port.Connect();
  int host = port.master;
  MetaOptions opt;
  opt.port = port.slave_path;
  opt.archive.tracefs = root / "tracing";
  opt.archive.proc = root / "proc";
  opt.archive.kallsyms = root / "proc/kallsyms";
  opt.archive.notes = root / "no-notes";
  std::vector<std::string> log;
  MetaSender sender(opt, [&](const std::string& m) { log.push_back(m); });
  meta::MetaDecoder decoder;
  std::vector<meta::MetaFrame> frames;
  uint64_t now = 1;
  for (int i = 0; i < 2000 && frames.size() < 3; ++i, now += 50000000) {
    sender.Tick(now, 100);
    for (auto& f : Drain(host, &decoder)) frames.push_back(std::move(f));
    if (i == 20) Put(root / "tracing/saved_cmdlines", "1 systemd\n42 hvtrace-agent\n");
    usleep(2000);
  }
  ASSERT_GE(frames.size(), 3u) << (log.empty() ? "" : log.back());
  EXPECT_EQ(frames[0].type, meta::MetaType::kBoot);
  EXPECT_EQ(frames[0].sequence, 0u);
  EXPECT_EQ(meta::BootIdString(frames[0].boot_id), "0b1e5a1d-2c3d-4e5f-8a9b-0c1d2e3f4a5b");
  bool comms = false, clock = false;
  for (size_t i = 1; i < frames.size(); ++i) {
    EXPECT_EQ(frames[i].sequence, i);
    comms |= frames[i].type == meta::MetaType::kComms;
    clock |= frames[i].type == meta::MetaType::kClock &&
             frames[i].payload.find("\"tsc\": ") != std::string::npos;
  }
  EXPECT_TRUE(comms);
  EXPECT_TRUE(clock);
  // A module with events is loaded: the archive is built again and sent on
  // the same connection as a kBoot that starts the sequence again.
  Put(root / "tracing/events/hvt_alpha/alpha_seq/format",
      "name: alpha_seq\nID: 1496\nformat:\n"
      "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
      "\tfield:u32 seq;\toffset:8;\tsize:4;\tsigned:0;\n\n"
      "print fmt: \"seq=%u\", REC->seq\n");
  EXPECT_EQ(frames[0].payload.find("hvt_alpha/alpha_seq"), std::string::npos);
  sender.EventsChanged();
  std::optional<meta::MetaFrame> newer;
  for (int i = 0; i < 2000 && !newer; ++i, now += 50000000) {
    sender.Tick(now, 100);
    for (auto& f : Drain(host, &decoder)) {
      if (f.type == meta::MetaType::kBoot) newer = std::move(f);
    }
    usleep(2000);
  }
  ASSERT_TRUE(newer.has_value()) << (log.empty() ? "" : log.back());
  EXPECT_EQ(newer->sequence, 0u);
  EXPECT_NE(newer->payload.find("hvt_alpha/alpha_seq/format:name: alpha_seq"), std::string::npos);
  EXPECT_NE(newer->payload.find("hvt_alpha/alpha_seq 1496 "), std::string::npos);
  // The loop watches the port while a host is there, with no events when
  // nothing is queued: the host leaving still wakes it (POLLHUP), at once.
  ASSERT_TRUE(sender.Watched());
  close(host);
  pollfd p{sender.fd(), sender.PollEvents(), 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1);
  EXPECT_TRUE(p.revents & POLLHUP);
  sender.Tick(now, 100);
  EXPECT_FALSE(sender.Watched());  // Gone: not polled (POLLHUP would spin the loop).
  port.Disconnect();
  fs::remove_all(root);
}

TEST_F(MetaWriterTest, NoMetaAndAbsentPortsCostNothing) {
  MetaOptions opt;
  opt.sys_class = "/nonexistent/virtio-ports";
  opt.dev = "/nonexistent/dev";
  std::vector<std::string> log;
  MetaSender sender(opt, [&](const std::string& m) { log.push_back(m); });
  sender.Tick(1, 100);
  EXPECT_EQ(sender.fd(), -1);
  EXPECT_EQ(sender.archive(), nullptr);  // Not even built without a port.
  EXPECT_TRUE(log.empty());
  opt.enabled = false;
  opt.port = "/dev/null";
  MetaSender off(opt, [&](const std::string& m) { log.push_back(m); });
  off.Tick(1, 100);
  EXPECT_EQ(off.fd(), -1);
}

}  // namespace
}  // namespace hvtrace::agent
