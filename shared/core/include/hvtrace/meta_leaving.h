// The leaving handshake of the metadata channel (hvtrace/meta_channel.h),
// the one exchange in which the host answers the guest.
//
// A kernel the guest kexecs into may not recognise the boot range's layout
// (6.12's per-CPU meta against 6.15+'s global meta) and initialise it
// afresh, wiping the boot that is leaving. So when the guest is about to
// leave its kernel (kexec, reboot, poweroff: systemd stops the agent's unit,
// or init sends it SIGTERM), the agent sends kLeaving and waits, bounded, for
// the host's kAck; hvtraced copies the boot range in between (capture trigger
// "guest-leaving") and acks once the copy is durable. An agent whose wait
// runs out goes on regardless: a host must never hold up a guest's shutdown.
//
// Both payloads are exactly kLeavePayloadSize (16) bytes, little-endian, each
// with its own version so either can grow without a new frame version:
//
//   kLeaving (guest -> host)               kAck (host -> guest)
//   +0 u16 version   kLeaveVersion          +0 u16 version  kLeaveVersion
//   +2 u16 reason    LeaveReason            +2 u16 status   AckStatus
//   +4 u32 wait_ms   how long the agent     +4 u32 host_ms  the notice's
//                    waits (<= kMaxLeave-                   arrival to this
//                    WaitMs; informative)                   ack, on the host
//   +8 u64 nonce     the agent's, random    +8 u64 nonce    the notice's
//
// The nonce lets an agent tell its own ack from one an earlier agent of the
// same boot asked for. The host trusts nothing here: the values are checked
// (ParseLeaveNotice) and how often a guest may make the host capture is the
// capture service's rule (supervisor.h, Floods), not the guest's.
#ifndef HVTRACE_META_LEAVING_H_
#define HVTRACE_META_LEAVING_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "hvtrace/result.h"

namespace hvtrace::meta {

inline constexpr uint16_t kLeaveVersion = 1;
inline constexpr uint32_t kMaxLeaveWaitMs = 60000;

enum class LeaveReason : uint16_t {
  kStopSignal = 1,  // SIGTERM/SIGINT: the unit stopped, or init shutting down.
};

enum class AckStatus : uint16_t {
  kCopied = 0,     // The boot range copy is durable: the guest may go.
  kNotCopied = 1,  // Refused (budget, no range) or failed: nothing kept.
};

struct LeaveNotice {
  LeaveReason reason = LeaveReason::kStopSignal;
  uint32_t wait_ms = 0;
  uint64_t nonce = 0;
};

struct LeaveAck {
  AckStatus status = AckStatus::kCopied;
  uint32_t host_ms = 0;
  uint64_t nonce = 0;
};

std::string EncodeLeaveNotice(const LeaveNotice& notice);
std::string EncodeLeaveAck(const LeaveAck& ack);

// The payload of a kLeaving or kAck frame, or why it is not one this side
// knows (size, version, reason or status, wait).
Result<LeaveNotice> ParseLeaveNotice(std::string_view payload);
Result<LeaveAck> ParseLeaveAck(std::string_view payload);

std::string_view LeaveReasonName(LeaveReason reason);
std::string_view AckStatusName(AckStatus status);

}  // namespace hvtrace::meta

#endif  // HVTRACE_META_LEAVING_H_
