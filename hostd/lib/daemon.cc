// GCC 12 reports -Wnull-dereference inside Asio's scheduler once it is
// inlined here (a false positive in Boost 1.74 code we do not own). The
// pragma must precede the Asio headers to cover them.
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include "daemon.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include <boost/asio/post.hpp>

#include "capture_recovery.h"
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
             auto root = ResolveCacheRoot(CacheRootSourcesFromEnvironment("", c.cache_dir.string()));
             return root.ok() ? root->string() : std::string();
           }()}};
}

constexpr const char* kCommandNames =
    "ping, version, list, status, captures, shutdown, boot, adopt, capture, stop, attach, detach, "
    "stream";

}  // namespace

std::string_view HvtraceVersion() { return HVTRACE_VERSION; }

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
    return Error{"another hvtraced already serves " + socket_path.string() + " (lock " +
                 lock_path + " is held)"};
  }

  auto names = state_.ListVmNames();
  if (!names.ok()) return names.error();
  for (const std::string& name : *names) {
    CaptureStore store(state_.CapturesDir(name));
    // Captures an earlier run died in: finished when their region copy was
    // durable, removed otherwise (before any supervisor can add new ones).
    auto recovery = RecoverIncompleteCaptures(store, formats_.get());
    if (!recovery.ok()) {
      Log("warning: VM " + name + ": " + recovery.error().message);
    } else {
      for (const CaptureEntry& entry : recovery->recovered) {
        Log("VM " + name + ": recovered capture " + entry.id + " left incomplete by an earlier run");
      }
      for (const std::string& why : recovery->removed) Log("VM " + name + ": incomplete capture " + why);
    }
    auto supervisor = std::make_shared<VmSupervisor>(name, nullptr, pool_.get_executor(),
                                                     std::move(store), supervisor_options());
    if (Status s = registry_.Add(supervisor); !s.ok()) return s;
  }

  ControlServerOptions options;
  options.socket_path = socket_path;
  options.group = ResolveGroup(config_.socket_group);
  options.max_connections = static_cast<size_t>(config_.max_connections);
  options.max_in_flight = static_cast<size_t>(config_.max_requests_per_connection);
  server_ = std::make_unique<ControlServer>(
      io_, options,
      [this](const Request& request, const PeerCredentials& peer,
             std::shared_ptr<Responder> responder) {
        HandleRequest(request, peer, responder);
      });
  if (Status s = server_->Listen(); !s.ok()) return s;
  for (const std::string& name : *names) ReadoptVm(name);
  if (!config_.libvirt_uri.empty()) {
    libvirt_ = std::make_unique<DaemonLibvirt>(*this, state_);
    if (Status s = libvirt_->Start(*names); !s.ok()) return s;
  }

  signals_.add(SIGTERM);
  signals_.add(SIGINT);
  signals_.async_wait([this](const boost::system::error_code& ec, int signo) {
    if (!ec) DoShutdown(std::string("signal ") + ::strsignal(signo));
  });
  Log("listening on " + socket_path.string() + ", state in " + config_.state_dir.string() + ", " +
      "formats cache " + (formats_->root().empty() ? std::string("(none)") : formats_->root().string()) +
      ", " + std::to_string(names->size()) + " known VM(s)");
  return {};
}

