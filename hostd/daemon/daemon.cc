#include "daemon.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
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
#include "fleet_keys.h"
#include "formats_cache.h"
#include "formats_harvest.h"
#include "log_rotation.h"
#include "meta_receiver.h"
#include "s3_credentials.h"

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

std::optional<gid_t> ResolveGroup(const std::string& key, const std::string& spec) {
  std::optional<gid_t> gid = ResolveGroupSpec(spec);
  if (!gid && !spec.empty()) {
    LogWarning(key + " '" + spec + "' is no group name or gid; only root and uid " +
               std::to_string(::geteuid()) + " have that role");
  }
  return gid;
}

// Caches made by older versions were 0755: tightened, so no local user reads
// (or, with a loose parent, plants) the kernels' formats the daemon decodes with.
void SecureFormatsCache(const std::filesystem::path& root) {
  const FormatCache cache(root);
  bool tightened = false;
  Status s = cache.Secure(&tightened);
  if (!s.ok()) {
    LogWarning(s.error().message + "; harvests cannot be stored");
  } else if (tightened) {
    LogNotice("formats cache " + cache.formats_dir().string() + " tightened to mode 0700");
  }
}

}  // namespace

std::string_view HvtraceVersion() { return HVTRACE_VERSION; }

json ConfigJson(const Config& c) {
  return {{"state_dir", c.state_dir.string()},
          {"run_dir", c.run_dir.string()},
          {"socket", c.EffectiveSocketPath().string()},
          {"socket_group", c.socket_group},
          {"admin_group", c.admin_group},
          {"capture_retention", c.capture_retention},
          {"capture_bytes_per_vm", c.capture_bytes_per_vm},
          {"capture_bytes_total", c.capture_bytes_total},
          {"capture_free_reserve", c.capture_free_reserve},
          {"console_log_size", c.console_log_size},
          {"console_log_files", c.console_log_files},
          {"panic_policy", PanicPolicyName(c.panic_policy)},
          {"vmcore", c.vmcore_on_panic ? "on-panic" : "off"},
          {"accel", c.accel},
          {"vm_on_shutdown", VmOnShutdownName(c.vm_on_shutdown)},
          {"worker_threads", c.worker_threads},
          {"guest_capture_interval_ms", c.guest_capture_interval.count()},
          {"log_watch", LogWatchName(c)},
          {"log_watch_interval_ms", c.log_watch_interval.count()},
          {"max_connections", c.max_connections},
          {"max_requests_per_connection", c.max_requests_per_connection},
          {"libvirt_uri", c.libvirt_uri},
          {"libvirt_qemu_log_dir", c.libvirt_qemu_log_dir.string()},
          {"cache_dir", c.cache_dir.string()},
          {"harvest_initrd", ResolveHarvestInitrd(c.harvest_initrd).string()},
          {"log_level", LogLevelName(c.log_level)},
          {"qemu_sandbox", c.qemu_sandbox ? "on" : "off"},
          {"qemu_user", c.qemu_user},
          {"qemu_binary", c.qemu_binary},
          {"upload_endpoint", c.upload_endpoint},
          {"upload_bucket", c.upload_bucket},
          {"upload_region", c.upload_region},
          {"upload_credentials", c.upload_credentials.string()},
          {"upload_prefix", c.upload_prefix},
          {"upload_retry_max_ms", c.upload_retry_max.count()},
          {"formats_cache", [&] {
             auto root =
                 ResolveCacheRoot(CacheRootSourcesFromEnvironment("", c.cache_dir.string()));
             return root.ok() ? root->string() : std::string();
           }()}};
}

