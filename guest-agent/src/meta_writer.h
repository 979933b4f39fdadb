// The guest end of the metadata channel (hvtrace/meta_channel.h): finding
// the virtio-serial port and writing frames to it without ever blocking.
//
// A virtio-serial port stays open across host connections: while no host is
// connected poll() reports POLLHUP (and a write would wait, or fail with
// EAGAIN on a non-blocking fd); once one connects, POLLOUT. Frames queued
// for a host that went away are dropped (a frame cut there costs the host
// that frame only: its decoder resynchronises), and each connection starts
// with the boot archive again, so a host that reconnected (a daemon restart)
// gets everything. A host gone and back before the guest's kernel handled
// the first of QEMU's two control messages shows no hangup at all; its
// kHello (meta_channel.h) says so instead.
#ifndef HVTRACE_AGENT_META_WRITER_H_
#define HVTRACE_AGENT_META_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "hvtrace/meta_channel.h"

namespace hvtrace::agent {

// The character device of the port named |name| (meta::kMetaPortName):
// |dev_dir|/virtio-ports/NAME (udev's symlink) if it exists, else the
// /dev/vportNpM whose |sys_class_dir|/vportNpM/name is NAME (guests without
// udev, only devtmpfs). "" when there is none.
std::string FindMetaPort(const std::string& sys_class_dir, const std::string& dev_dir,
                         const std::string& name = meta::kMetaPortName);

class MetaWriter {
 public:
  // Most bytes queued. Over it, comms and clock frames are dropped; the boot
  // archive never is (it starts a connection, on an empty queue).
  static constexpr size_t kMaxQueued = 16u << 20;

  MetaWriter() = default;
  ~MetaWriter() { Close(); }
  MetaWriter(const MetaWriter&) = delete;
  MetaWriter& operator=(const MetaWriter&) = delete;

  // Takes |fd| (non-blocking). The host counts as absent until the fd shows
  // writable without a hangup.
  void Adopt(int fd);
  void Close();
  int fd() const { return fd_; }
  // A host is connected and has not got this connection's boot frame yet:
  // the caller queues it (Queue(kBoot, ...)) before anything else.
  bool needs_boot() const { return connected_ && !boot_queued_; }
  bool connected() const { return connected_; }
  bool boot_queued() const { return boot_queued_; }

  // Queues a frame for the current connection; false when it was dropped
  // (no host, no boot frame yet for a non-boot frame, or over kMaxQueued).
  // A boot frame empties the queue first.
  bool Queue(meta::MetaType type, std::vector<std::byte> frame);
  // The poll events to wait for while connected(): POLLIN (a hello), and
  // POLLOUT when bytes are queued. POLLHUP comes anyway.
  short PollEvents() const;
  // Reads what the host sent (never blocks). A kHello after this connection
  // wrote anything means a new host the port never reported: the queue is
  // dropped and the connection starts over (needs_boot()); returns true
  // then. A hello before the first write is this connection's own. Other
  // frames (an ack no one waits for) and garbage are skipped. Not called
  // during the leaving handshake, which reads the port itself.
  bool ReadFromHost();
  // Checks the host's presence (poll, no wait) and writes what it can.
  // Returns false when the port itself failed (the caller closes it and
  // looks for it again).
  bool Service();

  // At exit: finishes the frame being written, if one was cut, waiting at
  // most |timeout_ms|, so the host's decoder does not lose the next
  // agent's first frame to the rest of a cut one. Drops the others.
  void FinishPartial(int timeout_ms);
  // At exit too: sends |frame| now, after the frame being written (if one was
  // cut) and instead of the others, waiting at most |timeout_ms| in all.
  // True once it was written whole; false without a host or when time ran
  // out. The leaving notice (leave_handshake.h) goes this way: no boot frame
  // need precede it.
  bool SendNow(meta::MetaType type, std::vector<std::byte> frame, int timeout_ms);

  size_t queued_bytes() const { return queued_bytes_; }
  uint64_t connections() const { return connections_; }
  uint64_t frames_sent() const { return frames_sent_; }
  uint64_t frames_dropped() const { return frames_dropped_; }
  uint64_t hellos() const { return hellos_; }

 private:
  struct Pending {
    meta::MetaType type;
    std::vector<std::byte> bytes;
    size_t written = 0;
  };
  void Connected();  // A new connection: needs_boot() until the caller queues kBoot.
  void Disconnected();
  // Drops every queued frame but one partly written.
  void KeepOnlyPartial();
  // Services the port until the queue is empty, the host left or
  // |timeout_ms| passed; true when the queue emptied.
  bool Drain(int timeout_ms);

  int fd_ = -1;
  bool connected_ = false;
  bool boot_queued_ = false;
  bool wrote_on_connection_ = false;
  meta::MetaDecoder from_host_{meta::MetaDirection::kToGuest};
  std::deque<Pending> queue_;
  size_t queued_bytes_ = 0;
  uint64_t connections_ = 0;
  uint64_t frames_sent_ = 0;
  uint64_t frames_dropped_ = 0;
  uint64_t hellos_ = 0;
};

}  // namespace hvtrace::agent

#endif  // HVTRACE_AGENT_META_WRITER_H_