Status Daemon::AddVm(const std::string& name, std::unique_ptr<VmBackend> backend) {
  if (Status s = ValidateVmName(name); !s.ok()) return s;
  backend->UseFormats(formats_);
  auto supervisor = std::make_shared<VmSupervisor>(
      name, std::move(backend), pool_.get_executor(), CaptureStore(state_.CapturesDir(name)),
      supervisor_options());
  if (Status s = registry_.Add(supervisor); !s.ok()) return s;
  supervisor->Start();
  return {};
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
  if (stopping_) return;
  stopping_ = true;
  Log("shutting down (" + reason + ")");
  NotifySystemd("STOPPING=1");
  boost::system::error_code ignored;
  signals_.cancel(ignored);
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

std::shared_ptr<VmSupervisor> Daemon::VmFromArgs(const Request& request, Responder& responder) {
  auto it = request.args.find("name");
  if (it == request.args.end() || !it->is_string()) {
    responder.Fail(kErrBadRequest, "'" + request.cmd + "' needs args.name (a VM name)");
    return nullptr;
  }
  const std::string& name = it->get_ref<const std::string&>();
  if (Status s = ValidateVmName(name); !s.ok()) {
    responder.Fail(kErrBadRequest, s.error().message);
    return nullptr;
  }
  auto vm = registry_.Find(name);
  if (!vm) {
    std::string known;
    for (const auto& s : registry_.All()) known += (known.empty() ? "" : ", ") + s->name();
    responder.Fail(kErrUnknownVm, "no VM named '" + name + "' (known: " +
                                      (known.empty() ? "none" : known) + ")");
  }
  return vm;
}

void Daemon::HandleRequest(const Request& request, const PeerCredentials& /*peer*/,
                           const std::shared_ptr<Responder>& responder) {
  try {
    const std::string& cmd = request.cmd;
    if (cmd == "ping") {
      json pong = {{"pong", true},
                   {"pid", ::getpid()},
                   {"uptime_ms", (HostTime::Now().monotonic_ns - started_.monotonic_ns) / 1000000}};
      pong["libvirt"] = libvirt_ ? libvirt_->StatusJson() : json(nullptr);
      responder->Reply(pong);
    } else if (cmd == "version") {
      responder->Reply({{"version", HvtraceVersion()},
                        {"protocol", kControlProtocolVersion},
                        {"config", ConfigJson(config_)}});
    } else if (cmd == "list") {
      json vms = json::array();
      for (const auto& vm : registry_.All()) vms.push_back(vm->StatusJson());
      responder->Reply({{"vms", std::move(vms)}});
    } else if (cmd == "status") {
      if (auto vm = VmFromArgs(request, *responder)) responder->Reply(vm->StatusJson());
    } else if (cmd == "captures") {
      auto vm = VmFromArgs(request, *responder);
      if (!vm) return;
      // Reading manifests touches the disk: off the I/O thread.
      asio::post(pool_, [vm, responder] {
        auto list = vm->ListCaptures();
        if (!list.ok()) {
          responder->Fail(kErrInternal, list.error().message);
          return;
        }
        json captures = json::array();
        for (const auto& e : *list) captures.push_back(e.summary);
        responder->Reply({{"vm", vm->name()}, {"captures", std::move(captures)}});
      });
    } else if (libvirt_ && libvirt_->HandleRequest(request, responder)) {
      // A libvirt domain: answered there.
    } else if (HandleAttachCommand(request, responder)) {
      // Answered (or being answered) there.
    } else if (HandleVmCommand(request, responder)) {
      // Answered (or being answered) there.
    } else if (cmd == "shutdown") {
      responder->Reply({{"stopping", true}});
      RequestShutdown("shutdown command");
    } else {
      responder->Fail(kErrUnknownCommand, "unknown command '" + cmd + "'; known: " + kCommandNames);
    }
  } catch (const std::exception& e) {
    responder->Fail(kErrInternal, std::string("'") + request.cmd + "' failed: " + e.what());
  }
}

namespace {

int Usage(FILE* out) {
  std::fprintf(out,
               "usage: hvtraced [--config FILE] [--state-dir DIR] [--run-dir DIR] "
               "[--socket PATH] [--check-config]\n"
               "  --config FILE   config file (default %s; absent = defaults)\n"
               "  --state-dir DIR captures and per-VM state (overrides state_dir)\n"
               "  --run-dir DIR   socket and lock directory (overrides run_dir)\n"
               "  --socket PATH   control socket (overrides socket)\n"
               "  --check-config  print the effective configuration as JSON and exit\n",
               std::string(kDefaultConfigPath).c_str());
  return out == stdout ? 0 : 2;
}

}  // namespace

int DaemonMain(int argc, char** argv) {
  std::string config_path(kDefaultConfigPath);
  bool config_given = false;
  bool check_only = false;
  std::optional<std::filesystem::path> state_dir, run_dir, socket;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    auto value = [&](std::string_view flag) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "hvtraced: %.*s needs a value\n", static_cast<int>(flag.size()),
                     flag.data());
        return nullptr;
      }
      return argv[++i];
    };
    const char* v = nullptr;
    if (arg == "--help" || arg == "-h") return Usage(stdout);
    if (arg == "--version") {
      std::printf("hvtraced %s\n", std::string(HvtraceVersion()).c_str());
      return 0;
    }
    if (arg == "--check-config") {
      check_only = true;
    } else if (arg == "--config") {
      if (!(v = value(arg))) return 2;
      config_path = v;
      config_given = true;
    } else if (arg == "--state-dir") {
      if (!(v = value(arg))) return 2;
      state_dir = std::filesystem::absolute(v);
    } else if (arg == "--run-dir") {
      if (!(v = value(arg))) return 2;
      run_dir = std::filesystem::absolute(v);
    } else if (arg == "--socket") {
      if (!(v = value(arg))) return 2;
      socket = std::filesystem::absolute(v);
    } else {
      std::fprintf(stderr, "hvtraced: unknown argument '%s'\n", argv[i]);
      return Usage(stderr);
    }
  }
  auto config = LoadConfigFile(config_path, config_given);
  if (!config.ok()) {
    std::fprintf(stderr, "hvtraced: %s\n", config.error().message.c_str());
    return 1;
  }
  if (state_dir) config->state_dir = *state_dir;
  if (run_dir) config->run_dir = *run_dir;
  if (socket) config->socket_path = *socket;
  if (check_only) {
    std::printf("%s\n", ConfigJson(*config).dump(2).c_str());
    return 0;
  }
  ::signal(SIGPIPE, SIG_IGN);
  // Block the termination signals before the pool's threads exist, so only
  // the I/O thread (through signal_set) ever handles them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  Daemon daemon(std::move(*config));
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  if (Status s = daemon.Start(); !s.ok()) {
    std::fprintf(stderr, "hvtraced: %s\n", s.error().message.c_str());
    return 1;
  }
  daemon.Run();
  return 0;
}

}  // namespace hvtrace::hostd
