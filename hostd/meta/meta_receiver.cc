#include "meta_receiver.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>

#include "host_time.h"
#include "hvtrace/meta_leaving.h"
#include "sha256.h"

namespace hvtrace::hostd {
namespace {

namespace asio = boost::asio;
using nlohmann::json;
using Local = asio::local::stream_protocol;

// A unix socket path fits sockaddr_un (107 bytes) as given, or through an
// O_PATH descriptor of its directory (/proc/self/fd/N/NAME): paths through
// /proc/PID/root of a libvirt domain's QEMU are often longer.
class ShortSocketPath {
 public:
  static Result<ShortSocketPath> For(const std::string& path) {
    ShortSocketPath p;
    if (path.size() < sizeof(sockaddr_un{}.sun_path)) {
      p.path_ = path;
      return p;
    }
    const std::filesystem::path full(path);
    p.dir_fd_ = ::open(full.parent_path().c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (p.dir_fd_ < 0) {
      return Error{"socket directory " + full.parent_path().string() + ": " + std::strerror(errno)};
    }
    p.path_ = "/proc/self/fd/" + std::to_string(p.dir_fd_) + "/" + full.filename().string();
    if (p.path_.size() >= sizeof(sockaddr_un{}.sun_path)) {
      return Error{"socket name too long: " + path};
    }
    return p;
  }
  ShortSocketPath() = default;
  ShortSocketPath(ShortSocketPath&& o) noexcept : path_(std::move(o.path_)), dir_fd_(o.dir_fd_) {
    o.dir_fd_ = -1;
  }
  ShortSocketPath& operator=(ShortSocketPath&&) = delete;
  ~ShortSocketPath() {
    if (dir_fd_ >= 0) ::close(dir_fd_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int dir_fd_ = -1;
};

// "" when |fd|'s peer is |pid| (or |pid| is -1), else why not.
std::string PeerMismatch(int fd, pid_t pid) {
  if (pid < 0) return "";
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return std::string("SO_PEERCRED: ") + std::strerror(errno);
  }
  if (cred.pid == pid) return "";
  return "the channel socket is held by pid " + std::to_string(cred.pid) + ", not QEMU's pid " +
         std::to_string(pid) + ": not connecting";
}

constexpr size_t kReadChunk = 64u << 10;
// Frames read but not handled yet; past this the receiver stops reading.
constexpr uint64_t kMaxQueuedBytes = 256u << 20;
constexpr size_t kNotesBytes = 4096;
// Frames waiting for the socket (a hello, acks); past this (a guest that
// never reads its port) the oldest go: an ack is one guest's answer, and it
// stops waiting.
constexpr size_t kMaxQueuedToGuest = 16;

class Receiver : public MetaReceiver {
 public:
  Receiver(asio::any_io_executor io, asio::any_io_executor work, MetaReceiverOptions options)
      : io_(asio::make_strand(io)),
        work_(asio::make_strand(work)),
        options_(std::move(options)),
        store_(options_.meta_dir, options_.keep_boots),
        socket_(io_),
        timer_(io_),
        backoff_(options_.min_backoff) {}

  void Start() override {
    asio::post(io_, [self = Self()] { self->Connect(); });
  }

  void Stop() override {
    asio::post(io_, [self = Self()] {
      self->stopped_ = true;
      boost::system::error_code ec;
      self->socket_.close(ec);
      self->timer_.cancel();
      self->SetState("stopped");
    });
  }

  json Status() const override {
    std::lock_guard lock(mu_);
    json j = status_;
    j["socket"] = socket_path_;
    j["state"] = state_;
    return j;
  }

  bool Drain(std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    return drained_.wait_for(lock, timeout, [&] { return queued_ == 0; });
  }

 private:
  std::shared_ptr<Receiver> Self() {
    return std::static_pointer_cast<Receiver>(shared_from_this());
  }

  void Log(LogLevel level, const std::string& message) const {
    if (options_.log) options_.log(level, "VM " + options_.vm + ": meta: " + message);
  }

  void SetState(std::string state) {
    std::lock_guard lock(mu_);
    state_ = std::move(state);
  }

  void Count(const char* key, uint64_t n = 1) {
    std::lock_guard lock(mu_);
    status_[key] = status_.value(key, uint64_t{0}) + n;
  }

  // io strand from here to Dispatch.
  void Connect() {
    if (stopped_) return;
    const MetaSocketTarget target = options_.socket ? options_.socket() : MetaSocketTarget{};
    {
      std::lock_guard lock(mu_);
      socket_path_ = target.path;
    }
    if (target.path.empty()) {
      Retry("no socket yet (the VM is not running)");
      return;
    }
    Result<ShortSocketPath> endpoint = ShortSocketPath::For(target.path);
    if (!endpoint.ok()) {
      Retry(endpoint.error().message);
      return;
    }
    SetState("connecting");
    socket_ = Local::socket(io_);
    const Local::endpoint where(endpoint->path());
    // The directory descriptor (a long path) must outlive the connect.
    auto held = std::make_shared<ShortSocketPath>(std::move(*endpoint));
    socket_.async_connect(where, [self = Self(), held,
                                  peer_pid = target.peer_pid](const boost::system::error_code& ec) {
      if (self->stopped_) return;
      if (ec) {
        self->Retry("connect: " + ec.message());
        return;
      }
      if (std::string why = PeerMismatch(self->socket_.native_handle(), peer_pid); !why.empty()) {
        self->Log(LogLevel::kWarning, why);
        self->Retry(why);
        return;
      }
      self->backoff_ = self->options_.min_backoff;
      self->decoder_ = meta::MetaDecoder();
      self->SetState("connected");
      self->Count("connects");
      // First on each connection: the agent may not have seen the last one
      // go (meta_channel.h, kHello), and this tells it to start over.
      self->SendToGuest(meta::EncodeHello("hvtraced"));
      self->Read();
    });
  }

  void Retry(const std::string& why) {
    boost::system::error_code ignored;
    socket_.close(ignored);
    to_guest_.clear();  // For the guest of the old connection only.
    ++connection_;
    {
      std::lock_guard lock(mu_);
      state_ = "waiting";
      status_["last_disconnect"] = why;
    }
    timer_.expires_after(backoff_);
    backoff_ = std::min(backoff_ * 2, options_.max_backoff);
    timer_.async_wait([self = Self()](const boost::system::error_code& ec) {
      if (!ec) self->Connect();
    });
  }

  void Read() {
    if (stopped_) return;
    {
      std::lock_guard lock(mu_);
      if (queued_ > kMaxQueuedBytes) {
        // The pool is behind: read again once it caught up a little.
        timer_.expires_after(std::chrono::milliseconds(50));
        timer_.async_wait([self = Self()](const boost::system::error_code& ec) {
          if (!ec) self->Read();
        });
        return;
      }
    }
    socket_.async_read_some(
        asio::buffer(buffer_), [self = Self()](const boost::system::error_code& ec, size_t n) {
          if (self->stopped_) return;
          if (n > 0) {
            self->Count("bytes", n);
            self->decoder_.Feed(std::span(self->buffer_.data(), n));
            self->TakeFrames();
          }
          if (ec) {
            // A frame cut here costs that frame only: the next connection
            // starts a new decoder.
            self->backoff_ = self->options_.min_backoff;
            self->Retry(ec == asio::error::eof ? "closed by QEMU" : "read: " + ec.message());
            return;
          }
          self->Read();
        });
  }

  void TakeFrames() {
    while (std::optional<Result<meta::MetaFrame>> next = decoder_.Next()) {
      if (!next->ok()) {
        Count("frame_errors");
        Log(LogLevel::kWarning, "bad frame: " + next->error().message);
        std::lock_guard lock(mu_);
        status_["last_frame_error"] = next->error().message;
        continue;
      }
      Count("frames");
      if ((*next)->type == meta::MetaType::kLeaving) HandleLeaving(**next);
      Dispatch(std::move(**next));  // For the sequence check.
    }
  }

  void Dispatch(meta::MetaFrame frame) {
    const uint64_t bytes = frame.payload.size() + meta::kMetaHeaderSize;
    {
      std::lock_guard lock(mu_);
      queued_ += bytes;
    }
    asio::post(work_, [self = Self(), frame = std::move(frame), bytes]() mutable {
      self->Handle(frame);
      std::lock_guard lock(self->mu_);
      self->queued_ -= bytes;
      if (self->queued_ == 0) self->drained_.notify_all();
    });
  }

  // io strand. A guest about to leave its kernel: the VM's capture starts
  // now (or, when one for an earlier notice runs, this one waits for it).
  void HandleLeaving(const meta::MetaFrame& frame) {
    const std::string boot_id = meta::BootIdString(frame.boot_id);
    Result<meta::LeaveNotice> notice = meta::ParseLeaveNotice(frame.payload);
    if (!notice.ok()) {
      Count("leaving_refused");
      Log(LogLevel::kWarning, "refused: boot " + boot_id + ": " + notice.error().message);
      return;
    }
    Count("leaving_notices");
    const LeaveWaiter waiter{frame.boot_id, notice->nonce, std::chrono::steady_clock::now()};
    if (!leave_waiters_.empty()) {
      Count("leaving_coalesced");
      if (leave_waiters_.size() >= kMaxLeaveWaiters)
        leave_waiters_.erase(leave_waiters_.begin() + 1);
      leave_waiters_.push_back(waiter);
      return;
    }
    leave_waiters_.push_back(waiter);
    Log(LogLevel::kNotice, "boot " + boot_id + " is leaving its kernel (" +
                               std::string(meta::LeaveReasonName(notice->reason)) +
                               ", waits up to " + std::to_string(notice->wait_ms) +
                               " ms): copying the boot range");
    if (!options_.leaving) {
      AnswerLeaving(false);
      return;
    }
    options_.leaving([self = Self()](bool copied) {
      asio::post(self->io_, [self, copied] { self->AnswerLeaving(copied); });
    });
  }

  // io strand: every notice waiting gets the capture's answer.
  void AnswerLeaving(bool copied) {
    const auto now = std::chrono::steady_clock::now();
    for (const LeaveWaiter& w : leave_waiters_) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - w.arrived);
      meta::LeaveAck ack{copied ? meta::AckStatus::kCopied : meta::AckStatus::kNotCopied,
                         static_cast<uint32_t>(std::min<int64_t>(ms.count(), UINT32_MAX)), w.nonce};
      Log(LogLevel::kInfo, "boot " + meta::BootIdString(w.boot_id) + ": leaving acknowledged (" +
                               std::string(meta::AckStatusName(ack.status)) + ") after " +
                               std::to_string(ack.host_ms) + " ms");
      SendToGuest(meta::EncodeMetaFrame(meta::MetaType::kAck, w.boot_id, ack_sequence_++,
                                        meta::EncodeLeaveAck(ack), false));
    }
    Count(copied ? "leaving_acked_copied" : "leaving_acked_not_copied", leave_waiters_.size());
    leave_waiters_.clear();
  }

