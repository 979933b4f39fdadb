#include "libvirt_event_loop.h"

#include <fcntl.h>
#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace hvtrace::hostd {
namespace {

namespace asio = boost::asio;

class Loop {
 public:
  static Loop& Get() {
    // Never destroyed: libvirt may call into the loop until the process ends.
    static Loop* loop = new Loop();
    return *loop;
  }

  Status Install(asio::any_io_executor executor) {
    std::lock_guard lock(install_mu_);
    if (strand_) {
      if (executor == base_executor_) return {};
      return Error{
          "libvirt event loop: already installed on another executor (libvirt allows one "
          "event implementation per process)"};
    }
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd_ < 0) {
      return Error{std::string("libvirt event loop: epoll_create1: ") + std::strerror(errno)};
    }
    base_executor_ = executor;
    strand_ = std::make_unique<asio::strand<asio::any_io_executor>>(asio::make_strand(executor));
    epoll_desc_ = std::make_unique<asio::posix::stream_descriptor>(*strand_, epoll_fd_);
    // libvirt prints every error to stderr unless told otherwise; hvtrace
    // reports them itself, with context.
    virSetErrorFunc(nullptr, [](void*, virErrorPtr) {});
    virEventRegisterImpl(&AddHandleThunk, &UpdateHandleThunk, &RemoveHandleThunk, &AddTimeoutThunk,
                         &UpdateTimeoutThunk, &RemoveTimeoutThunk);
    installed_ = true;
    return {};
  }

  Status EnsureInstalled() {
    {
      std::lock_guard lock(install_mu_);
      if (strand_) return {};
      if (!private_io_) {
        private_io_ = std::make_unique<asio::io_context>();
        private_guard_ =
            std::make_unique<asio::executor_work_guard<asio::io_context::executor_type>>(
                private_io_->get_executor());
        std::thread([io = private_io_.get()] { io->run(); }).detach();
      }
    }
    return Install(private_io_->get_executor());
  }

  bool installed() const { return installed_; }
  asio::any_io_executor executor() {
    std::lock_guard lock(install_mu_);
    return base_executor_;
  }

  bool OnLoopThread() {
    std::lock_guard lock(mu_);
    return loop_threads_.count(std::this_thread::get_id()) != 0;
  }

  LibvirtEventLoop::Stats GetStats() {
    std::lock_guard lock(mu_);
    LibvirtEventLoop::Stats stats = stats_;
    stats.handles = static_cast<int>(handles_.size());
    stats.timeouts = static_cast<int>(timeouts_.size());
    return stats;
  }

 private:
  struct Handle {
    int fd = -1;      // libvirt's fd, passed back to its callback.
    int dup_fd = -1;  // Ours, in the epoll set (so libvirt closing its fd cannot confuse epoll).
    int events = 0;   // virEventHandleType bits wanted.
    bool in_epoll = false;
    virEventHandleCallback cb = nullptr;
    void* opaque = nullptr;
    virFreeCallback ff = nullptr;
  };
  struct Timeout {
    int frequency = -1;
    uint64_t generation = 0;  // Bumped by update/remove so stale firings are dropped.
    virEventTimeoutCallback cb = nullptr;
    void* opaque = nullptr;
    virFreeCallback ff = nullptr;
    std::shared_ptr<asio::steady_timer> timer;
  };

  static uint32_t EpollMask(int events) {
    uint32_t mask = 0;
    if (events & VIR_EVENT_HANDLE_READABLE) mask |= EPOLLIN | EPOLLPRI;
    if (events & VIR_EVENT_HANDLE_WRITABLE) mask |= EPOLLOUT;
    return mask;  // EPOLLERR and EPOLLHUP are always reported, as poll() does.
  }

  static int LibvirtMask(uint32_t revents) {
    int events = 0;
    if (revents & (EPOLLIN | EPOLLPRI)) events |= VIR_EVENT_HANDLE_READABLE;
    if (revents & EPOLLOUT) events |= VIR_EVENT_HANDLE_WRITABLE;
    if (revents & EPOLLERR) events |= VIR_EVENT_HANDLE_ERROR;
    if (revents & EPOLLHUP) events |= VIR_EVENT_HANDLE_HANGUP;
    return events;
  }