Daemon::Daemon(Config initial, ConfigSource reload_source)
    : config_(std::make_shared<const Config>(std::move(initial))),
      reload_source_(std::move(reload_source)),
      pool_(static_cast<size_t>(config()->worker_threads)),
      signals_(io_),
      hup_(io_),
      stop_timer_(io_),
      console_timer_(io_),
      warm_timer_(io_),
      log_watch_timer_(io_),
      state_(config()->state_dir),
      started_(HostTime::Now()) {
  // The same cache the CLI harvests into (formats_cache.h ResolveCacheRoot).
  auto root = ResolveCacheRoot(CacheRootSourcesFromEnvironment("", config()->cache_dir.string()));
  if (!root.ok()) LogWarning(root.error().message + "; captures keep region.bin only");
  if (root.ok()) SecureFormatsCache(*root);
  formats_ = std::make_shared<FormatsService>(
      root.ok() ? *root : std::filesystem::path(), formats_pool_.get_executor(),
      [](LogLevel level, const std::string& message) { Log(level, message); },
      ResolveHarvestInitrd(config()->harvest_initrd));
  budget_ = std::make_shared<CaptureBudget>(
      DiskLimits{config()->capture_bytes_per_vm, config()->capture_bytes_total,
                 config()->capture_free_reserve},
      state_.root() / "vms");
  captures_ = std::make_shared<CaptureService>(
      formats_, static_cast<size_t>(config()->worker_threads), CaptureFaults{}, budget_);
  capture_queue_ = std::make_shared<CaptureQueue>(pool_.get_executor(),
                                                  static_cast<size_t>(config()->worker_threads));
}

void Daemon::SetCaptureFaults(CaptureFaults faults) {
  before_upload_queued_ = faults.before_upload_queued;
  captures_ = std::make_shared<CaptureService>(
      formats_, static_cast<size_t>(config()->worker_threads), std::move(faults), budget_);
}

Daemon::~Daemon() {
  // The server's handlers belong to io_, which no longer runs here.
  server_.reset();
  pool_.join();
  if (uploader_) uploader_->Stop();  // After the pool: no capture enqueues any more.
  formats_pool_.stop();  // Queued harvests are dropped; a running one ends on its timeout.
  formats_pool_.join();
  libvirt_.reset();
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

SupervisorOptions Daemon::supervisor_options() const {
  SupervisorOptions o;
  o.capture_retention = static_cast<size_t>(config()->capture_retention);
  o.panic_policy = config()->panic_policy;
  o.vmcore_on_panic = config()->vmcore_on_panic;
  o.queue = capture_queue_;
  o.guest_capture_interval = config()->guest_capture_interval;
  if (uploader_) {
    // On the capture's worker, before the capture is reported: once a
    // client sees it, its entry is durable (or the error is logged and the
    // next start's scan queues it).
    o.on_committed = [u = uploader_.get(), fault = before_upload_queued_](
                         const std::string& vm, const std::string& id,
                         const std::filesystem::path& dir) {
      if (fault) fault();
      if (Status s = u->Enqueue(vm, id, dir); !s.ok())
        LogErr("upload: VM " + vm + ": " + s.error().message);
    };
  }
  return o;
}

Status Daemon::Start() {
  if (Status s = state_.Prepare(); !s.ok()) return s;
  {
    // Kernel copies an earlier run's formats-harvest requests left.
    std::error_code ec;
    std::filesystem::remove_all(HarvestInputsDir(), ec);
  }
  std::filesystem::path socket_path = config()->EffectiveSocketPath();
  // The run directory must be traversable by everyone (the daemon's umask
  // is 027); the socket's own mode (0660 + group, ACL) is what grants access.
  const mode_t old_mask = ::umask(022);
  Status run_dir = MakeDirs(socket_path.parent_path(), 0755);
  ::umask(old_mask);
  if (!run_dir.ok()) return run_dir;

  std::string lock_path = socket_path.string() + ".lock";
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0) return Error{"cannot open lock " + lock_path + ": " + std::strerror(errno)};
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    return Error{"another hvtraced already serves " + socket_path.string() + " (lock " + lock_path +
                 " is held)"};
  }

  access_.daemon_uid = ::geteuid();
  access_.observer_group = ResolveGroup("socket_group", config()->socket_group);
  access_.admin_group = ResolveGroup("admin_group", config()->admin_group);
  access_.observer_group_name = config()->socket_group;
  access_.admin_group_name = config()->admin_group;
  ShareStateDir();

  // Before any VM is registered: their supervisors queue their captures.
  if (Status s = StartUploader(); !s.ok()) return s;

  auto names = state_.ListVmNames();
  if (!names.ok()) return names.error();
  for (const std::string& name : *names) {
    if (Status s = SetOffline(name); !s.ok()) return s;
  }

  ControlServerOptions options;
  options.socket_path = socket_path;
  options.group = access_.observer_group;
  options.access = access_;
  options.max_connections = static_cast<size_t>(config()->max_connections);
  options.max_in_flight = static_cast<size_t>(config()->max_requests_per_connection);
  server_ = std::make_unique<ControlServer>(
      io_, options,
      [this](const Request& request, const PeerCredentials& peer,
             std::shared_ptr<Responder> responder) { HandleRequest(request, peer, responder); });
  if (Status s = server_->Listen(); !s.ok()) return s;
  if (!config()->libvirt_uri.empty()) libvirt_ = std::make_unique<DaemonLibvirt>(*this, state_);
  // Captures an earlier run died in are finished on the pool, after the
  // socket listens, so a long recovery never delays start-up. The VMs are
  // re-adopted only then: a guest found still in a recovered panic must be
  // recognised as that panic, not captured twice.
  RecoverCaptures(*names, [this, known = *names] {
    if (stopping_) return;
    for (const std::string& name : known) ReadoptVm(name);
    if (libvirt_) {
      if (Status s = libvirt_->Start(); !s.ok()) LogWarning("libvirt: " + s.error().message);
    }
  });

  ScheduleConsoleRotation();
  ScheduleRegionWarming();
  ScheduleLogWatch();

  signals_.add(SIGTERM);
  signals_.add(SIGINT);
  signals_.async_wait([this](const boost::system::error_code& ec, int signo) {
    if (!ec) DoShutdown(std::string("signal ") + ::strsignal(signo));
  });
  hup_.add(SIGHUP);
  WaitForReload();
  LogNotice("listening on " + socket_path.string() + ", state in " + config()->state_dir.string() +
            ", " + "formats cache " +
            (formats_->root().empty() ? std::string("(none)") : formats_->root().string()) + ", " +
            std::to_string(names->size()) + " known VM(s)");
  return {};
}

