#include "daemon.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "daemon_libvirt.h"
#include "daemon_log.h"

#ifndef HVTRACE_VERSION
#define HVTRACE_VERSION "unknown"
#endif

namespace hvtrace::hostd {
namespace {

namespace asio = boost::asio;
using nlohmann::json;

// The sd_notify protocol, spoken directly (one datagram to $NOTIFY_SOCKET)
// so the daemon needs no libsystemd.
void NotifySystemd(const std::string& state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return;
  struct sockaddr_un addr {};
  addr.sun_family = AF_UNIX;
  size_t len = std::strlen(path);
  if (len >= sizeof addr.sun_path) return;
  std::memcpy(addr.sun_path, path, len);
  if (addr.sun_path[0] == '@') addr.sun_path[0] = '\0';  // Abstract namespace.
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&addr),
           static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len));
  ::close(fd);
}

std::optional<gid_t> ResolveGroup(const std::string& name) {
  if (name.empty()) return std::nullopt;
  std::array<char, 16384> buf;
  struct group grp;
  struct group* found = nullptr;
  if (getgrnam_r(name.c_str(), &grp, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
    Log("warning: socket group '" + name + "' does not exist; only root and uid " +
        std::to_string(::geteuid()) + " may use the control socket");
    return std::nullopt;
  }
  return grp.gr_gid;
}

}  // namespace

std::string_view HvtraceVersion() { return HVTRACE_VERSION; }

json ConfigJson(const Config& c) {
  return {{"state_dir", c.state_dir.string()},
          {"run_dir", c.run_dir.string()},
          {"socket", c.EffectiveSocketPath().string()},
          {"socket_group", c.socket_group},
          {"capture_retention", c.capture_retention},
          {"panic_policy", PanicPolicyName(c.panic_policy)},
          {"accel", c.accel},
          {"vm_on_shutdown", VmOnShutdownName(c.vm_on_shutdown)},
          {"worker_threads", c.worker_threads},
          {"max_connections", c.max_connections},
          {"max_requests_per_connection", c.max_requests_per_connection},
          {"libvirt_uri", c.libvirt_uri},
          {"cache_dir", c.cache_dir.string()},
          {"formats_cache", [&] {
             auto root =
                 ResolveCacheRoot(CacheRootSourcesFromEnvironment("", c.cache_dir.string()));
             return root.ok() ? root->string() : std::string();
           }()}};
}

Daemon::Daemon(Config config)
    : config_(std::move(config)),
      pool_(static_cast<size_t>(config_.worker_threads)),
      signals_(io_),
      stop_timer_(io_),
      state_(config_.state_dir),
      started_(HostTime::Now()) {
  // The same cache the CLI harvests into (formats_cache.h ResolveCacheRoot).
  auto root = ResolveCacheRoot(CacheRootSourcesFromEnvironment("", config_.cache_dir.string()));
  if (!root.ok()) Log("warning: " + root.error().message + "; captures keep region.bin only");
  formats_ = std::make_shared<FormatsService>(root.ok() ? *root : std::filesystem::path(),
                                              pool_.get_executor(), Log);
  captures_ =
      std::make_shared<CaptureService>(formats_, static_cast<size_t>(config_.worker_threads));
  capture_queue_ = std::make_shared<CaptureQueue>(pool_.get_executor(),
                                                  static_cast<size_t>(config_.worker_threads));
}

void Daemon::SetCaptureFaults(CaptureFaults faults) {
  captures_ = std::make_shared<CaptureService>(
      formats_, static_cast<size_t>(config_.worker_threads), std::move(faults));
}

Daemon::~Daemon() {
  // The server's handlers belong to io_, which no longer runs here.
  server_.reset();
  pool_.join();
  libvirt_.reset();
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

SupervisorOptions Daemon::supervisor_options() const {
  SupervisorOptions o;
  o.capture_retention = static_cast<size_t>(config_.capture_retention);
  o.panic_policy = config_.panic_policy;
  o.queue = capture_queue_;
  return o;
}

Status Daemon::Start() {
  if (Status s = state_.Prepare(); !s.ok()) return s;
  std::filesystem::path socket_path = config_.EffectiveSocketPath();
  // The run directory only needs to be traversable; the socket's own mode
  // (0660 + group) is what grants access.
  if (Status s = MakeDirs(socket_path.parent_path(), 0755); !s.ok()) return s;

  std::string lock_path = socket_path.string() + ".lock";
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0) return Error{"cannot open lock " + lock_path + ": " + std::strerror(errno)};
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return Error{"another hvtraced already serves " + socket_path.string() + " (lock " + lock_path +
                 " is held)"};
  }

  auto names = state_.ListVmNames();
  if (!names.ok()) return names.error();
  for (const std::string& name : *names) {
    if (Status s = SetOffline(name); !s.ok()) return s;
  }

  ControlServerOptions options;
  options.socket_path = socket_path;
  options.group = ResolveGroup(config_.socket_group);
  options.max_connections = static_cast<size_t>(config_.max_connections);
  options.max_in_flight = static_cast<size_t>(config_.max_requests_per_connection);
  server_ = std::make_unique<ControlServer>(
      io_, options,
      [this](const Request& request, const PeerCredentials& peer,
             std::shared_ptr<Responder> responder) { HandleRequest(request, peer, responder); });
  if (Status s = server_->Listen(); !s.ok()) return s;
  if (!config_.libvirt_uri.empty()) libvirt_ = std::make_unique<DaemonLibvirt>(*this, state_);
  // Captures an earlier run died in are finished on the pool, after the
  // socket listens, so a long recovery never delays start-up. The VMs are
  // re-adopted only then: a guest found still in a recovered panic must be
  // recognised as that panic, not captured twice.
  RecoverCaptures(*names, [this, known = *names] {
    if (stopping_) return;
    for (const std::string& name : known) ReadoptVm(name);
    if (libvirt_) {
      if (Status s = libvirt_->Start(known); !s.ok()) Log("warning: libvirt: " + s.error().message);
    }
  });

  signals_.add(SIGTERM);
  signals_.add(SIGINT);
  signals_.async_wait([this](const boost::system::error_code& ec, int signo) {
    if (!ec) DoShutdown(std::string("signal ") + ::strsignal(signo));
  });
  Log("listening on " + socket_path.string() + ", state in " + config_.state_dir.string() + ", " +
      "formats cache " +
      (formats_->root().empty() ? std::string("(none)") : formats_->root().string()) + ", " +
      std::to_string(names->size()) + " known VM(s)");
  return {};
}

