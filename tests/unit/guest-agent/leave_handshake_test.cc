// The agent's half of the leaving handshake (guest-agent/src/leave_handshake.h)
// against a socketpair playing the host: the ack that carries the notice's
// nonce ends the wait, anything else on the port is skipped, and a host that
// is silent or absent costs the agent its bounded wait at most.
#include "leave_handshake.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace hvtrace::agent {
namespace {

const meta::BootId kBoot{9, 8, 7, 6};

// Plays the host: reads until a kLeaving arrives, returns it.
std::optional<std::pair<meta::MetaFrame, meta::LeaveNotice>> ReadNotice(int fd) {
  meta::MetaDecoder decoder;
  char buf[4096];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) return std::nullopt;
    decoder.Feed(std::span(reinterpret_cast<const std::byte*>(buf), static_cast<size_t>(n)));
    while (auto f = decoder.Next()) {
      if (!f->ok() || (*f)->type != meta::MetaType::kLeaving) continue;
      Result<meta::LeaveNotice> notice = meta::ParseLeaveNotice((*f)->payload);
      if (notice.ok()) return std::pair{std::move(**f), *notice};
    }
  }
  return std::nullopt;
}

void Write(int fd, const std::vector<std::byte>& bytes) {
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
}

std::vector<std::byte> Ack(const meta::BootId& id, uint64_t nonce, meta::AckStatus status) {
  return meta::EncodeMetaFrame(meta::MetaType::kAck, id, 0,
                               meta::EncodeLeaveAck({status, 17, nonce}), false);
}

struct Port {
  int host = -1;
  MetaWriter writer;
  Port() {
    std::signal(SIGPIPE, SIG_IGN);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) return;
    writer.Adopt(sv[0]);
    host = sv[1];
  }
  ~Port() {
    if (host >= 0) close(host);
  }
};

TEST(LeaveHandshakeTest, TheAckWithTheNoticesNonceEndsTheWaitOthersAreSkipped) {
  Port port;
  ASSERT_GE(port.host, 0);
  std::optional<meta::LeaveNotice> seen;
  std::thread host([&] {
    auto got = ReadNotice(port.host);
    if (!got) return;
    seen = got->second;
    EXPECT_EQ(got->first.boot_id, kBoot);
    EXPECT_EQ(got->first.sequence, 5u);
    // What an agent must not take for its answer: garbage, a boot frame, an
    // ack for another boot, an ack an earlier agent asked for.
    const std::string junk = "HVTM junk";
    Write(port.host,
          std::vector<std::byte>(reinterpret_cast<const std::byte*>(junk.data()),
                                 reinterpret_cast<const std::byte*>(junk.data()) + junk.size()));
    Write(port.host, meta::EncodeMetaFrame(meta::MetaType::kBoot, kBoot, 0, "archive", true));
    Write(port.host, Ack(meta::BootId{1}, got->second.nonce, meta::AckStatus::kNotCopied));
    Write(port.host, Ack(kBoot, got->second.nonce + 1, meta::AckStatus::kNotCopied));
    Write(port.host, Ack(kBoot, got->second.nonce, meta::AckStatus::kCopied));
  });
  const LeaveOutcome out = AnnounceLeaving(port.writer, kBoot, 5, 5000);
  host.join();
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->wait_ms, 5000u);
  ASSERT_EQ(out.kind, LeaveOutcome::Kind::kAcked) << DescribeLeaveOutcome(out, 5000);
  EXPECT_EQ(out.ack.status, meta::AckStatus::kCopied);
  EXPECT_EQ(out.ack.host_ms, 17u);
  EXPECT_LT(out.waited_ms, 5000u);
  EXPECT_NE(DescribeLeaveOutcome(out, 5000).find("acknowledged (copied)"), std::string::npos);
}

TEST(LeaveHandshakeTest, Malicious_AHostThatNeverAnswersCostsTheWaitAndNoMore) {
  Port port;
  ASSERT_GE(port.host, 0);
  // The host reads the notice but says nothing, and keeps the port open.
  std::thread host([&] { ReadNotice(port.host); });
  const auto start = std::chrono::steady_clock::now();
  const LeaveOutcome out = AnnounceLeaving(port.writer, kBoot, 0, 300);
  const auto took = std::chrono::steady_clock::now() - start;
  host.join();
  EXPECT_EQ(out.kind, LeaveOutcome::Kind::kTimedOut);
  EXPECT_GE(took, std::chrono::milliseconds(290));
  EXPECT_LT(took, std::chrono::milliseconds(1300));
  EXPECT_NE(DescribeLeaveOutcome(out, 300).find("going on regardless"), std::string::npos);
}

TEST(LeaveHandshakeTest, NoHostCostsNothing) {
  Port port;
  ASSERT_GE(port.host, 0);
  close(port.host);  // The host's end is gone, like a port no host opened.
  port.host = -1;
  const auto start = std::chrono::steady_clock::now();
  const LeaveOutcome out = AnnounceLeaving(port.writer, kBoot, 0, 2000);
  EXPECT_EQ(out.kind, LeaveOutcome::Kind::kNoHost) << DescribeLeaveOutcome(out, 2000);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
}

}  // namespace
}  // namespace hvtrace::agent