void Daemon::WaitForReload() {
  hup_.async_wait([this](const boost::system::error_code& ec, int) {
    if (ec || stopping_) return;
    Reload();
    WaitForReload();
  });
}

std::vector<std::string> Daemon::Reload() {
  NotifySystemd("RELOADING=1\nMONOTONIC_USEC=" +
                std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count()));
  std::vector<std::string> changed;
  Result<Config> loaded = reload_source_ ? reload_source_() : Error{"no configuration source"};
  if (!loaded.ok()) {
    LogErr("reload: " + loaded.error().message + "; the configuration is unchanged");
    NotifySystemd("READY=1");
    return changed;
  }
  const std::shared_ptr<const Config> old = config();
  Config next = std::move(*loaded);
  const json before = ConfigJson(*old);
  // Keys whose value is built into what Start made (directories, socket,
  // groups, threads, the libvirt connection, the formats cache): kept.
  std::vector<std::string> restart;
  auto keep = [&](const char* key, auto Config::*field) {
    if (next.*field != (*old).*field) {
      restart.push_back(key);
      next.*field = (*old).*field;
    }
  };
  keep("state_dir", &Config::state_dir);
  keep("run_dir", &Config::run_dir);
  keep("socket", &Config::socket_path);
  keep("socket_group", &Config::socket_group);
  keep("admin_group", &Config::admin_group);
  keep("worker_threads", &Config::worker_threads);
  keep("libvirt_uri", &Config::libvirt_uri);
  keep("cache_dir", &Config::cache_dir);
  keep("harvest_initrd", &Config::harvest_initrd);
  // The uploader (uploader.h) is made once, with its credentials, at start.
  keep("upload_endpoint", &Config::upload_endpoint);
  keep("upload_bucket", &Config::upload_bucket);
  keep("upload_region", &Config::upload_region);
  keep("upload_credentials", &Config::upload_credentials);
  keep("upload_prefix", &Config::upload_prefix);
  keep("upload_retry_max_ms", &Config::upload_retry_max);
  for (const std::string& key : restart) {
    LogWarning("reload: " + key + " needs a restart; keeping " + before.value(key, json()).dump());
  }
  const json kept = ConfigJson(next);
  for (const auto& [key, value] : kept.items()) {
    if (before.contains(key) && before[key] != value) changed.push_back(key);
  }
  SetLogLevel(next.log_level);
  budget_->SetLimits(
      DiskLimits{next.capture_bytes_per_vm, next.capture_bytes_total, next.capture_free_reserve});
  if (server_) {
    server_->SetLimits(static_cast<size_t>(next.max_connections),
                       static_cast<size_t>(next.max_requests_per_connection));
  }
  config_.store(std::make_shared<const Config>(next));
  // Every VM's supervisor, live ones and offline ones alike.
  const SupervisorOptions o = supervisor_options();
  for (const auto& supervisor : registry_.All()) {
    supervisor->SetLiveOptions(o.capture_retention, o.panic_policy, o.guest_capture_interval);
  }
  std::string list;
  for (const std::string& key : changed) list += (list.empty() ? "" : ", ") + key;
  LogNotice("reloaded the configuration: " +
            (list.empty() ? std::string("nothing changed") : "changed " + list));
  NotifySystemd("READY=1");
  return changed;
}