  // io strand: one write at a time, the rest queued (bounded). The front is
  // the one being written: never dropped while its write runs.
  void SendToGuest(std::vector<std::byte> frame) {
    if (stopped_ || !socket_.is_open()) return;
    if (to_guest_.size() >= kMaxQueuedToGuest) {
      to_guest_.erase(to_guest_.begin() + 1);
      Count("acks_dropped");
    }
    to_guest_.push_back(std::move(frame));
    if (to_guest_.size() == 1) WriteToGuest();
  }

  void WriteToGuest() {
    asio::async_write(
        socket_, asio::buffer(to_guest_.front()),
        [self = Self(), connection = connection_](const boost::system::error_code& ec, size_t) {
          // A write of an earlier connection (Retry emptied the
          // queue): the queue now holds this one's frames.
          if (connection != self->connection_) return;
          if (ec) {
            // The read side notices a closed socket and reconnects.
            self->to_guest_.clear();
            return;
          }
          self->to_guest_.pop_front();
          if (!self->to_guest_.empty()) self->WriteToGuest();
        });
  }

  // work strand.
  void Handle(const meta::MetaFrame& frame) {
    const std::string boot_id = meta::BootIdString(frame.boot_id);
    // A kBoot with sequence 0 starts the sequence again (a new connection,
    // or a newer archive on this one).
    const bool restart = frame.type == meta::MetaType::kBoot && frame.sequence == 0;
    if (auto it = sequence_.find(boot_id);
        !restart && it != sequence_.end() && frame.sequence != it->second + 1) {
      Count("sequence_gaps");
    }
    sequence_[boot_id] = frame.sequence;
    switch (frame.type) {
      case meta::MetaType::kBoot:
        HandleBoot(frame, boot_id);
        return;
      case meta::MetaType::kLeaving:  // Answered on the io strand (HandleLeaving).
      case meta::MetaType::kAck:      // Never to the host: its decoder refuses them.
      case meta::MetaType::kHello:
        return;
      case meta::MetaType::kComms:
      case meta::MetaType::kClock: {
        const bool comms = frame.type == meta::MetaType::kComms;
        ::hvtrace::Status s = comms ? store_.StoreComms(boot_id, frame.payload)
                                    : store_.StoreClock(boot_id, frame.payload);
        if (!s.ok()) {
          Count("dropped");
          Log(LogLevel::kWarning, s.error().message);
          return;
        }
        Count(comms ? "comms_updates" : "clock_updates");
        return;
      }
    }
  }

