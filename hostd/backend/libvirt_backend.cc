#include "libvirt_backend.h"

#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <nlohmann/json.hpp>

#include "formats_cache.h"

namespace hvtrace::hostd {

using json = nlohmann::json;

namespace {

// A region file descriptor shared with the captures reading it: closed when
// the last of them lets go, so switching to a new file never pulls it from
// under a copy in progress.
// The range's file, mapped with its page tables filled (RegionFile): the
// last run's closes once no capture holds it.
std::shared_ptr<const RegionFile> OwnFile(int fd, const LibvirtRegionSpec& region) {
  return RegionFile::Adopt(fd, region.offset, region.size);
}

}  // namespace

LibvirtDomainBackend::LibvirtDomainBackend(std::unique_ptr<LibvirtDomain> domain,
                                           LibvirtRegionSpec region, int region_fd,
                                           LibvirtDomainFacts facts, LibvirtBackendOptions options)
    : domain_(std::move(domain)),
      facts_(std::move(facts)),
      options_(std::move(options)),
      region_(std::move(region)),
      fd_(OwnFile(region_fd, region_)),
      attach_transport_(*domain_, options_.blocking),
      attach_(options_.blocking ? options_.blocking : boost::asio::any_io_executor(),
              attach_transport_) {
  if (facts_.meta_channel) {
    meta_link_ = std::make_shared<MetaLink>();
    // Running now: this run's path, through QEMU's root (RefreshMetaSocket).
    if (!facts_.meta_socket.empty()) RefreshMetaSocket();
  }
  if (region_.kind == "none") return;
  // Hashing the kernel now keeps it off the capture path.
  if (facts_.kernel.empty()) {
    kernel_key_error_ = "the domain has no <os><kernel> (direct kernel boot) to name its formats";
  } else if (Result<std::string> key = KernelKeyOfFile(facts_.kernel); key.ok()) {
    kernel_key_ = *key;
  } else {
    kernel_key_error_ = key.error().message;
  }
}

LibvirtDomainBackend::~LibvirtDomainBackend() {
  life_.reset();
  Stop();
}

void LibvirtDomainBackend::Start(VmEventSink& sink) {
  {
    std::lock_guard lock(mu_);
    sink_ = &sink;
  }
  if (subscription_ < 0) {
    subscription_ = domain_->Subscribe([this](const LibvirtDomainEvent& e) { OnEvent(e); });
  }
  // A domain that panicked while nobody watched (hvtraced restarted, adopt
  // after the fact) sends no event: look once. With <on_crash>preserve</on_crash>
  // QEMU is stopped, so the region is as the panic left it.
  Result<LibvirtDomainState> state = domain_->State();
  bool pending;
  {
    std::lock_guard lock(mu_);
    pending = region_.kind == "boot-range" && fd_ == nullptr;
  }
  // Adopted before it started, and started since: open this run's file.
  if (pending && state.ok() && state->active) OpenBootRangeOfThisRun();
  if (state.ok() && !state->active) {
    // Adopted while shut off: `status` says so instead of "running" until
    // libvirt starts it (STARTED → RESUME).
    sink.OnVmEvent(VmEvent{"HVTRACE_FOUND_SHUTOFF",
                           {{"status", state->text}, {"libvirt_state", state->text}},
                           HostTime::Now()});
  }
  if (state.ok() && state->active && state->crashed) {
    sink.OnVmEvent(
        VmEvent{"HVTRACE_FOUND_PANICKED",
                {{"status", state->text},
                 {"libvirt_state", state->text},
                 {"note", "the domain was already " + state->text +
                              " when hvtraced began watching it; the panic's time is unknown"}},
                HostTime::Now()});
  }
}

void LibvirtDomainBackend::Stop() {
  if (subscription_ >= 0) {
    domain_->Unsubscribe(subscription_);  // Returns once no callback runs.
    subscription_ = -1;
  }
  std::lock_guard lock(mu_);
  sink_ = nullptr;
}

std::string LibvirtDomainBackend::StateText(bool* active) const {
  Result<LibvirtDomainState> state = domain_->State();
  *active = state.ok() && state->active;
  return state.ok() ? state->text : "unknown (" + state.error().message + ")";
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
                 {"on_crash", facts_.on_crash}};
    sink->OnVmEvent(VmEvent{name, data, HostTime::Now()});
  }
}

