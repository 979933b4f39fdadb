// Payloads of the leaving handshake (hvtrace/meta_leaving.h). Plain bytes in,
// checked values out: the host parses what a hostile guest sent, the agent
// what a host sent, and neither trusts a field it did not check.
#include "hvtrace/meta_leaving.h"

#include "hvtrace/meta_channel.h"

namespace hvtrace::meta {
namespace {

void Put(std::string& out, uint64_t v, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t Get(std::string_view in, size_t at, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes; ++i)
    v |= uint64_t{static_cast<unsigned char>(in[at + i])} << (8 * i);
  return v;
}

// The 16-byte layout both payloads share: version, a u16, a u32, the nonce.
std::string Encode(uint16_t kind, uint32_t value, uint64_t nonce) {
  std::string out;
  out.reserve(kLeavePayloadSize);
  Put(out, kLeaveVersion, 2);
  Put(out, kind, 2);
  Put(out, value, 4);
  Put(out, nonce, 8);
  return out;
}

// Why |payload| is not a version-1 payload of |what|, or "".
std::string ShapeProblem(std::string_view payload, const char* what) {
  if (payload.size() != kLeavePayloadSize) {
    return std::string(what) + " payload of " + std::to_string(payload.size()) + " bytes; it has " +
           std::to_string(kLeavePayloadSize);
  }
  if (const uint64_t version = Get(payload, 0, 2); version != kLeaveVersion)
    return std::string(what) + " version " + std::to_string(version) + " unknown";
  return "";
}

}  // namespace

std::string EncodeLeaveNotice(const LeaveNotice& notice) {
  return Encode(static_cast<uint16_t>(notice.reason), notice.wait_ms, notice.nonce);
}

std::string EncodeLeaveAck(const LeaveAck& ack) {
  return Encode(static_cast<uint16_t>(ack.status), ack.host_ms, ack.nonce);
}

Result<LeaveNotice> ParseLeaveNotice(std::string_view payload) {
  if (std::string why = ShapeProblem(payload, "leaving notice"); !why.empty()) return Error{why};
  LeaveNotice n;
  const uint64_t reason = Get(payload, 2, 2);
  if (reason != static_cast<uint16_t>(LeaveReason::kStopSignal))
    return Error{"leaving notice: reason " + std::to_string(reason) + " unknown"};
  n.reason = static_cast<LeaveReason>(reason);
  n.wait_ms = static_cast<uint32_t>(Get(payload, 4, 4));
  if (n.wait_ms > kMaxLeaveWaitMs) {
    return Error{"leaving notice: wait of " + std::to_string(n.wait_ms) + " ms; the most is " +
                 std::to_string(kMaxLeaveWaitMs)};
  }
  n.nonce = Get(payload, 8, 8);
  return n;
}

Result<LeaveAck> ParseLeaveAck(std::string_view payload) {
  if (std::string why = ShapeProblem(payload, "leaving ack"); !why.empty()) return Error{why};
  LeaveAck a;
  const uint64_t status = Get(payload, 2, 2);
  if (status != static_cast<uint16_t>(AckStatus::kCopied) &&
      status != static_cast<uint16_t>(AckStatus::kNotCopied)) {
    return Error{"leaving ack: status " + std::to_string(status) + " unknown"};
  }
  a.status = static_cast<AckStatus>(status);
  a.host_ms = static_cast<uint32_t>(Get(payload, 4, 4));
  a.nonce = Get(payload, 8, 8);
  return a;
}

std::string_view LeaveReasonName(LeaveReason reason) {
  return reason == LeaveReason::kStopSignal ? "stop signal" : "?";
}

std::string_view AckStatusName(AckStatus status) {
  return status == AckStatus::kCopied ? "copied" : "not copied";
}

}  // namespace hvtrace::meta