Status Daemon::ReplaceVm(const std::string& name, std::unique_ptr<VmBackend> backend) {
  if (Status s = ValidateVmName(name); !s.ok()) return s;
  if (backend) {
    // Load (or harvest) the kernel's formats and size the copy buffers now,
    // so a panic capture neither waits for formats nor allocates.
    const KernelFiles kernel = backend->kernel_files();
    if (!kernel.key.empty()) formats_->Prepare(kernel.key, kernel.path, kernel.initrd);
    captures_->Reserve(backend->region_file_bytes());
  }
  auto supervisor = std::make_shared<VmSupervisor>(name, std::move(backend), pool_.get_executor(),
                                                   CaptureStore(state_.CapturesDir(name)),
                                                   captures_, supervisor_options());
  if (auto old = registry_.Remove(name); old && old->backend()) old->Stop();
  if (Status s = registry_.Add(supervisor); !s.ok()) return s;
  supervisor->Start();
  return {};
}

void Daemon::RecoverCaptures(const std::vector<std::string>& names, std::function<void()> then) {
  asio::post(pool_, [this, names, then = std::move(then)] {
    for (const std::string& name : names) {
      auto recovery = captures_->Recover(CaptureStore(state_.CapturesDir(name)));
      if (!recovery.ok()) {
        Log("warning: VM " + name + ": " + recovery.error().message);
        continue;
      }
      for (const CaptureEntry& entry : recovery->recovered) {
        Log("VM " + name + ": recovered capture " + entry.id +
            " left incomplete by an earlier run");
      }
      for (const std::string& why : recovery->removed)
        Log("VM " + name + ": incomplete capture " + why);
    }
    asio::post(io_, then);
  });
}

void Daemon::HandleVersion(const Request&, const std::shared_ptr<Responder>& responder) {
  responder->Reply({{"version", HvtraceVersion()},
                    {"protocol", kControlProtocolVersion},
                    {"config", ConfigJson(config_)}});
}

void Daemon::Run() {
  NotifySystemd("READY=1\nMAINPID=" + std::to_string(::getpid()));
  io_.run();
  // Captures already running finish before the process exits.
  pool_.join();
  Log("stopped");
}

void Daemon::RequestShutdown(std::string reason) {
  asio::post(io_, [this, reason = std::move(reason)] { DoShutdown(reason); });
}

void Daemon::DoShutdown(const std::string& reason) {
  if (stopping_.exchange(true)) return;
  Log("shutting down (" + reason + ")");
  NotifySystemd("STOPPING=1");
  boost::system::error_code ignored;
  signals_.cancel(ignored);
  // Streams see |stopping_| at their next look (kStreamPollInterval) and end
  // with the reason; their clients get that before the connections close.
  DrainStreams(std::chrono::steady_clock::now() + std::chrono::seconds(1));
}

void Daemon::DrainStreams(std::chrono::steady_clock::time_point deadline) {
  if (active_streams_.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    stop_timer_.expires_after(std::chrono::milliseconds(10));
    stop_timer_.async_wait([this, deadline](const boost::system::error_code& ec) {
      if (!ec) DrainStreams(deadline);
    });
    return;
  }
  FinishShutdown();
}

void Daemon::FinishShutdown() {
  if (server_) server_->Close();
  // keep: QEMUs hvtraced booted run on in their own sessions and the next
  // daemon re-adopts them from their specs; stop: they are quit here.
  if (config_.vm_on_shutdown == VmOnShutdown::kKeep) {
    registry_.ReleaseAll();
  } else {
    registry_.StopAll();
  }
  if (libvirt_) libvirt_->Stop();
  // Give connections a moment to flush their last replies (the `shutdown`
  // reply among them), then stop whatever else still holds the io_context.
  PollStop(std::chrono::steady_clock::now() + std::chrono::seconds(2));
}

void Daemon::PollStop(std::chrono::steady_clock::time_point deadline) {
  if (server_ == nullptr || server_->connection_count() == 0 ||
      std::chrono::steady_clock::now() >= deadline) {
    io_.stop();
    return;
  }
  stop_timer_.expires_after(std::chrono::milliseconds(20));
  stop_timer_.async_wait([this, deadline](const boost::system::error_code& ec) {
    if (!ec) PollStop(deadline);
  });
}

}  // namespace hvtrace::hostd