void LibvirtDomainBackend::OnEvent(const LibvirtDomainEvent& e) {
  using Kind = LibvirtDomainEvent::Kind;
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
    case Kind::kLifecycle:
      return OnLifecycle(e, *sink);
    case Kind::kReboot:
      return emit("RESET", {{"libvirt_event", "REBOOT"}});
    case Kind::kDeviceAdded:
      return emit("DEVICE_ADDED", {{"device", e.device_alias}});
    case Kind::kDeviceRemoved:
      // Ours, asked for or not (a guest may eject it): the device is gone.
      attach_.DeviceGone(e.device_alias);
      return emit("DEVICE_DELETED", {{"device", e.device_alias}});
    case Kind::kDisconnected: {
      {
        std::lock_guard lock(mu_);
        ++disconnects_;
      }
      return emit("LIBVIRT_DISCONNECTED", {{"reason", e.reason}, {"uri", domain_->uri()}});
    }
    case Kind::kReconnected:
      emit("LIBVIRT_RECONNECTED", {{"uri", domain_->uri()}});
      return LookAfterReconnect(e);
  }
}

void LibvirtDomainBackend::OnLifecycle(const LibvirtDomainEvent& e, VmEventSink& sink) {
  const std::string what = LibvirtLifecycleName(e.event, e.detail);
  const json data = {{"libvirt_event", what}};
  auto emit = [&](const std::string& name) {
    sink.OnVmEvent(VmEvent{name, data, HostTime::Now()});
  };
  switch (e.event) {
    case VIR_DOMAIN_EVENT_CRASHED:
      return OnCrash(e, e.detail == VIR_DOMAIN_EVENT_CRASHED_CRASHLOADED ? "GUEST_CRASHLOADED"
                                                                         : "GUEST_PANICKED");
    case VIR_DOMAIN_EVENT_SHUTDOWN:
      return emit("SHUTDOWN");
    case VIR_DOMAIN_EVENT_SUSPENDED:
      return emit("STOP");
    case VIR_DOMAIN_EVENT_STARTED: {
      // libvirt made a new node-1 file for this run: the boot range is there
      // now, not in the file of the last run (or nowhere, adopted before start).
      bool boot_range;
      {
        std::lock_guard lock(mu_);
        boot_range = region_.kind == "boot-range";
      }
      if (boot_range && options_.blocking) {
        std::weak_ptr<int> life = life_;
        boost::asio::post(options_.blocking, [this, life] {
          if (!life.expired()) OpenBootRangeOfThisRun();
        });
      } else if (boot_range) {
        OpenBootRangeOfThisRun();
      }
      return emit("RESUME");
    }
    case VIR_DOMAIN_EVENT_RESUMED:
      return emit("RESUME");
    case VIR_DOMAIN_EVENT_STOPPED: {
      {
        std::lock_guard lock(mu_);
        if (pending_panic_) stopped_after_panic_ = what;
      }
      return sink.OnVmGone("libvirt: domain '" + domain_->name() + "' " + what);
    }
    default:
      return emit("LIBVIRT_" + what.substr(0, what.find('/')));
  }
}

void LibvirtDomainBackend::LookAfterReconnect(const LibvirtDomainEvent& e) {
  if (!options_.blocking) return;  // Nowhere to block: the next event tells.
  std::weak_ptr<int> life = life_;
  boost::asio::post(options_.blocking, [this, life, e] {
    if (life.expired()) return;
    VmEventSink* sink;
    {
      std::lock_guard lock(mu_);
      sink = sink_;
    }
    if (sink == nullptr) return;
    const std::string& name = domain_->name();
    Result<LibvirtDomainState> state = domain_->State();
    if (!state.ok()) {
      sink->OnVmGone("libvirt: domain '" + name + "' not found after reconnecting");
    } else if (!state->active) {
      sink->OnVmGone("libvirt: domain '" + name + "' " + state->text + " while libvirtd was away");
    } else if (state->crashed) {
      bool already;
      {
        std::lock_guard lock(mu_);
        already = pending_panic_.has_value();
      }
      if (already) return;
      LibvirtDomainEvent synthetic = e;
      synthetic.event = VIR_DOMAIN_EVENT_CRASHED;
      synthetic.detail = VIR_DOMAIN_EVENT_CRASHED_PANICKED;
      OnCrash(synthetic, "GUEST_PANICKED");
    }
  });
}

