#include "libvirt_backend.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "formats_cache.h"
#include "libvirt_attach.h"

namespace hvtrace::hostd {

using json = nlohmann::json;

namespace {

std::string StateName(int state, int reason) {
  switch (state) {
    case VIR_DOMAIN_RUNNING:
      return "running";
    case VIR_DOMAIN_BLOCKED:
      return "blocked";
    case VIR_DOMAIN_PAUSED:
      return reason == VIR_DOMAIN_PAUSED_CRASHED ? "paused (crashed)"
                                                 : "paused (reason " + std::to_string(reason) + ")";
    case VIR_DOMAIN_SHUTDOWN:
      return "shutting down";
    case VIR_DOMAIN_SHUTOFF:
      return reason == VIR_DOMAIN_SHUTOFF_CRASHED ? "shut off (crashed)"
             : reason == VIR_DOMAIN_SHUTOFF_DESTROYED
                 ? "shut off (destroyed)"
                 : "shut off (reason " + std::to_string(reason) + ")";
    case VIR_DOMAIN_CRASHED:
      return reason == VIR_DOMAIN_CRASHED_PANICKED
                 ? "crashed (panicked)"
                 : "crashed (reason " + std::to_string(reason) + ")";
    case VIR_DOMAIN_PMSUSPENDED:
      return "pmsuspended";
    default:
      return "state " + std::to_string(state);
  }
}

std::vector<std::string> ReadCmdline(const std::string& pid) {
  std::string all;
  int fd = open(("/proc/" + pid + "/cmdline").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[4096];
    ssize_t n;
    // QEMU command lines are long but bounded; cap what we hold anyway.
    while (all.size() < (1u << 20) && (n = read(fd, buf, sizeof buf)) > 0) {
      all.append(buf, static_cast<size_t>(n));
    }
    close(fd);
  }
  std::vector<std::string> args;
  size_t start = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i] == '\0') {
      args.push_back(all.substr(start, i - start));
      start = i + 1;
    }
  }
  return args;
}

// QEMU started by libvirt for domain |name|: "-name guest=NAME,...".
bool IsDomainQemu(const std::vector<std::string>& args, const std::string& name) {
  const std::string guest_arg = "guest=" + name;
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "-name" &&
        (args[i + 1] == guest_arg || args[i + 1].rfind(guest_arg + ",", 0) == 0)) {
      return true;
    }
  }
  return false;
}

}  // namespace

Result<pid_t> FindDomainQemu(const std::string& name) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (IsDomainQemu(ReadCmdline(pid), name)) return static_cast<pid_t>(std::stol(pid));
  }
  return Error{"no QEMU runs for domain '" + name + "' on this host (-name guest=" + name + ")"};
}

Result<LibvirtRegionSpec> FindBootRangeRegion(const DomainXmlInfo& info) {
  const std::string ctx = "domain '" + info.name + "' boot range: ";
  // memmap=SIZE$ADDR, as `hvtrace domain-xml` wrote it into <cmdline>.
  std::optional<uint64_t> size, gpa;
  std::istringstream words(info.cmdline);
  std::string word;
  while (words >> word) {
    if (word.rfind("memmap=", 0) != 0) continue;
    size_t dollar = word.find('$');
    if (dollar == std::string::npos) continue;
    Result<uint64_t> s = ParseKernelSize(word.substr(7, dollar - 7));
    Result<uint64_t> a = ParseKernelSize(word.substr(dollar + 1));
    if (!s.ok() || !a.ok()) return Error{ctx + "cannot parse '" + word + "'"};
    size = *s;
    gpa = *a;
  }
  if (!size)
    return Error{ctx +
                 "no memmap=SIZE$ADDR in the kernel command line (not made by "
                 "`hvtrace domain-xml`?)"};
  if (info.numa_cells.size() != 2 || info.numa_cells[1].mem_access != "shared") {
    return Error{ctx + "expected two NUMA cells, cell 1 with memAccess='shared'"};
  }
  const uint64_t node0 = info.numa_cells[0].memory_bytes;
  if (*gpa < node0) return Error{ctx + "the range is not in NUMA node 1"};

  // libvirt names the node-1 file itself (memory_backing_dir/…/<id>-<name>/
  // ram-node1); QEMU's command line says where.
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::vector<std::string> args = ReadCmdline(pid);
    if (!IsDomainQemu(args, info.name)) continue;
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] != "-object" || args[i + 1].empty() || args[i + 1][0] != '{') continue;
      json obj = json::parse(args[i + 1], nullptr, false);
      if (!obj.is_object() || obj.value("id", "") != "ram-node1" ||
          obj.value("qom-type", "") != "memory-backend-file") {
        continue;
      }
      LibvirtRegionSpec spec;
      spec.kind = "boot-range";
      spec.path = obj.value("mem-path", "");
      const uint64_t node1 = obj.value("size", uint64_t{0});
      spec.offset = *gpa - node0;
      spec.size = *size;
      if (spec.path.empty() || spec.offset + spec.size > node1 || !obj.value("share", false)) {
        return Error{ctx + "QEMU pid " + pid + "'s ram-node1 (" + spec.path.string() + ", " +
                     std::to_string(node1) + " bytes, share=" +
                     (obj.value("share", false) ? "on" : "off") + ") cannot hold the range"};
      }
      return spec;
    }
    return Error{ctx + "QEMU pid " + pid + " has no file-backed ram-node1"};
  }
  return Error{ctx + "no running QEMU for it (is the domain running on this host?)"};
}

