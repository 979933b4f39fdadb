#include "meta_writer.h"

#include <dirent.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <span>

#include "text_areas.h"

namespace hvtrace::agent {

std::string FindMetaPort(const std::string& sys_class_dir, const std::string& dev_dir,
                         const std::string& name) {
  const std::string link = dev_dir + "/virtio-ports/" + name;
  if (access(link.c_str(), F_OK) == 0) return link;
  DIR* d = opendir(sys_class_dir.c_str());
  if (d == nullptr) return {};
  std::string found;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    int error = 0;
    std::string port = ReadWholeFile(sys_class_dir + "/" + e->d_name + "/name", &error);
    while (!port.empty() && port.back() == '\n') port.pop_back();
    if (port == name) {
      found = dev_dir + "/" + e->d_name;
      break;
    }
  }
  closedir(d);
  return found;
}

void MetaWriter::Adopt(int fd) {
  Close();
  fd_ = fd;
  from_host_ = meta::MetaDecoder(meta::MetaDirection::kToGuest);
}

void MetaWriter::Close() {
  Disconnected();
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

void MetaWriter::Connected() {
  connected_ = true;
  ++connections_;
}

void MetaWriter::Disconnected() {
  connected_ = false;
  boot_queued_ = false;
  wrote_on_connection_ = false;
  queue_.clear();
  queued_bytes_ = 0;
}

bool MetaWriter::Queue(meta::MetaType type, std::vector<std::byte> frame) {
  const bool boot = type == meta::MetaType::kBoot;
  if (!connected_ || (!boot && !boot_queued_) ||
      (!boot && queued_bytes_ + frame.size() > kMaxQueued)) {
    ++frames_dropped_;
    return false;
  }
  if (boot) {
    // A newer archive replaces whatever waits, but a frame already partly
    // written is finished first: cut, it would cost the host the next frame.
    const bool partial = !queue_.empty() && queue_.front().written != 0;
    queue_.erase(queue_.begin() + (partial ? 1 : 0), queue_.end());
    queued_bytes_ = partial ? queue_.front().bytes.size() - queue_.front().written : 0;
    boot_queued_ = true;
  }
  queued_bytes_ += frame.size();
  queue_.push_back({type, std::move(frame), 0});
  return true;
}

short MetaWriter::PollEvents() const {
  if (!connected_) return 0;
  return static_cast<short>(POLLIN | (queue_.empty() ? 0 : POLLOUT));
}

bool MetaWriter::ReadFromHost() {
  if (fd_ < 0) return false;
  std::byte buf[4096];
  for (;;) {
    const ssize_t n = read(fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    // 0: no host (a virtio port's EOF); EAGAIN: nothing yet; EIO: a pty
    // without its other end. Service() tells those apart.
    if (n <= 0) break;
    from_host_.Feed(std::span(buf, static_cast<size_t>(n)));
  }
  bool restarted = false;
  while (std::optional<Result<meta::MetaFrame>> f = from_host_.Next()) {
    if (!f->ok() || (*f)->type != meta::MetaType::kHello) continue;
    ++hellos_;
    if (connected_ && wrote_on_connection_) {
      Disconnected();
      Connected();
      restarted = true;
    }
  }
  return restarted;
}

bool MetaWriter::Service() {
  if (fd_ < 0) return true;
  pollfd p{fd_, POLLOUT, 0};
  if (poll(&p, 1, 0) < 0) return errno == EINTR;
  if (p.revents & POLLNVAL) return false;
  if (p.revents & (POLLHUP | POLLERR)) {
    Disconnected();  // No host (or it left): what was queued is for nobody.
    return true;
  }
  if (!(p.revents & POLLOUT)) return true;
  if (!connected_) Connected();  // A host (again): it gets the boot frame first.
  while (!queue_.empty()) {
    Pending& f = queue_.front();
    const ssize_t n = write(fd_, f.bytes.data() + f.written, f.bytes.size() - f.written);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return true;
      if (errno == EPIPE || errno == ECONNRESET) {
        Disconnected();
        return true;
      }
      return false;  // ENODEV (port unplugged) and the like.
    }
    f.written += static_cast<size_t>(n);
    queued_bytes_ -= static_cast<size_t>(n);
    wrote_on_connection_ = true;
    if (f.written == f.bytes.size()) {
      queue_.pop_front();
      ++frames_sent_;
    }
  }
  return true;
}

void MetaWriter::KeepOnlyPartial() {
  const bool partial = !queue_.empty() && queue_.front().written != 0;
  queue_.resize(partial ? 1 : 0);
  queued_bytes_ = partial ? queue_.front().bytes.size() - queue_.front().written : 0;
}

bool MetaWriter::Drain(int timeout_ms) {
  timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const long waited =
        (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
    if (queue_.empty()) return true;
    if (!connected_ || waited >= timeout_ms) return false;
    pollfd p{fd_, POLLOUT, 0};
    poll(&p, 1, static_cast<int>(timeout_ms - waited));
    if (!Service()) return false;
  }
}

void MetaWriter::FinishPartial(int timeout_ms) {
  if (fd_ < 0 || !connected_ || queue_.empty() || queue_.front().written == 0) return;
  KeepOnlyPartial();
  Drain(timeout_ms);
}

bool MetaWriter::SendNow(meta::MetaType type, std::vector<std::byte> frame, int timeout_ms) {
  if (fd_ < 0 || !Service() || !connected_) return false;  // Service: is a host there now?
  KeepOnlyPartial();
  queued_bytes_ += frame.size();
  queue_.push_back({type, std::move(frame), 0});
  return Drain(timeout_ms);
}

}  // namespace hvtrace::agent