void Daemon::ShareStateDir() const {
  if (!access_.observer_group) return;
  const gid_t group = *access_.observer_group;
  // Directories: group socket_group, setgid (what is created below inherits
  // the group), 0750; files are written 0640. A VM's private inputs (its
  // kernel and initrd copies) stay 0700. Done at every start, so a state dir
  // from an older hvtraced or a changed socket_group is brought in line.
  size_t failures = 0;  // Only the first is logged: a read-only dir fails for every file.
  auto share = [group, &failures](const std::filesystem::path& path, bool dir) {
    if (::lchown(path.c_str(), static_cast<uid_t>(-1), group) != 0) {
      if (failures++ == 0) {
        LogWarning("cannot give " + path.string() + " to gid " + std::to_string(group) + ": " +
                   std::strerror(errno) + "; observers may not read captures");
      }
      return;
    }
    if (dir) (void)::chmod(path.c_str(), path.filename() == "inputs" ? 0700 : 02750);
  };
  std::error_code ec;
  share(state_.root(), true);
  for (auto it = std::filesystem::recursive_directory_iterator(state_.root(), ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    const bool dir = it->is_directory(ec) && !it->is_symlink(ec);
    if (dir && it->path().filename() == "inputs") {
      share(it->path(), true);
      it.disable_recursion_pending();
      continue;
    }
    share(it->path(), dir);
  }
}

Status Daemon::ReplaceVm(const std::string& name, std::unique_ptr<VmBackend> backend) {
  if (Status s = ValidateVmName(name); !s.ok()) return s;
  if (backend) {
    // Load (or harvest) the kernel's formats and size the copy buffers now,
    // so a panic capture neither waits for formats nor allocates.
    const KernelFiles kernel = backend->kernel_files();
    // Never with the VM's own initrd (formats_service.h).
    if (!kernel.key.empty()) formats_->Prepare(kernel.key, kernel.path);
    captures_->Reserve({.region_file = backend->region_file_bytes()});
  }
  auto supervisor = std::make_shared<VmSupervisor>(name, std::move(backend), pool_.get_executor(),
                                                   CaptureStore(state_.CapturesDir(name)),
                                                   captures_, supervisor_options());
  if (auto old = registry_.Remove(name); old && old->backend()) old->Stop();
  if (Status s = registry_.Add(supervisor); !s.ok()) return s;
  supervisor->Start();
  // A region a restarted daemon mapped again (attach mode) is copied from
  // the pool too.
  if (VmBackend* b = supervisor->backend(); b) {
    if (auto region = b->live_region()) captures_->Reserve({.attach = region->size()});
  }
  if (VmBackend* b = supervisor->backend(); b && b->meta_socket()) {
    // The VM's metadata channel: socket on the I/O thread, checks on the pool.
    MetaReceiverOptions meta;
    meta.vm = name;
    meta.socket = b->meta_socket();
    meta.meta_dir = MetaDirOfVm(state_.VmDir(name));
    meta.read_guest_memory = b->guest_memory_reader();
    meta.log = [](LogLevel level, const std::string& message) { Log(level, message); };
    // A guest leaving its kernel: one more trigger of the VM's captures.
    meta.leaving = [vm = std::weak_ptr<VmSupervisor>(supervisor)](auto ack) {
      if (auto s = vm.lock()) {
        s->OnGuestLeaving(std::move(ack));
      } else {
        ack(false);
      }
    };
    auto receiver = MetaReceiver::Create(io_.get_executor(), pool_.get_executor(), meta);
    supervisor->SetMetaReceiver(receiver);
    receiver->Start();
  }
  return {};
}

void Daemon::RecoverCaptures(const std::vector<std::string>& names, std::function<void()> then) {
  asio::post(pool_, [this, names, then = std::move(then)] {
    for (const std::string& name : names) {
      auto recovery = captures_->Recover(CaptureStore(state_.CapturesDir(name)));
      if (!recovery.ok()) {
        LogErr("VM " + name + ": " + recovery.error().message);
        continue;
      }
      for (const CaptureEntry& entry : recovery->recovered) {
        LogNotice("VM " + name + ": recovered capture " + entry.id +
                  " left incomplete by an earlier run");
        if (uploader_) {
          if (Status s = uploader_->Enqueue(name, entry.id, entry.dir); !s.ok())
            LogErr("upload: VM " + name + ": " + s.error().message);
        }
      }
      for (const std::string& why : recovery->removed)
        LogNotice("VM " + name + ": incomplete capture " + why);
      for (const std::string& why : recovery->kept)
        LogNotice("VM " + name + ": kept capture " + why);
    }
    asio::post(io_, then);
  });
}

Status Daemon::StartUploader() {
  const Config& c = *config();
  if (c.upload_endpoint.empty()) return {};
  auto credentials = LoadS3Credentials(c.upload_credentials, /*private_only=*/true);
  if (!credentials.ok()) return Error{"upload: " + credentials.error().message};
  auto prefix = NormalizePrefix(c.upload_prefix);
  if (!prefix.ok()) return prefix.error();
  UploaderOptions options;
  options.s3.endpoint = c.upload_endpoint;
  options.s3.bucket = c.upload_bucket;
  options.s3.region = c.upload_region;
  options.s3.access_key = credentials->access_key;
  options.s3.secret_key = credentials->secret_key;
  if (Status s = ValidateS3Config(options.s3); !s.ok())
    return Error{"upload: " + s.error().message};
  options.prefix = *prefix;
  options.host = FleetHostName();
  options.queue_root = state_.root() / "upload-queue";
  options.vms_root = state_.root() / "vms";
  options.retry_max = c.upload_retry_max;
  uploader_ = std::make_unique<Uploader>(std::move(options));
  if (Status s = uploader_->Start(); !s.ok()) return s;
  budget_->SetUploadPending([u = uploader_.get()](const std::string& vm, const std::string& id) {
    return u->Pending(vm, id);
  });
  LogNotice("upload: captures go to " + c.upload_endpoint + "/" + c.upload_bucket + "/" +
            (prefix->empty() ? "" : *prefix + "/") + FleetHostName() + "/");
  return {};
}

void Daemon::ScheduleConsoleRotation() {
  console_timer_.expires_after(std::chrono::seconds(1));
  console_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopping_) return;
    // File work belongs on the pool; the next round starts when this one is done.
    asio::post(pool_, [this] {
      if (auto names = state_.ListVmNames(); names.ok()) {
        for (const std::string& name : *names) {
          const std::filesystem::path log = state_.VmDir(name) / "console.log";
          Result<bool> rotated =
              RotateLogIfLarger(log, config()->console_log_size, config()->console_log_files);
          if (!rotated.ok() && console_errors_logged_.insert(name).second) {
            LogWarning("VM " + name + ": console log: " + rotated.error().message);
          }
        }
      }
      asio::post(io_, [this] { ScheduleConsoleRotation(); });
    });
  });
}