LibvirtRegionSpec ShmemRegion(const std::filesystem::path& path, uint64_t size) {
  return LibvirtRegionSpec{"shmem", path, 0, size};
}

Result<std::unique_ptr<LibvirtDomainBackend>> AdoptLibvirtDomain(
    std::shared_ptr<LibvirtClient> client, const std::string& domain, LibvirtBackendOptions options,
    bool allow_no_region) {
  Result<LibvirtDomainPtr> dom = client->FindDomain(domain);
  if (!dom.ok()) return dom.error();
  if (virDomainIsActive(dom->get()) != 1) {
    return Error{"libvirt: domain '" + domain + "' is not running; start it first"};
  }
  Result<std::string> xml = LibvirtDomainXml(dom->get());
  if (!xml.ok()) return xml.error();
  Result<DomainXmlInfo> info = ParseDomainXml(*xml);
  if (!info.ok()) return Error{"libvirt: domain '" + domain + "': " + info.error().message};
  // hvtrace's shmem device: with a region header it is an attach-mode region.
  std::optional<LibvirtRegionSpec> raw_shmem;
  std::shared_ptr<LiveRegion> live;
  std::string live_shm;
  for (const DomainShmem& s : info->shmems) {
    if (s.alias.rfind("ua-hvtrace-", 0) != 0 || s.model != "ivshmem-plain" || s.size_bytes == 0 ||
        !ValidateShmName(s.name).ok()) {
      continue;
    }
    const std::filesystem::path path = "/dev/shm/" + s.name;
    if (Result<std::shared_ptr<LiveRegion>> region = LiveRegion::OpenExisting(path); region.ok()) {
      live = *region;
      live_shm = s.name;
    } else {
      raw_shmem = ShmemRegion(path, s.size_bytes);
    }
    break;
  }
  Result<LibvirtRegionSpec> boot = FindBootRangeRegion(*info);
  LibvirtRegionSpec region;
  if (boot.ok()) {
    region = std::move(*boot);
  } else if (raw_shmem) {
    region = std::move(*raw_shmem);
  } else if (live || allow_no_region) {
    region.kind = "none";
  } else {
    return Error{"libvirt: domain '" + domain + "' has no hvtrace shmem device (`hvtrace attach " +
                 domain + "`) and no boot range: " + boot.error().message};
  }
  Result<std::unique_ptr<LibvirtDomainBackend>> backend = LibvirtDomainBackend::Create(
      std::move(client), domain, std::move(region), std::move(options));
  if (backend.ok() && live) (*backend)->AdoptAttachedRegion(std::move(live), live_shm);
  return backend;
}