std::optional<RegionFileSource> LibvirtDomainBackend::RangeSource(
    const LibvirtRegionSpec& region, std::shared_ptr<const RegionFile> fd) const {
  if (region.kind == "none" || !fd) return std::nullopt;
  // Through our own descriptor: libvirt deletes a boot range's node-1
  // file when the domain stops, and the open file still holds the data.
  return RegionFileSource{std::move(fd), region.path, region.offset,
                          region.size,   region.gpa,  region.kind == "boot-range",
                          facts_.kernel, kernel_key_};
}

std::optional<RegionFileSource> LibvirtDomainBackend::boot_range() const {
  std::lock_guard lock(mu_);
  std::optional<RegionFileSource> source = RangeSource(region_, fd_);
  if (source && !source->boot_range) return std::nullopt;  // A raw shmem file: no log in it.
  return source;
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
  LibvirtRegionSpec region;
  std::shared_ptr<const RegionFile> fd;
  std::string region_error;
  {
    std::lock_guard lock(mu_);
    region = region_;
    fd = fd_;
    region_error = region_error_;
  }
  CaptureInputs in;
  in.region_file = RangeSource(region, fd);
  in.attach = live_region();
  // QEMU's boot-handshake lines are in libvirt's log of the domain, among
  // libvirt's own lines and those of earlier starts: the capture keeps the
  // newest start's (host_trace_capture.h).
  const std::string name = domain_->name();
  if (facts_.qemu_trace && !options_.qemu_log_dir.empty() && !name.empty() &&
      name.find('/') == std::string::npos && name[0] != '.') {
    in.qemu_trace_log = options_.qemu_log_dir / (name + ".log");
    in.qemu_trace_log_is_libvirt = true;
  }
  bool active = false;
  const std::string state = StateText(&active);
  json lv = {{"kind", "libvirt"},     {"domain", domain_->name()},   {"uuid", domain_->uuid()},
             {"uri", domain_->uri()}, {"on_crash", facts_.on_crash}, {"state_at_capture", state}};
  if (!kernel_key_error_.empty()) lv["kernel_key_error"] = kernel_key_error_;
  if (region.kind != "none" && !fd) {
    lv["region_error"] = region_error.empty() ? "the boot range file is not open" : region_error;
  }
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
  Result<LibvirtDomainState> state = domain_->State();
  if (!state.ok() || !state->active) return;  // Destroyed by <on_crash> already.
  (void)(policy == PanicPolicy::kResume ? domain_->Resume() : domain_->Destroy());
}

nlohmann::json LibvirtDomainBackend::Describe() const {
  std::lock_guard lock(mu_);
  json j = {{"domain", domain_->name()},
            {"uuid", domain_->uuid()},
            {"disconnects", disconnects_},
            {"on_crash", facts_.on_crash},
            {"kernel", facts_.kernel},
            {"formats_key", kernel_key_},
            {"meta_channel", facts_.meta_channel},
            {"meta_socket", facts_.meta_socket},
            {"region",
             {{"kind", region_.kind},
              {"path", region_.path.string()},
              {"offset", region_.offset},
              {"size", region_.size},
              {"open", fd_ != nullptr}}}};
  if (!region_error_.empty()) j["region"]["error"] = region_error_;
  if (!boot_range_facts_.is_null()) j["boot_range"] = boot_range_facts_;
  j.update(domain_->Connection());  // uri, connected, reconnects.
  return j;
}

void LibvirtDomainBackend::SetBootRangeCell(const DomainBootCell& cell, bool running) {
  LibvirtRegionSpec region;
  std::shared_ptr<const RegionFile> fd;
  {
    std::lock_guard lock(mu_);
    region = region_;
    fd = fd_;
  }
  // The probe copies the range: not under the lock.
  json facts = BootRangeFacts(cell, region, fd ? fd->fd() : -1, running);
  std::lock_guard lock(mu_);
  boot_range_facts_ = std::move(facts);
}