void Daemon::ScheduleRegionWarming() {
  // A guest writes its boot range while it boots, after its VM registered:
  // the panic's copy finds the tables filled when this has run since. Once
  // a range is all filled, Warm returns at once.
  warm_timer_.expires_after(std::chrono::seconds(2));
  warm_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopping_) return;
    asio::post(pool_, [this] {
      for (const auto& vm : registry_.All()) {
        if (VmBackend* b = vm->backend(); b) {
          if (auto file = b->region_file(); file) file->Warm();
        }
      }
      asio::post(io_, [this] { ScheduleRegionWarming(); });
    });
  });
}

void Daemon::ScheduleLogWatch() {
  const std::shared_ptr<const Config> c = config();
  log_watch_timer_.expires_after(c->log_watch_interval);
  log_watch_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopping_) return;
    const std::shared_ptr<const Config> now = config();
    if (!now->log_watch_oops && !now->log_watch_warn) {
      ScheduleLogWatch();  // Off until a reload turns it on.
      return;
    }
    if (!log_watcher_) {
      log_watcher_ = std::make_unique<LogWatcher>(
          formats_, [root = state_](const std::string& vm) { return MetaDirOfVm(root.VmDir(vm)); });
    }
    auto vms = std::make_shared<const std::vector<std::shared_ptr<VmSupervisor>>>(registry_.All());
    WatchLogsFrom(std::move(vms), 0, LogWatchSettings{now->log_watch_oops, now->log_watch_warn});
  });
}