Result<std::unique_ptr<LibvirtDomainBackend>> LibvirtDomainBackend::Create(
    std::shared_ptr<LibvirtClient> client, const std::string& domain, LibvirtRegionSpec region,
    LibvirtBackendOptions options) {
  Result<LibvirtDomainPtr> dom = client->FindDomain(domain);
  if (!dom.ok()) return dom.error();
  char uuid[VIR_UUID_STRING_BUFLEN] = {};
  virDomainGetUUIDString(dom->get(), uuid);
  const char* name = virDomainGetName(dom->get());
  std::string on_crash, kernel, initrd;
  if (Result<std::string> xml = LibvirtDomainXml(dom->get()); xml.ok()) {
    if (Result<DomainXmlInfo> info = ParseDomainXml(*xml); info.ok()) {
      on_crash = info->on_crash;
      kernel = info->kernel;
      initrd = info->initrd;
    }
  }
  if (region.kind == "none") {
    std::unique_ptr<LibvirtDomainBackend> backend(new LibvirtDomainBackend(
        std::move(client), name ? name : domain, uuid, std::move(region), -1, on_crash));
    backend->options_ = std::move(options);
    backend->kernel_path_ = kernel;
    return backend;
  }
  if (region.size == 0) return Error{"domain '" + domain + "': region size is 0"};
  int fd = open(region.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Error{"domain '" + domain + "': cannot open region " + region.path.string() + ": " +
                 std::strerror(errno)};
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < region.offset + region.size) {
    close(fd);
    return Error{"domain '" + domain + "': region " + region.path.string() + " has " +
                 std::to_string(st.st_size) + " bytes, less than offset " +
                 std::to_string(region.offset) + " + size " + std::to_string(region.size)};
  }
  std::unique_ptr<LibvirtDomainBackend> backend(new LibvirtDomainBackend(
      std::move(client), name ? name : domain, uuid, std::move(region), fd, on_crash));
  backend->options_ = std::move(options);
  // Hashing the kernel now keeps it off the capture path.
  backend->kernel_path_ = kernel;
  backend->initrd_path_ = initrd;
  if (kernel.empty()) {
    backend->kernel_key_error_ =
        "the domain has no <os><kernel> (direct kernel boot) to name its formats";
  } else if (Result<std::string> key = KernelKeyOfFile(kernel); key.ok()) {
    backend->kernel_key_ = *key;
  } else {
    backend->kernel_key_error_ = key.error().message;
  }
  return backend;
}

LibvirtDomainBackend::LibvirtDomainBackend(std::shared_ptr<LibvirtClient> client, std::string name,
                                           std::string uuid, LibvirtRegionSpec region, int fd,
                                           std::string on_crash)
    : client_(std::move(client)),
      name_(std::move(name)),
      uuid_(std::move(uuid)),
      region_(std::move(region)),
      fd_(fd),
      on_crash_(std::move(on_crash)) {}

LibvirtDomainBackend::~LibvirtDomainBackend() {
  Stop();
  if (fd_ >= 0) close(fd_);
}

void LibvirtDomainBackend::Start(VmEventSink& sink) {
  {
    std::lock_guard lock(mu_);
    sink_ = &sink;
  }
  if (subscription_ < 0) {
    subscription_ = client_->Subscribe(uuid_, [this](const LibvirtDomainEvent& e) { OnEvent(e); });
  }
  // A domain that panicked while nobody watched (hvtraced restarted, adopt
  // after the fact) sends no event: look once. With <on_crash>preserve</on_crash>
  // QEMU is stopped, so the region is as the panic left it.
  bool active = false;
  const std::string state = StateNow(&active);
  if (active && (state.rfind("crashed", 0) == 0 || state == "paused (crashed)")) {
    sink.OnVmEvent(
        VmEvent{"HVTRACE_FOUND_PANICKED",
                {{"status", state},
                 {"libvirt_state", state},
                 {"note", "the domain was already " + state +
                              " when hvtraced began watching it; the panic's time is unknown"}},
                HostTime::Now()});
  }
}

void LibvirtDomainBackend::Stop() {
  if (subscription_ >= 0) {
    client_->Unsubscribe(subscription_);  // Returns once no callback runs.
    subscription_ = -1;
  }
  std::lock_guard lock(mu_);
  sink_ = nullptr;
}