std::function<MetaSocketTarget()> LibvirtDomainBackend::meta_socket() const {
  if (!meta_link_) return nullptr;
  return [link = meta_link_] {
    std::lock_guard lock(link->mu);
    return link->target;
  };
}

GuestMemoryReader LibvirtDomainBackend::guest_memory_reader() {
  return [domain = domain_](uint64_t addr, size_t size) -> Result<std::vector<std::byte>> {
    // libvirt peeks at most 1 MiB a call (VIR_DOMAIN_MEMORY_PEEK_BUFFER_MAX).
    constexpr size_t kPeekMax = 1 << 20;
    std::vector<std::byte> out;
    out.reserve(size);
    for (size_t done = 0; done < size;) {
      const size_t n = std::min(kPeekMax, size - done);
      Result<std::vector<std::byte>> part = domain->PeekVirtual(addr + done, n);
      if (!part.ok()) return part.error();
      out.insert(out.end(), part->begin(), part->end());
      done += n;
    }
    return out;
  };
}

CaptureInputs::GuestMemoryDumper LibvirtDomainBackend::guest_memory_dumper() {
  // libvirtd writes the file itself, into the capture's directory.
  return [domain = domain_](const std::filesystem::path& dir) -> Result<std::filesystem::path> {
    const std::filesystem::path path = dir / "vmcore.tmp.libvirt";
    if (Status s = domain->DumpMemory(path); !s.ok()) return s.error();
    return path;
  };
}

void LibvirtDomainBackend::RefreshMetaSocket() {
  if (!meta_link_) return;
  Result<std::string> xml = domain_->LiveXml();
  Result<DomainXmlInfo> info = xml.ok() ? ParseDomainXml(*xml) : Result<DomainXmlInfo>(xml.error());
  if (!info.ok()) return;  // The receiver keeps trying the path it had.
  // The path is libvirt's, in QEMU's mount namespace (libvirt may give QEMU
  // its own, and a libvirtd may run in one): reach it through QEMU's root.
  MetaSocketTarget target{info->meta_channel_path, -1};
  if (Result<DomainQemu> qemu = domain_->Qemu(); qemu.ok() && !target.path.empty()) {
    target.path = "/proc/" + std::to_string(qemu->pid) + "/root" + target.path;
    target.peer_pid = qemu->pid;
  }
  std::lock_guard lock(meta_link_->mu);
  meta_link_->target = std::move(target);
}

void LibvirtDomainBackend::OpenBootRangeOfThisRun() {
  RefreshMetaSocket();
  LibvirtRegionSpec range;
  {
    std::lock_guard lock(mu_);
    range = region_;
  }
  range.path.clear();
  range.owner_uid.reset();
  range.qemu_pid = -1;
  Result<LibvirtRegionSpec> located = LocateBootRangeFile(domain_->name(), range, domain_->Qemu());
  Result<int> opened =
      located.ok() ? OpenRegionFile(domain_->name(), *located) : Result<int>(located.error());
  VmEventSink* sink;
  {
    std::lock_guard lock(mu_);
    sink = sink_;
    if (opened.ok()) {
      region_ = *located;
      fd_ = OwnFile(*opened, region_);  // The last run's closes with its last capture.
      region_error_.clear();
    } else {
      fd_ = nullptr;  // Never the last run's bytes for this run's panic.
      region_error_ = opened.error().message;
    }
  }
  if (sink) {
    sink->OnVmEvent(VmEvent{opened.ok() ? "HVTRACE_BOOT_RANGE_OPENED" : "HVTRACE_BOOT_RANGE_ERROR",
                            opened.ok() ? json{{"path", located->path.string()}}
                                        : json{{"error", opened.error().message}},
                            HostTime::Now()});
  }
}

void LibvirtDomainBackend::AdoptAttachedRegion(std::shared_ptr<LiveRegion> region,
                                               const std::string& shm_name) {
  attach_.Adopt(std::move(region), LibvirtRegionTransport::DeviceFor(shm_name));
}

}  // namespace hvtrace::hostd
