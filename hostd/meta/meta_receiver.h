// The host end of one VM's metadata channel (hvtrace/meta_channel.h):
// connects as a client to the unix socket QEMU listens on for the VM's
// org.hvtrace.agent.0 port (a chardev hvtraced gave a VM it boots, or a
// libvirt <channel>), decodes frames, and keeps what passes the checks in the
// VM's MetaStore (meta_store.h).
//
// Socket I/O runs on the daemon's io_context and never blocks it. Frames are
// handled in arrival order on a strand over the worker pool: a kBoot bundle
// (inflate, tar, ~1500 formats parsed and fingerprinted) takes a while, and a
// kComms that follows it must find its boot stored. While that work is behind
// by more than a cap the receiver stops reading, so a flooding guest costs
// bounded memory. The connection is retried with backoff for as long as the
// receiver runs: QEMU not up yet, restarted, or the guest rebooting (a new
// boot sends a new kBoot).
//
// It writes a kHello first on each connection (the agent then knows a host
// came, though it may have seen none go), and a kAck to a guest's kLeaving
// (hvtrace/meta_leaving.h), handled on the socket's strand at once, never queued
// behind a bundle, since the agent waits for it (bounded) before it lets its
// kernel go. One notice at a time makes the VM's supervisor capture; notices
// that come while it runs wait for that capture's answer (at most
// kMaxLeaveWaiters of them, the oldest dropped), so a guest that repeats
// itself costs one capture and a few bytes.
#ifndef HVTRACE_HOSTD_META_RECEIVER_H_
#define HVTRACE_HOSTD_META_RECEIVER_H_

#include <sys/types.h>

#include <boost/asio/any_io_executor.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon_log.h"
#include "hvtrace/result.h"
#include "meta_store.h"

namespace hvtrace::hostd {

// Where a VM's metadata channel listens: |path| as this host sees it, and
// the pid that must hold the listening socket (SO_PEERCRED; -1: not checked).
// The socket lives in a directory QEMU's user can write, so a QEMU a guest
// took over could put another socket there for the daemon to connect to:
// the peer check makes sure the bytes come from that VM's QEMU.
struct MetaSocketTarget {
  std::string path;
  pid_t peer_pid = -1;
};

struct MetaReceiverOptions {
  std::string vm;  // For messages.
  // The chardev's unix socket, asked at each (re)connect ("": not known
  // yet, try again later; VmBackend::meta_socket).
  std::function<MetaSocketTarget()> socket;
  std::filesystem::path meta_dir;  // The VM's MetaStore.
  size_t keep_boots = kMetaBootsKept;
  std::chrono::milliseconds min_backoff{200};
  std::chrono::milliseconds max_backoff{5000};
  // Reads |size| bytes of the guest's memory at kernel virtual address
  // |addr|, blocking (called on the pool), to check a bundle's build id
  // against the kernel's notes. Empty, or failing: the bundle is kept with
  // its build id "unverified".
  std::function<Result<std::vector<std::byte>>(uint64_t addr, size_t size)> read_guest_memory;
  // Where refusals and problems are logged (empty: nowhere).
  std::function<void(LogLevel, const std::string&)> log;
  // The guest is about to leave its kernel (a valid kLeaving): captures the
  // boot range and calls |ack| exactly once, from any thread, with whether
  // the copy is durable (VmSupervisor::OnGuestLeaving). Empty: the notice
  // is answered "not copied" at once.
  std::function<void(std::function<void(bool copied)> ack)> leaving;
};

// Notices answered by one capture (see above).
inline constexpr size_t kMaxLeaveWaiters = 4;

class MetaReceiver : public std::enable_shared_from_this<MetaReceiver> {
 public:
  // |io| runs the socket, |work| the frame handling.
  static std::shared_ptr<MetaReceiver> Create(boost::asio::any_io_executor io,
                                              boost::asio::any_io_executor work,
                                              MetaReceiverOptions options);
  virtual ~MetaReceiver() = default;

  virtual void Start() = 0;
  // Closes the connection; queued frames are still handled. Any thread.
  virtual void Stop() = 0;
  // For `status`: connected, boots received/accepted/refused, the last
  // refusal. Any thread, cheap.
  virtual nlohmann::json Status() const = 0;
  // Waits (bounded) until every frame read so far is handled (tests).
  virtual bool Drain(std::chrono::milliseconds timeout) = 0;
};

// Checks |boot|'s build id against the kernel's own notes in guest memory
// (__start_notes from its kallsyms, read with |read|): {"build_id":
// "verified"} or {"build_id": "unverified", "why": …}; an error when the
// memory holds another build id (the bundle lies, or its kallsyms are not
// this boot's).
Result<nlohmann::json> VerifyBuildId(
    const MetaBoot& boot,
    const std::function<Result<std::vector<std::byte>>(uint64_t, size_t)>& read);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_META_RECEIVER_H_