std::string LibvirtDomainBackend::StateNow(bool* active) const {
  *active = false;
  Result<LibvirtDomainPtr> dom = client_->FindDomain(uuid_);
  if (!dom.ok()) return "unknown (" + dom.error().message + ")";
  int state = 0, reason = 0;
  if (virDomainGetState(dom->get(), &state, &reason, 0) != 0) {
    return "unknown (" + LibvirtLastError() + ")";
  }
  *active = state != VIR_DOMAIN_SHUTOFF;
  return StateName(state, reason);
}

void LibvirtDomainBackend::OnCrash(const LibvirtDomainEvent& e, const std::string& name) {
  // Only note it and hand it on: the capture copies the region on a worker.
  // Nothing is lost by waiting: the region file is open here, so its bytes
  // outlive QEMU when <on_crash> destroys it, and a restarted domain gets a
  // new node-1 file.
  VmEventSink* sink;
  {
    std::lock_guard lock(mu_);
    stopped_after_panic_.reset();
    pending_panic_ = PanicNote{LibvirtLifecycleName(e.event, e.detail),
                               MsBetween(e.received, std::chrono::steady_clock::now())};
    sink = sink_;
  }
  if (sink) {
    json data = {{"libvirt_event", LibvirtLifecycleName(e.event, e.detail)},
                 {"on_crash", on_crash_}};
    sink->OnVmEvent(VmEvent{name, data, HostTime::Now()});
  }
}

void LibvirtDomainBackend::OnShmemRemoved(const std::string& alias) {
  std::shared_ptr<LiveRegion> region;
  {
    std::lock_guard lock(mu_);
    if (!attached_ || alias.empty() || alias != ShmemAlias(attach_shm_)) return;
    // The device is gone whoever asked: without this a guest-side eject left
    // the domain "attached" (a stream waiting forever, attach refused).
    attached_ = false;
    region = live_region_;
    if (!attach_busy_) {
      attach_info_ = {
          {"detached", true}, {"device", alias}, {"by", "guest (DEVICE_REMOVED nobody asked for)"}};
    }
  }
  if (region) region->MarkDetached();
}

void LibvirtDomainBackend::OnEvent(const LibvirtDomainEvent& e) {
  using Kind = LibvirtDomainEvent::Kind;
  if (e.kind == Kind::kDeviceRemoved) OnShmemRemoved(e.device_alias);
  VmEventSink* sink;
  {
    std::lock_guard lock(mu_);
    sink = sink_;
  }
  if (sink == nullptr) return;
  auto emit = [&](const std::string& name, json data) {
    sink->OnVmEvent(VmEvent{name, std::move(data), HostTime::Now()});
  };
  switch (e.kind) {
    case Kind::kLifecycle: {
      const std::string what = LibvirtLifecycleName(e.event, e.detail);
      json data = {{"libvirt_event", what}};
      switch (e.event) {
        case VIR_DOMAIN_EVENT_CRASHED:
          OnCrash(e, e.detail == VIR_DOMAIN_EVENT_CRASHED_CRASHLOADED ? "GUEST_CRASHLOADED"
                                                                      : "GUEST_PANICKED");
          return;
        case VIR_DOMAIN_EVENT_SHUTDOWN:
          emit("SHUTDOWN", data);
          return;
        case VIR_DOMAIN_EVENT_SUSPENDED:
          emit("STOP", data);
          return;
        case VIR_DOMAIN_EVENT_RESUMED:
        case VIR_DOMAIN_EVENT_STARTED:
          emit("RESUME", data);
          return;
        case VIR_DOMAIN_EVENT_STOPPED: {
          {
            std::lock_guard lock(mu_);
            if (pending_panic_) stopped_after_panic_ = what;
          }
          sink->OnVmGone("libvirt: domain '" + name_ + "' " + what);
          return;
        }
        default:
          emit("LIBVIRT_" + what.substr(0, what.find('/')), data);
          return;
      }
    }
    case Kind::kReboot:
      emit("RESET", {{"libvirt_event", "REBOOT"}});
      return;
    case Kind::kDeviceAdded:
      emit("DEVICE_ADDED", {{"device", e.device_alias}});
      return;
    case Kind::kDeviceRemoved:
      emit("DEVICE_DELETED", {{"device", e.device_alias}});
      return;
    case Kind::kDisconnected: {
      {
        std::lock_guard lock(mu_);
        ++disconnects_;
      }
      emit("LIBVIRT_DISCONNECTED", {{"reason", e.reason}, {"uri", client_->uri()}});
      return;
    }
    case Kind::kReconnected: {
      emit("LIBVIRT_RECONNECTED", {{"uri", client_->uri()}});
      // Events during the gap are lost: look at the domain now.
      Result<LibvirtDomainPtr> dom = client_->FindDomain(uuid_);
      int state = 0, reason = 0;
      if (!dom.ok() || virDomainGetState(dom->get(), &state, &reason, 0) != 0) {
        sink->OnVmGone("libvirt: domain '" + name_ + "' not found after reconnecting");
      } else if (state == VIR_DOMAIN_SHUTOFF) {
        sink->OnVmGone("libvirt: domain '" + name_ + "' " + StateName(state, reason) +
                       " while libvirtd was away");
      } else if ((state == VIR_DOMAIN_PAUSED && reason == VIR_DOMAIN_PAUSED_CRASHED) ||
                 state == VIR_DOMAIN_CRASHED) {
        bool already;
        {
          std::lock_guard lock(mu_);
          already = pending_panic_.has_value();
        }
        if (!already) {
          LibvirtDomainEvent synthetic = e;
          synthetic.event = VIR_DOMAIN_EVENT_CRASHED;
          synthetic.detail = VIR_DOMAIN_EVENT_CRASHED_PANICKED;
          OnCrash(synthetic, "GUEST_PANICKED");
        }
      }
      return;
    }
  }
}