void Daemon::WatchLogsFrom(std::shared_ptr<const std::vector<std::shared_ptr<VmSupervisor>>> vms,
                           size_t next, LogWatchSettings settings) {
  asio::post(pool_, [this, vms = std::move(vms), next, settings]() mutable {
    if (next < vms->size() && !stopping_) {
      log_watcher_->LookAt(*(*vms)[next], settings);
      WatchLogsFrom(std::move(vms), next + 1, settings);
      return;
    }
    std::vector<std::string> names;
    for (const auto& vm : *vms) names.push_back(vm->name());
    log_watcher_->KeepOnly(names);
    asio::post(io_, [this] { ScheduleLogWatch(); });
  });
}

void Daemon::HandleVersion(const Request&, const VersionRequest&, const ResponderPtr& responder) {
  responder->Reply(VersionReply{
      {}, std::string(HvtraceVersion()), kControlProtocolVersion, ConfigJson(*config())});
}

void Daemon::Run() {
  NotifySystemd("READY=1\nMAINPID=" + std::to_string(::getpid()));
  io_.run();
  // Captures already running finish before the process exits.
  pool_.join();
  LogNotice("stopped");
}

void Daemon::RequestShutdown(std::string reason) {
  asio::post(io_, [this, reason = std::move(reason)] { DoShutdown(reason); });
}

void Daemon::DoShutdown(const std::string& reason) {
  if (stopping_.exchange(true)) return;
  LogNotice("shutting down (" + reason + ")");
  NotifySystemd("STOPPING=1");
  boost::system::error_code ignored;
  signals_.cancel(ignored);
  hup_.cancel(ignored);
  console_timer_.cancel();
  warm_timer_.cancel();
  log_watch_timer_.cancel();
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
  // The I/O thread runs on until every VM is let go: a capture in flight
  // finishes first, and its reads of guest memory are QMP commands served
  // here. Stopped at once (as before), each read waited out its 6 s timeout
  // and the capture lost its kernel log (hvtraced_lifecycle_e2e.cc,
  // SigtermMidPanicCaptureFinishesItWithTheKernelLogThenQuitsTheVm).
  vms_let_go_.emplace(io_.get_executor());
  auto all_done = [this] { asio::post(io_, [this] { AfterVmsLetGo(); }); };
  // keep: QEMUs hvtraced booted run on in their own sessions and the next
  // daemon re-adopts them from their specs; stop: they are quit here.
  if (config()->vm_on_shutdown == VmOnShutdown::kKeep) {
    registry_.ReleaseAll(all_done);
  } else {
    registry_.StopAll(all_done);
  }
}

void Daemon::AfterVmsLetGo() {
  if (libvirt_) libvirt_->Stop();
  vms_let_go_.reset();
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
