// What the agent sends over the metadata channel (hvtrace/meta_channel.h),
// driven from the agent's one poll loop: finds and opens the port (again
// after it went away or when a "virtio-ports" uevent says one came), and per
// host connection sends the boot archive first (kBoot, built by
// BootArchiveSource when the port opens), then saved_cmdlines whenever it
// changed (kComms, at most once per pump interval) and a clock-sync sample
// every 10 s (kClock). When the set of events changes (EventsChanged: a
// module with events loaded), the archive is built again and sent as a new
// kBoot on the same connection; the host replaces the boot's bundle.
// Sequence numbers start at 0 with each kBoot.
//
// The archive is built only once a port is there: guests without the channel
// (the busybox test guests) pay one opendir per tick and nothing else.
#ifndef HVTRACE_AGENT_META_SENDER_H_
#define HVTRACE_AGENT_META_SENDER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "boot_archive.h"
#include "leave_handshake.h"
#include "meta_writer.h"
#include "uevent.h"

namespace hvtrace::agent {

struct ClockSample {
  uint64_t mono = 0, boot = 0, real = 0, tsc = 0;
};
// CLOCK_MONOTONIC with the TSC read around it (the midpoint of the tightest
// of three brackets), CLOCK_BOOTTIME and CLOCK_REALTIME; false when the TSC
// went backwards each time.
bool TakeClockSample(ClockSample* out);

struct MetaOptions {
  bool enabled = true;
  std::string port;  // Fixed port path (tests); "" to find it (FindMetaPort).
  std::string sys_class = "/sys/class/virtio-ports";
  std::string dev = "/dev";
  BootArchivePaths archive;
  bool verbose = false;
  // How long the agent, when stopped, waits for the host to copy the boot
  // range (leave_handshake.h); 0: it does not announce its leaving.
  uint32_t leave_wait_ms = kDefaultLeaveWaitMs;
};

class MetaSender {
 public:
  using LogFn = std::function<void(const std::string&)>;
  MetaSender(MetaOptions options, LogFn log);

  int fd() const { return writer_.fd(); }
  short PollEvents() const { return writer_.PollEvents(); }
  // Whether the loop polls fd() (with PollEvents(), maybe none): while a host
  // is connected, so that its leaving (POLLHUP, reported whatever the events)
  // or a new host's hello (POLLIN) wakes the loop at once: a host gone and
  // back between two ticks (a fast daemon restart) must get its boot frame.
  // Not while none is: POLLHUP would then wake it all the time.
  bool Watched() const { return writer_.fd() >= 0 && writer_.connected(); }
  // How soon the loop should come back (ms): soon while the archive is being
  // built for a waiting host, else the caller's own timeout.
  int TimeoutMs(int otherwise) const;
  void OnUevent(const Uevent& event);
  // The set of events changed (event_set_watch.h): build the archive again
  // and send it once built. Before the port opened this does nothing: the
  // first archive is built then.
  void EventsChanged();
  // Opens the port if absent, notices hosts coming and going, queues what is
  // due and writes what the port takes. Never blocks.
  void Tick(uint64_t now_ns, uint32_t pump_interval_ms);

  // At exit: lets the frame being written finish (MetaWriter::FinishPartial).
  void Finish() { writer_.FinishPartial(2000); }
  // At exit after a stop signal: tells the host this kernel is about to go
  // and waits (bounded) for its copy of the boot range (leave_handshake.h);
  // logs the outcome. Nothing without a port or with leave_wait_ms 0.
  void AnnounceLeaving();

  const MetaWriter& writer() const { return writer_; }
  const BootArchive* archive() const { return archive_.Ready(); }

 private:
  void TryOpen();
  void QueueDue(uint64_t now_ns, uint32_t pump_interval_ms);
  void Queue(meta::MetaType type, const std::string& payload);
  void Verbose(const std::string& message) const {
    if (options_.verbose) log_(message);
  }

  MetaOptions options_;
  LogFn log_;
  MetaWriter writer_;
  BootArchiveSource archive_;
  uint32_t logged_revision_ = 0;  // The archive revision whose note was logged.
  uint32_t sent_revision_ = 0;    // The archive revision this connection got.
  std::string open_error_;        // Last reason the port did not open (logged once).
  std::string port_path_;
  uint32_t sequence_ = 0;
  uint64_t next_comms_ns_ = 0;
  uint64_t next_clock_ns_ = 0;
  std::optional<std::string> comms_sent_;  // What this connection got last.
  bool was_connected_ = false;
};

}  // namespace hvtrace::agent

#endif  // HVTRACE_AGENT_META_SENDER_H_