Result<CaptureInputs> LibvirtDomainBackend::PrepareCapture() {
  std::optional<PanicNote> panic;
  std::optional<std::string> stopped;
  {
    std::lock_guard lock(mu_);
    panic = std::move(pending_panic_);
    pending_panic_.reset();
    stopped = stopped_after_panic_;
  }
  CaptureInputs in;
  if (region_.kind != "none") {
    // Through our own descriptor: libvirt deletes a boot range's node-1
    // file when the domain stops, and the open file still holds the data.
    in.region_file = RegionFileSource{
        fd_,          region_.path, region_.offset, region_.size, 0, region_.kind == "boot-range",
        kernel_path_, kernel_key_};
  }
  in.attach = live_region();
  bool active = false;
  const std::string state = StateNow(&active);
  json lv = {{"kind", "libvirt"},     {"domain", name_},       {"uuid", uuid_},
             {"uri", client_->uri()}, {"on_crash", on_crash_}, {"state_at_capture", state}};
  if (!kernel_key_error_.empty()) lv["kernel_key_error"] = kernel_key_error_;
  if (panic) {
    lv["panic"] = {{"event", panic->event},
                   {"event_to_callback_ms", panic->ms_to_callback},
                   {"outcome", active && !stopped ? "preserved" : "destroyed"}};
    if (stopped) lv["panic"]["stopped_event"] = *stopped;
  }
  in.transport = std::move(lv);
  return in;
}

void LibvirtDomainBackend::ApplyPanicPolicy(PanicPolicy policy) {
  if (policy == PanicPolicy::kPause) return;  // libvirt's <on_crash> decides.
  Result<LibvirtDomainPtr> dom = client_->FindDomain(uuid_);
  if (!dom.ok()) return;
  if (virDomainIsActive(dom->get()) != 1) return;  // Destroyed by <on_crash> already.
  if (policy == PanicPolicy::kResume) {
    virDomainResume(dom->get());
  } else {
    virDomainDestroy(dom->get());
  }
}

nlohmann::json LibvirtDomainBackend::Describe() const {
  std::lock_guard lock(mu_);
  return {{"domain", name_},
          {"uuid", uuid_},
          {"uri", client_->uri()},
          {"connected", client_->connected()},
          {"reconnects", client_->reconnects()},
          {"disconnects", disconnects_},
          {"on_crash", on_crash_},
          {"kernel", kernel_path_},
          {"formats_key", kernel_key_},
          {"region",
           {{"kind", region_.kind},
            {"path", region_.path.string()},
            {"offset", region_.offset},
            {"size", region_.size}}},
          {"attach", attach_info_.is_null() ? json(nullptr) : attach_info_}};
}