  void HandleBoot(const meta::MetaFrame& frame, const std::string& boot_id) {
    Count("boots_received");
    const std::string key = Sha256Hex(
        std::span(reinterpret_cast<const std::byte*>(frame.payload.data()), frame.payload.size()));
    if (store_.Has(boot_id, key)) {
      Count("boots_resent");  // The agent resends on every (re)connect.
      return;
    }
    Result<MetaBoot> boot = ValidateMetaBoot(frame.boot_id, frame.payload);
    Result<json> verified =
        boot.ok() ? VerifyBuildId(*boot, options_.read_guest_memory) : Result<json>(boot.error());
    if (!verified.ok()) {
      Count("boots_refused");
      const std::string why = "refused: boot " + boot_id + ": " + verified.error().message;
      Log(LogLevel::kWarning, why);
      std::lock_guard lock(mu_);
      status_["last_refusal"] = why;
      return;
    }
    (*verified)["fingerprints"] = boot->fingerprints_checked;
    // A newer bundle for a boot already stored (the guest's set of events
    // changed): it replaces the boot's bundle, with the same checks.
    const bool update = store_.HasBoot(boot_id);
    ::hvtrace::Status s = store_.StoreBoot(*boot, *verified, HostTime::Now().realtime_ns);
    if (!s.ok()) {
      Count("store_errors");
      Log(LogLevel::kErr, "cannot store boot " + boot_id + ": " + s.error().message);
      return;
    }
    Count(update ? "boots_updated" : "boots_accepted");
    Log(LogLevel::kInfo, "boot " + boot_id + " (" + boot->release + ", build id " + boot->build_id +
                             ", " + std::to_string(boot->bundle.events.size()) + " formats) " +
                             (update ? "updated" : "stored") + ", build id " +
                             verified->value("build_id", std::string()));
    std::lock_guard lock(mu_);
    status_["last_boot"] = {{"boot_id", boot_id},         {"release", boot->release},
                            {"build_id", boot->build_id}, {"formats", boot->bundle.events.size()},
                            {"updated", update},          {"verified", *verified}};
  }

