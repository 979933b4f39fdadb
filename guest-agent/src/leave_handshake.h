// The agent's half of the leaving handshake (hvtrace/meta_leaving.h): when
// the agent is stopped (SIGTERM from systemd stopping its unit for a kexec,
// reboot or poweroff, or from init in the busybox guests), it tells the host
// over the metadata port and waits for the host's kAck, so the host can copy
// the boot range before the next kernel may initialise it afresh.
//
// Everything is bounded by one deadline: finishing a frame cut mid-write,
// writing the notice, and waiting for the ack. A host that is absent, gone
// or silent costs at most that wait; the agent then exits as before and
// says so in its log. Bytes the port delivers that are not this notice's ack
// (an ack an earlier agent of this boot asked for, garbage) are skipped.
#ifndef HVTRACE_AGENT_LEAVE_HANDSHAKE_H_
#define HVTRACE_AGENT_LEAVE_HANDSHAKE_H_

#include <cstdint>
#include <string>

#include "hvtrace/meta_channel.h"
#include "hvtrace/meta_leaving.h"
#include "meta_writer.h"

namespace hvtrace::agent {

inline constexpr uint32_t kDefaultLeaveWaitMs = 2000;

struct LeaveOutcome {
  enum class Kind {
    kAcked,     // The host answered (|ack| says whether it copied).
    kNoHost,    // No host on the port, or it left while we waited.
    kTimedOut,  // Sent; no answer within the wait.
  };
  Kind kind = Kind::kNoHost;
  meta::LeaveAck ack;
  uint64_t waited_ms = 0;  // From the start of the handshake to its end.
};

// Sends a kLeaving frame for |boot_id| (frame sequence |sequence|) on
// |writer|'s port and waits for the matching kAck, |wait_ms| in all.
LeaveOutcome AnnounceLeaving(MetaWriter& writer, const meta::BootId& boot_id, uint32_t sequence,
                             uint32_t wait_ms);

// One line for the agent's log.
std::string DescribeLeaveOutcome(const LeaveOutcome& outcome, uint32_t wait_ms);

}  // namespace hvtrace::agent

#endif  // HVTRACE_AGENT_LEAVE_HANDSHAKE_H_