std::shared_ptr<LiveRegion> LibvirtDomainBackend::live_region() const {
  std::lock_guard lock(mu_);
  return live_region_;
}

json LibvirtDomainBackend::AttachStatus() const {
  std::lock_guard lock(mu_);
  if (!live_region_) return nullptr;
  json j = {{"attached", attached_},
            {"region", {{"file", live_region_->path().string()}, {"size", live_region_->size()}}},
            {"alias", attached_ ? ShmemAlias(attach_shm_) : std::string()}};
  if (Result<RegionSnapshot> snap = live_region_->Snapshot(); snap.ok() && snap->guest.present) {
    j["guest"] = AttachGuestJson(snap->guest);
  } else {
    j["guest"] = nullptr;
  }
  return j;
}

void LibvirtDomainBackend::AdoptAttachedRegion(std::shared_ptr<LiveRegion> region,
                                               std::string shm_name) {
  std::lock_guard lock(mu_);
  live_region_ = std::move(region);
  attach_shm_ = std::move(shm_name);
  attached_ = true;
  attach_info_ = {
      {"region", {{"file", live_region_->path().string()}, {"size", live_region_->size()}}},
      {"found_at_adopt", true}};
}

void LibvirtDomainBackend::RunBlocking(std::function<void()> fn) {
  if (options_.blocking) {
    boost::asio::post(options_.blocking, std::move(fn));
  } else {
    fn();
  }
}

void LibvirtDomainBackend::Attach(const AttachOptions& options, AttachDone done) {
  {
    std::lock_guard lock(mu_);
    if (attach_busy_) {
      done(Error{"an attach or detach is already under way"});
      return;
    }
    if (attached_) {
      done(Error{"region " + live_region_->path().string() + " is already attached (alias " +
                 ShmemAlias(attach_shm_) + "); `hvtrace detach " + name_ + "` first"});
      return;
    }
    attach_busy_ = true;
  }
  RunBlocking([this, options, done = std::move(done)] {
    Result<json> r = DoAttach(options);
    {
      std::lock_guard lock(mu_);
      attach_busy_ = false;
      attach_info_ = r.ok() ? *r : json{{"error", r.error().message}};
    }
    done(std::move(r));
  });
}

