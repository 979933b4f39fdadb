#include "libvirt_backend.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include <nlohmann/json.hpp>

#include "capture_pipeline.h"
#include "formats_cache.h"
#include "hvtrace/boot_map.h"

namespace hvtrace::hostd {

using json = nlohmann::json;

namespace {

double MsBetween(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::string StateName(int state, int reason) {
  switch (state) {
    case VIR_DOMAIN_RUNNING: return "running";
    case VIR_DOMAIN_BLOCKED: return "blocked";
    case VIR_DOMAIN_PAUSED:
      return reason == VIR_DOMAIN_PAUSED_CRASHED ? "paused (crashed)"
                                                 : "paused (reason " + std::to_string(reason) + ")";
    case VIR_DOMAIN_SHUTDOWN: return "shutting down";
    case VIR_DOMAIN_SHUTOFF:
      return reason == VIR_DOMAIN_SHUTOFF_CRASHED ? "shut off (crashed)"
             : reason == VIR_DOMAIN_SHUTOFF_DESTROYED
                 ? "shut off (destroyed)"
                 : "shut off (reason " + std::to_string(reason) + ")";
    case VIR_DOMAIN_CRASHED:
      return reason == VIR_DOMAIN_CRASHED_PANICKED ? "crashed (panicked)"
                                                   : "crashed (reason " + std::to_string(reason) + ")";
    case VIR_DOMAIN_PMSUSPENDED: return "pmsuspended";
    default: return "state " + std::to_string(state);
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

}  // namespace

Result<uint64_t> ParseKernelSize(std::string_view text) {
  std::string s(text);
  if (s.empty() || s.size() > 24) return Error{"size '" + s + "' is malformed"};
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s.c_str(), &end, 0);
  if (errno != 0 || end == s.c_str()) return Error{"size '" + s + "' is not a number"};
  int shift = 0;
  std::string suffix(end);
  if (suffix == "K" || suffix == "k") shift = 10;
  else if (suffix == "M" || suffix == "m") shift = 20;
  else if (suffix == "G" || suffix == "g") shift = 30;
  else if (!suffix.empty()) return Error{"size '" + s + "' has an unknown suffix"};
  if (shift && v > (UINT64_MAX >> shift)) return Error{"size '" + s + "' overflows"};
  return static_cast<uint64_t>(v) << shift;
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
  if (!size) return Error{ctx + "no memmap=SIZE$ADDR in the kernel command line (not made by "
                          "`hvtrace domain-xml`?)"};
  if (info.numa_cells.size() != 2 || info.numa_cells[1].mem_access != "shared") {
    return Error{ctx + "expected two NUMA cells, cell 1 with memAccess='shared'"};
  }
  const uint64_t node0 = info.numa_cells[0].memory_bytes;
  if (*gpa < node0) return Error{ctx + "the range is not in NUMA node 1"};

  // libvirt names the node-1 file itself (memory_backing_dir/…/<id>-<name>/
  // ram-node1); QEMU's command line says where.
  const std::string guest_arg = "guest=" + info.name;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::vector<std::string> args = ReadCmdline(pid);
    bool ours = false;
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == "-name" &&
          (args[i + 1] == guest_arg || args[i + 1].rfind(guest_arg + ",", 0) == 0)) {
        ours = true;
      }
    }
    if (!ours) continue;
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

Result<std::unique_ptr<LibvirtDomainBackend>> AdoptLibvirtDomain(std::shared_ptr<LibvirtClient> client,
                                                                 const std::string& domain,
                                                                 LibvirtBackendOptions options) {
  Result<LibvirtDomainPtr> dom = client->FindDomain(domain);
  if (!dom.ok()) return dom.error();
  if (virDomainIsActive(dom->get()) != 1) {
    return Error{"libvirt: domain '" + domain + "' is not running; start it first"};
  }
  Result<std::string> xml = LibvirtDomainXml(dom->get());
  if (!xml.ok()) return xml.error();
  Result<DomainXmlInfo> info = ParseDomainXml(*xml);
  if (!info.ok()) return Error{"libvirt: domain '" + domain + "': " + info.error().message};
  for (const DomainShmem& s : info->shmems) {
    if (s.alias.rfind("ua-hvtrace-", 0) == 0 && s.model == "ivshmem-plain" && s.size_bytes > 0 &&
        ValidateShmName(s.name).ok()) {
      return LibvirtDomainBackend::Create(std::move(client), domain,
                                          ShmemRegion("/dev/shm/" + s.name, s.size_bytes),
                                          std::move(options));
    }
  }
  Result<LibvirtRegionSpec> boot = FindBootRangeRegion(*info);
  if (!boot.ok()) {
    return Error{"libvirt: domain '" + domain + "' has no hvtrace shmem device (attach one) and no boot "
                 "range: " + boot.error().message};
  }
  return LibvirtDomainBackend::Create(std::move(client), domain, std::move(*boot), std::move(options));
}

Result<std::unique_ptr<LibvirtDomainBackend>> LibvirtDomainBackend::Create(
    std::shared_ptr<LibvirtClient> client, const std::string& domain, LibvirtRegionSpec region,
    LibvirtBackendOptions options) {
  Result<LibvirtDomainPtr> dom = client->FindDomain(domain);
  if (!dom.ok()) return dom.error();
  char uuid[VIR_UUID_STRING_BUFLEN] = {};
  virDomainGetUUIDString(dom->get(), uuid);
  const char* name = virDomainGetName(dom->get());
  std::string on_crash, kernel;
  if (Result<std::string> xml = LibvirtDomainXml(dom->get()); xml.ok()) {
    if (Result<DomainXmlInfo> info = ParseDomainXml(*xml); info.ok()) {
      on_crash = info->on_crash;
      kernel = info->kernel;
    }
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
  if (kernel.empty()) {
    backend->kernel_key_error_ = "the domain has no <os><kernel> (direct kernel boot) to name its formats";
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

void LibvirtDomainBackend::SetPanicHook(PanicHook hook) {
  std::lock_guard lock(mu_);
  panic_hook_ = std::move(hook);
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
    sink.OnVmEvent(VmEvent{"HVTRACE_FOUND_PANICKED",
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

Result<std::vector<std::byte>> LibvirtDomainBackend::CopyRegion() const {
  // Through our own descriptor: libvirt deletes a boot range's node-1 file
  // when the domain stops, and the open file still holds the data.
  Result<std::vector<std::byte>> copy = CopyRegionFile(
      "/proc/self/fd/" + std::to_string(fd_), region_.offset, region_.size);
  if (!copy.ok()) {
    return Error{"domain '" + name_ + "', " + region_.kind + " region " + region_.path.string() +
                 ": " + copy.error().message};
  }
  return copy;
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
  // Copy first: with <on_crash>destroy</on_crash> libvirt is killing QEMU
  // right now. The open fd keeps the data even if the file goes away.
  LibvirtPanicRecord record;
  record.event = LibvirtLifecycleName(e.event, e.detail);
  Result<std::vector<std::byte>> bytes = CopyRegion();
  record.copy_ms = MsBetween(e.received, std::chrono::steady_clock::now());
  record.state_at_copy = StateNow(&record.qemu_alive_at_copy);
  VmEventSink* sink;
  PanicHook hook;
  {
    std::lock_guard lock(mu_);
    if (bytes.ok()) record.region = std::move(*bytes);
    sink = sink_;
    hook = panic_hook_;
  }
  if (hook) hook(record);
  {
    std::lock_guard lock(mu_);
    stopped_after_panic_.reset();
    if (!record.region.empty()) pending_panic_ = std::move(record);
  }
  if (sink) {
    json data = {{"libvirt_event", LibvirtLifecycleName(e.event, e.detail)}, {"on_crash", on_crash_}};
    if (!bytes.ok()) data["copy_error"] = bytes.error().message;
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
    case Kind::kLifecycle: {
      const std::string what = LibvirtLifecycleName(e.event, e.detail);
      json data = {{"libvirt_event", what}};
      switch (e.event) {
        case VIR_DOMAIN_EVENT_CRASHED:
          OnCrash(e, e.detail == VIR_DOMAIN_EVENT_CRASHED_CRASHLOADED ? "GUEST_CRASHLOADED"
                                                                      : "GUEST_PANICKED");
          return;
        case VIR_DOMAIN_EVENT_SHUTDOWN: emit("SHUTDOWN", data); return;
        case VIR_DOMAIN_EVENT_SUSPENDED: emit("STOP", data); return;
        case VIR_DOMAIN_EVENT_RESUMED:
        case VIR_DOMAIN_EVENT_STARTED: emit("RESUME", data); return;
        case VIR_DOMAIN_EVENT_STOPPED: {
          {
            std::lock_guard lock(mu_);
            if (pending_panic_) stopped_after_panic_ = what;
          }
          sink->OnVmGone("libvirt: domain '" + name_ + "' " + what);
          return;
        }
        default: emit("LIBVIRT_" + what.substr(0, what.find('/')), data); return;
      }
    }
    case Kind::kReboot: emit("RESET", {{"libvirt_event", "REBOOT"}}); return;
    case Kind::kDeviceAdded: emit("DEVICE_ADDED", {{"device", e.device_alias}}); return;
    case Kind::kDeviceRemoved: emit("DEVICE_DELETED", {{"device", e.device_alias}}); return;
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

Status LibvirtDomainBackend::Capture(PendingCapture& capture, CaptureManifest& manifest) {
  std::optional<LibvirtPanicRecord> panic;
  std::optional<std::string> stopped;
  {
    std::lock_guard lock(mu_);
    panic = std::move(pending_panic_);
    pending_panic_.reset();
    stopped = stopped_after_panic_;
  }
  std::vector<std::byte> bytes;
  if (panic) {
    bytes = std::move(panic->region);
  } else {
    Result<std::vector<std::byte>> copy = CopyRegion();
    if (!copy.ok()) return copy.error();
    bytes = std::move(*copy);
  }
  if (region_.kind == "boot-range") {
    if (Status s = CaptureBootRange(std::move(bytes), capture, manifest); !s.ok()) return s;
  } else if (Status s = capture.WriteFile("region.bin", bytes); !s.ok()) {
    return s;
  }
  manifest.region = {{"kind", region_.kind},
                     {"source", region_.path.string()},
                     {"offset", region_.offset},
                     {"size", region_.size}};
  bool active = false;
  const std::string state = StateNow(&active);
  json lv = {{"domain", name_},     {"uuid", uuid_},          {"uri", client_->uri()},
             {"on_crash", on_crash_}, {"state_at_capture", state}};
  if (panic) {
    lv["panic"] = {{"event", panic->event},
                   {"copied_in_event_callback", true},
                   {"copy_ms_after_event", panic->copy_ms},
                   {"state_at_copy", panic->state_at_copy},
                   {"qemu_alive_at_copy", panic->qemu_alive_at_copy},
                   {"outcome", active && !stopped ? "preserved" : "destroyed"}};
    if (stopped) lv["panic"]["stopped_event"] = *stopped;
  }
  manifest.extra["libvirt"] = lv;
  return {};
}

Status LibvirtDomainBackend::CaptureBootRange(std::vector<std::byte> bytes, PendingCapture& capture,
                                              CaptureManifest& manifest) const {
  if (!kernel_path_.empty()) manifest.kernel["path"] = kernel_path_;
  std::string why_raw = kernel_key_error_;
  if (!kernel_key_.empty()) {
    why_raw = "no formats for kernel " + kernel_path_ + " (key " + kernel_key_ +
              ") in the formats cache; run `hvtrace formats harvest --kernel " + kernel_path_ + "`";
    for (const std::filesystem::path& root : options_.formats_roots) {
      FormatCache cache(root);
      Result<std::optional<json>> found = cache.Lookup(kernel_key_);
      if (!found.ok()) {
        why_raw = found.error().message;
        continue;
      }
      if (!found->has_value()) continue;
      Result<KernelFormats> formats = cache.Load(kernel_key_);
      if (!formats.ok()) {
        why_raw = formats.error().message;
        continue;
      }
      BootMapCaptureOptions options;
      Result<CaptureResult> built = BuildBootMapCapture(bytes, *formats, options, capture, manifest);
      if (built.ok()) {
        manifest.extra["formats_root"] = root.string();
        return {};
      }
      // Not decodable (the reader refused the layout): keep the raw copy.
      why_raw = built.error().message;
      break;
    }
  }
  // The raw copy and the reader's per-CPU counts; `hvtrace show --region`
  // can decode region.bin later once the formats are harvested.
  if (Status s = capture.WriteFile("region.bin", bytes); !s.ok()) return s;
  manifest.extra["decode"] = {{"trace_dat", false}, {"reason", why_raw}};
  if (!kernel_key_.empty()) manifest.kernel["formats_key"] = kernel_key_;
  BootMapOptions options;
  options.layout = PageLayout::Default();
  Result<BootMap> map = ReadBootMap(bytes, options);
  if (!map.ok()) {
    manifest.validation = {{"reader", "boot_map"}, {"error", map.error().message}};
    return {};
  }
  json issues = json::array();
  for (const BootMapIssue& issue : map->issues) {
    if (issues.size() < 64) issues.push_back(issue.message);
  }
  manifest.validation = {{"reader", "boot_map"},        {"layout", map->layout},
                         {"cpus", map->cpus},            {"boots", map->boots},
                         {"issues", map->issues.size()}, {"first_issues", issues}};
  for (const BootMapCpu& cpu : map->cpu) {
    CpuCaptureCounts counts;
    counts.cpu = cpu.cpu;
    counts.events = cpu.records.size();
    counts.pages = cpu.pages.size();
    for (const BootMapPage& page : cpu.pages) {
      if (page.error != PageError::kOk) ++counts.bad_pages["page-error"];
      if (page.skipped) ++counts.bad_pages["skipped"];
    }
    manifest.cpus.push_back(std::move(counts));
  }
  return {};
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
          {"region", {{"kind", region_.kind}, {"path", region_.path.string()},
                      {"offset", region_.offset}, {"size", region_.size}}}};
}

}  // namespace hvtrace::hostd
