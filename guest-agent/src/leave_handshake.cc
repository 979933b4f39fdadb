#include "leave_handshake.h"

#include <poll.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <cerrno>

#include "clock_ns.h"

namespace hvtrace::agent {
namespace {

uint64_t NowMs() { return MonotonicNs() / 1000000; }

// Random, so an ack an earlier agent of this boot asked for is not ours.
uint64_t Nonce() {
  uint64_t n = 0;
  if (getrandom(&n, sizeof n, GRND_NONBLOCK) != sizeof n) {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    n = (static_cast<uint64_t>(ts.tv_nsec) << 20) ^ static_cast<uint64_t>(ts.tv_sec) ^
        (static_cast<uint64_t>(getpid()) << 44);
  }
  return n;
}

// Reads the port until the ack for |nonce| comes, the host leaves or
// |deadline_ms| passes.
LeaveOutcome AwaitAck(int fd, const meta::BootId& boot_id, uint64_t nonce, uint64_t deadline_ms) {
  LeaveOutcome out;
  meta::MetaDecoder decoder(meta::MetaDirection::kToGuest);
  std::array<std::byte, 4096> buffer;
  for (uint64_t now = NowMs(); now < deadline_ms; now = NowMs()) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(deadline_ms - now)) < 0 && errno != EINTR) break;
    if (p.revents & POLLIN) {
      const ssize_t n = read(fd, buffer.data(), buffer.size());
      if (n > 0) decoder.Feed(std::span(buffer.data(), static_cast<size_t>(n)));
      if (n == 0) {
        out.kind = LeaveOutcome::Kind::kNoHost;
        return out;
      }
    } else if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) {
      out.kind = LeaveOutcome::Kind::kNoHost;
      return out;
    }
    while (std::optional<Result<meta::MetaFrame>> frame = decoder.Next()) {
      if (!frame->ok() || (*frame)->type != meta::MetaType::kAck || (*frame)->boot_id != boot_id) {
        continue;
      }
      Result<meta::LeaveAck> ack = meta::ParseLeaveAck((*frame)->payload);
      if (!ack.ok() || ack->nonce != nonce) continue;
      out.kind = LeaveOutcome::Kind::kAcked;
      out.ack = *ack;
      return out;
    }
  }
  out.kind = LeaveOutcome::Kind::kTimedOut;
  return out;
}

}  // namespace

LeaveOutcome AnnounceLeaving(MetaWriter& writer, const meta::BootId& boot_id, uint32_t sequence,
                             uint32_t wait_ms) {
  const uint64_t start = NowMs();
  const uint64_t deadline = start + wait_ms;
  meta::LeaveNotice notice{meta::LeaveReason::kStopSignal, wait_ms, Nonce()};
  LeaveOutcome out;
  if (writer.SendNow(meta::MetaType::kLeaving,
                     meta::EncodeMetaFrame(meta::MetaType::kLeaving, boot_id, sequence,
                                           meta::EncodeLeaveNotice(notice), false),
                     static_cast<int>(wait_ms))) {
    out = AwaitAck(writer.fd(), boot_id, notice.nonce, deadline);
  } else {
    out.kind = writer.connected() ? LeaveOutcome::Kind::kTimedOut : LeaveOutcome::Kind::kNoHost;
  }
  out.waited_ms = NowMs() - start;
  return out;
}

std::string DescribeLeaveOutcome(const LeaveOutcome& outcome, uint32_t wait_ms) {
  const std::string waited = std::to_string(outcome.waited_ms) + " ms";
  switch (outcome.kind) {
    case LeaveOutcome::Kind::kAcked:
      return "leaving: the host acknowledged (" +
             std::string(meta::AckStatusName(outcome.ack.status)) + ") after " + waited +
             " (host: " + std::to_string(outcome.ack.host_ms) + " ms)" +
             (outcome.ack.status == meta::AckStatus::kCopied
                  ? std::string()
                  : "; this boot's trace may be lost if the next kernel resets the range");
    case LeaveOutcome::Kind::kNoHost:
      return "leaving: no host on the metadata channel; going on without a copy (" + waited + ")";
    case LeaveOutcome::Kind::kTimedOut:
      break;
  }
  return "leaving: no acknowledgement from the host within " + std::to_string(wait_ms) +
         " ms; going on regardless";
}

}  // namespace hvtrace::agent