Result<json> LibvirtDomainBackend::DoAttach(const AttachOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string shm = options.region_path.filename().string();
  if (options.region_path.parent_path() != "/dev/shm" || !ValidateShmName(shm).ok()) {
    return Error{"region " + options.region_path.string() +
                 " must be a valid name in /dev/shm "
                 "(libvirt's <shmem> lives there)"};
  }
  // QEMU may run as another user (libvirt-qemu): the file must be its.
  Result<pid_t> qemu = FindDomainQemu(name_);
  if (!qemu.ok()) return qemu.error();
  struct stat proc {};
  if (stat(("/proc/" + std::to_string(*qemu)).c_str(), &proc) != 0) {
    return Error{"QEMU pid " + std::to_string(*qemu) + " of domain '" + name_ + "' is gone"};
  }
  Result<LibvirtDomainPtr> dom = client_->FindDomain(uuid_);
  if (!dom.ok()) return dom.error();
  virDomainInfo info{};
  if (virDomainGetInfo(dom->get(), &info) != 0) {
    return Error{"domain '" + name_ + "': cannot read its vCPU count: " + LibvirtLastError()};
  }
  // Our own mapping of an earlier (detached) region at this path is fine:
  // the new region replaces it. Anyone else's is not.
  const std::string self = "pid " + std::to_string(getpid()) + " ";
  if (std::optional<std::string> user = FindMapper(options.region_path);
      user && user->rfind(self, 0) != 0) {
    return Error{options.region_path.string() + " is in use by " + *user +
                 " (a region of another VM, or one QEMU has not released yet)"};
  }
  LiveRegionOptions ro;
  ro.path = options.region_path;
  ro.size_bytes = options.size_bytes;
  ro.max_cpus = info.nrVirtCpu > 0 ? info.nrVirtCpu : 1;
  ro.events = options.events;
  ro.pump_interval_ms = options.pump_interval_ms;
  if (proc.st_uid != geteuid()) ro.owner_uid = proc.st_uid;
  if (proc.st_gid != getegid()) ro.owner_gid = proc.st_gid;
  ro.replace_existing = true;  // Our own name for this VM; nobody maps it (checked above).
  Result<std::shared_ptr<LiveRegion>> region = LiveRegion::Create(ro);
  if (!region.ok()) return region.error();

  ShmemAttachRequest req;
  req.domain = uuid_;
  req.shm_name = shm;
  req.size_bytes = options.size_bytes;
  req.prepared_file = true;
  Result<ShmemAttachment> plugged = AttachShmem(client_, req);
  if (!plugged.ok()) {
    std::error_code ec;
    std::filesystem::remove(options.region_path, ec);
    return plugged.error();
  }
  const double plug_ms = MsBetween(t0, std::chrono::steady_clock::now());
  const auto plugged_at = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(mu_);
    live_region_ = *region;
    attach_shm_ = shm;
    attached_ = true;
  }
  // The agent in the guest maps BAR2 and announces itself.
  Result<RegionSnapshot> snap = (*region)->Snapshot();
  auto announced = [&] {
    return snap.ok() && snap->guest.present && snap->guest.status.state == region::kStateRunning;
  };
  while (!announced() && std::chrono::steady_clock::now() - plugged_at < options.wait) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    snap = (*region)->Snapshot();
  }
  json reply = {{"region",
                 {{"file", (*region)->path().string()},
                  {"size", (*region)->size()},
                  {"region_id", (*region)->geometry().region_id}}},
                {"device", {{"id", plugged->alias}, {"memdev", "shmem " + shm}}},
                {"libvirt",
                 {{"domain", name_},
                  {"uuid", uuid_},
                  {"uri", client_->uri()},
                  {"device_added_ms", plugged->attach_ms},
                  {"owner_uid", plugged->owner_uid}}},
                {"plug_ms", plug_ms}};
  if (announced()) {
    reply["announce_ms"] = MsBetween(plugged_at, std::chrono::steady_clock::now());
    reply["guest"] = AttachGuestJson(snap->guest);
  } else {
    reply["guest"] = nullptr;
    reply["note"] =
        "no hvtrace-agent announced itself within " + std::to_string(options.wait.count()) +
        " ms; the region stays plugged (start hvtrace-agent in the guest; `hvtrace status` "
        "shows it later)";
  }
  return reply;
}

void LibvirtDomainBackend::Detach(std::chrono::milliseconds timeout, AttachDone done) {
  {
    std::lock_guard lock(mu_);
    if (attach_busy_) {
      done(Error{"an attach or detach is already under way"});
      return;
    }
    if (!attached_) {
      done(Error{"no region is attached to domain '" + name_ + "'"});
      return;
    }
    attach_busy_ = true;
  }
  RunBlocking([this, timeout, done = std::move(done)] {
    Result<json> r = DoDetach(timeout);
    {
      std::lock_guard lock(mu_);
      attach_busy_ = false;
      attach_info_ = r.ok() ? *r : json{{"error", r.error().message}};
    }
    done(std::move(r));
  });
}

Result<json> LibvirtDomainBackend::DoDetach(std::chrono::milliseconds timeout) {
  std::string shm;
  std::shared_ptr<LiveRegion> region;
  {
    std::lock_guard lock(mu_);
    shm = attach_shm_;
    region = live_region_;
  }
  const auto t0 = std::chrono::steady_clock::now();
  // libvirt reports success after 5 s even when the guest never let go:
  // only DEVICE_REMOVED counts (DetachShmem waits for it).
  if (Status s = DetachShmem(client_, uuid_, shm, timeout); !s.ok()) return s.error();
  const double removed_ms = MsBetween(t0, std::chrono::steady_clock::now());
  {
    std::lock_guard lock(mu_);
    attached_ = false;
  }
  if (region) region->MarkDetached();
  return json{{"detached", true},
              {"device", ShmemAlias(shm)},
              {"device_deleted_ms", removed_ms},
              {"region",
               {{"file", region ? region->path().string() : std::string()},
                {"kept_open", region != nullptr}}}};
}

}  // namespace hvtrace::hostd