  asio::strand<asio::any_io_executor> io_;
  asio::strand<asio::any_io_executor> work_;
  const MetaReceiverOptions options_;
  MetaStore store_;

  // io strand.
  Local::socket socket_;
  asio::steady_timer timer_;
  std::chrono::milliseconds backoff_;
  meta::MetaDecoder decoder_;
  std::array<std::byte, kReadChunk> buffer_{};
  std::atomic<bool> stopped_{false};
  struct LeaveWaiter {
    meta::BootId boot_id;
    uint64_t nonce;
    std::chrono::steady_clock::time_point arrived;
  };
  std::vector<LeaveWaiter> leave_waiters_;  // Non-empty: a leaving capture runs.
  std::deque<std::vector<std::byte>> to_guest_;
  uint32_t ack_sequence_ = 0;
  uint64_t connection_ = 0;  // +1 per Retry: tells an old write's completion apart.

  // work strand.
  std::map<std::string, uint32_t> sequence_;

  mutable std::mutex mu_;
  std::condition_variable drained_;
  uint64_t queued_ = 0;
  std::string state_ = "new";
  std::string socket_path_;
  json status_ = json::object();
};

}  // namespace

std::shared_ptr<MetaReceiver> MetaReceiver::Create(asio::any_io_executor io,
                                                   asio::any_io_executor work,
                                                   MetaReceiverOptions options) {
  return std::make_shared<Receiver>(std::move(io), std::move(work), std::move(options));
}

Result<json> VerifyBuildId(
    const MetaBoot& boot,
    const std::function<Result<std::vector<std::byte>>(uint64_t, size_t)>& read) {
  if (!read) return json{{"build_id", "unverified"}, {"why", "no way to read guest memory"}};
  Result<uint64_t> notes = FindKallsym(boot.bundle.kallsyms, "__start_notes");
  if (!notes.ok()) {
    return json{{"build_id", "unverified"}, {"why", "kallsyms: " + notes.error().message}};
  }
  Result<std::vector<std::byte>> bytes = read(*notes, kNotesBytes);
  if (!bytes.ok()) {
    return json{{"build_id", "unverified"},
                {"why", "reading guest memory: " + bytes.error().message}};
  }
  Result<std::string> found = FindGnuBuildId(*bytes);
  if (!found.ok()) {
    // Memory that holds no build-id note at __start_notes: the kallsyms do
    // not describe this boot's kernel.
    return Error{"guest memory at __start_notes holds no build id: " + found.error().message};
  }
  if (*found != boot.build_id) {
    return Error{"build id " + boot.build_id + " is not the running kernel's (" + *found + ")"};
  }
  return json{{"build_id", "verified"}, {"from", "guest memory at __start_notes"}};
}

}  // namespace hvtrace::hostd