  // Puts |h| in the epoll set as its wanted events say; a handle that wants
  // nothing is taken out, otherwise a hung-up fd would be reported forever.
  // Called with |mu_| held.
  void SyncEpoll(int watch, Handle& h) {
    epoll_event ev{};
    ev.events = EpollMask(h.events);
    ev.data.u64 = static_cast<uint64_t>(watch);
    if (h.events == 0) {
      if (h.in_epoll) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, h.dup_fd, nullptr);
      h.in_epoll = false;
    } else if (h.in_epoll) {
      epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, h.dup_fd, &ev);
    } else {
      h.in_epoll = epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, h.dup_fd, &ev) == 0;
    }
  }

  int AddHandle(int fd, int events, virEventHandleCallback cb, void* opaque, virFreeCallback ff) {
    int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup_fd < 0) return -1;
    int watch;
    {
      std::lock_guard lock(mu_);
      watch = next_watch_++;
      Handle& h = handles_[watch];
      h.fd = fd;
      h.dup_fd = dup_fd;
      h.events = events;
      h.cb = cb;
      h.opaque = opaque;
      h.ff = ff;
      SyncEpoll(watch, h);
      if (events != 0 && !h.in_epoll) {
        handles_.erase(watch);
        close(dup_fd);
        return -1;
      }
    }
    Kick();
    return watch;
  }

  void UpdateHandle(int watch, int events) {
    {
      std::lock_guard lock(mu_);
      auto it = handles_.find(watch);
      if (it == handles_.end()) return;
      it->second.events = events;
      SyncEpoll(watch, it->second);
    }
    Kick();
  }

  int RemoveHandle(int watch) {
    Handle h;
    {
      std::lock_guard lock(mu_);
      auto it = handles_.find(watch);
      if (it == handles_.end()) return -1;
      h = it->second;
      handles_.erase(it);
      if (h.in_epoll) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, h.dup_fd, nullptr);
    }
    close(h.dup_fd);
    if (h.ff) asio::post(*strand_, [ff = h.ff, opaque = h.opaque] { ff(opaque); });
    return 0;
  }

  int AddTimeout(int frequency, virEventTimeoutCallback cb, void* opaque, virFreeCallback ff) {
    int id;
    uint64_t generation;
    {
      std::lock_guard lock(mu_);
      id = next_timeout_++;
      Timeout& t = timeouts_[id];
      t.frequency = frequency;
      t.cb = cb;
      t.opaque = opaque;
      t.ff = ff;
      t.timer = std::make_shared<asio::steady_timer>(*strand_);
      generation = t.generation;
    }
    asio::post(*strand_, [this, id, generation] { Schedule(id, generation); });
    return id;
  }

  void UpdateTimeout(int id, int frequency) {
    uint64_t generation;
    {
      std::lock_guard lock(mu_);
      auto it = timeouts_.find(id);
      if (it == timeouts_.end()) return;
      it->second.frequency = frequency;
      generation = ++it->second.generation;
    }
    asio::post(*strand_, [this, id, generation] { Schedule(id, generation); });
  }

  int RemoveTimeout(int id) {
    Timeout t;
    {
      std::lock_guard lock(mu_);
      auto it = timeouts_.find(id);
      if (it == timeouts_.end()) return -1;
      t = std::move(it->second);
      timeouts_.erase(it);
    }
    // The timer is touched only on the strand; its pending wait sees a
    // missing id and does nothing.
    asio::post(*strand_, [timer = t.timer, ff = t.ff, opaque = t.opaque] {
      timer->cancel();
      if (ff) ff(opaque);
    });
    return 0;
  }

  // On the strand.
  void Schedule(int id, uint64_t generation) {
    std::shared_ptr<asio::steady_timer> timer;
    int frequency;
    {
      std::lock_guard lock(mu_);
      auto it = timeouts_.find(id);
      if (it == timeouts_.end() || it->second.generation != generation) return;
      timer = it->second.timer;
      frequency = it->second.frequency;
    }
    timer->cancel();
    if (frequency < 0) return;
    if (frequency == 0) {
      asio::post(*strand_, [this, id, generation] { Fire(id, generation); });
      return;
    }
    timer->expires_after(std::chrono::milliseconds(frequency));
    timer->async_wait([this, id, generation](const boost::system::error_code& ec) {
      if (!ec) Fire(id, generation);
    });
  }

  // On the strand.
  void Fire(int id, uint64_t generation) {
    virEventTimeoutCallback cb;
    void* opaque;
    {
      std::lock_guard lock(mu_);
      auto it = timeouts_.find(id);
      if (it == timeouts_.end() || it->second.generation != generation) return;
      cb = it->second.cb;
      opaque = it->second.opaque;
      ++stats_.timeout_dispatches;
      loop_threads_.insert(std::this_thread::get_id());
    }
    cb(id, opaque);
    Schedule(id, generation);  // Periodic, unless the callback changed or removed it.
  }

  void Kick() {
    asio::post(*strand_, [this] { Poll(); });
  }

  // On the strand: dispatches every ready handle, then waits for the epoll
  // set to become readable again.
  void Poll() {
    epoll_event ready[32];
    int n;
    do {
      n = epoll_wait(epoll_fd_, ready, 32, 0);
      if (n <= 0) break;
      {
        std::lock_guard lock(mu_);
        ++stats_.wakeups;
        loop_threads_.insert(std::this_thread::get_id());
      }
      for (int i = 0; i < n; ++i) {
        int watch = static_cast<int>(ready[i].data.u64);
        virEventHandleCallback cb;
        void* opaque;
        int fd;
        int events;
        {
          // The handle may have been removed or changed by an earlier
          // callback in this batch.
          std::lock_guard lock(mu_);
          auto it = handles_.find(watch);
          if (it == handles_.end() || it->second.events == 0) continue;
          events = LibvirtMask(ready[i].events) &
                   (it->second.events | VIR_EVENT_HANDLE_ERROR | VIR_EVENT_HANDLE_HANGUP);
          if (events == 0) continue;
          cb = it->second.cb;
          opaque = it->second.opaque;
          fd = it->second.fd;
          ++stats_.handle_dispatches;
        }
        cb(watch, fd, events, opaque);
      }
      // Level-triggered: whatever a callback left unread shows up again, but
      // give timers and other work a turn first.
      if (n > 0) {
        Kick();
        return;
      }
    } while (false);
    Arm();
  }

  void Arm() {
    if (armed_) return;
    armed_ = true;
    epoll_desc_->async_wait(asio::posix::stream_descriptor::wait_read,
                            [this](const boost::system::error_code& ec) {
                              armed_ = false;
                              if (!ec) Poll();
                            });
    // Readiness that arrived between our last epoll_wait and the wait being
    // queued produced an edge nobody was waiting for.
    epoll_event probe;
    if (epoll_wait(epoll_fd_, &probe, 1, 0) > 0) Kick();
  }

  static int AddHandleThunk(int fd, int events, virEventHandleCallback cb, void* opaque,
                            virFreeCallback ff) {
    return Get().AddHandle(fd, events, cb, opaque, ff);
  }
  static void UpdateHandleThunk(int watch, int events) { Get().UpdateHandle(watch, events); }
  static int RemoveHandleThunk(int watch) { return Get().RemoveHandle(watch); }
  static int AddTimeoutThunk(int frequency, virEventTimeoutCallback cb, void* opaque,
                             virFreeCallback ff) {
    return Get().AddTimeout(frequency, cb, opaque, ff);
  }
  static void UpdateTimeoutThunk(int id, int frequency) { Get().UpdateTimeout(id, frequency); }
  static int RemoveTimeoutThunk(int id) { return Get().RemoveTimeout(id); }

  std::mutex install_mu_;
  asio::any_io_executor base_executor_;
  std::unique_ptr<asio::strand<asio::any_io_executor>> strand_;
  std::unique_ptr<asio::posix::stream_descriptor> epoll_desc_;
  int epoll_fd_ = -1;
  std::unique_ptr<asio::io_context> private_io_;
  std::unique_ptr<asio::executor_work_guard<asio::io_context::executor_type>> private_guard_;
  std::atomic<bool> installed_{false};
  bool armed_ = false;  // Strand only.

  std::mutex mu_;  // Guards the tables and stats below.
  std::map<int, Handle> handles_;
  std::map<int, Timeout> timeouts_;
  int next_watch_ = 1;
  int next_timeout_ = 1;
  std::set<std::thread::id> loop_threads_;
  LibvirtEventLoop::Stats stats_;
};

}  // namespace

Status LibvirtEventLoop::Install(boost::asio::any_io_executor executor) {
  return Loop::Get().Install(std::move(executor));
}
Status LibvirtEventLoop::EnsureInstalled() { return Loop::Get().EnsureInstalled(); }
bool LibvirtEventLoop::installed() { return Loop::Get().installed(); }
boost::asio::any_io_executor LibvirtEventLoop::executor() { return Loop::Get().executor(); }
bool LibvirtEventLoop::OnLoopThread() { return Loop::Get().OnLoopThread(); }
LibvirtEventLoop::Stats LibvirtEventLoop::GetStats() { return Loop::Get().GetStats(); }

}  // namespace hvtrace::hostd
