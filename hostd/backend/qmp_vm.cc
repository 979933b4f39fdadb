#include "qmp_vm.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "hvtrace/boot_map.h"
#include "units.h"

namespace hvtrace::hostd {
namespace {

using nlohmann::json;

constexpr auto kQmpConnectTimeout = std::chrono::seconds(10);
constexpr auto kQmpCommandTimeout = std::chrono::seconds(5);

VmEvent ToVmEvent(const QmpEvent& e) {
  json data = e.data.is_object() ? e.data : json::object();
  // QEMU's own stamp (host wall clock at emission) beside our receipt time.
  data["qemu_timestamp_us"] = e.qemu_seconds * 1000000 + e.qemu_microseconds;
  return VmEvent{e.name, std::move(data), HostTime::Now()};
}

}  // namespace

json QmpVmSpec::ToJson() const {
  return {{"qmp_socket", qmp_socket},         {"region_path", region_path.string()},
          {"region_offset", region_offset},   {"region_size", region_size},
          {"region_gpa", region_gpa},         {"pid", pid},
          {"pid_start_time", pid_start_time}, {"console_socket", console_socket},
          {"owned_paths", owned_paths},       {"exited", exited},
          {"console_log", console_log},       {"booted_by_daemon", booted_by_daemon},
          {"kernel_path", kernel_path},       {"kernel_key", kernel_key},
          {"attach_region", attach_region},   {"attach_device", attach_device},
          {"attach_memdev", attach_memdev},   {"attach_only", region_size == 0},
          {"initrd_path", initrd_path}};
}

Result<QmpVmSpec> QmpVmSpec::FromJson(const json& j) {
  try {
    QmpVmSpec s;
    s.qmp_socket = j.at("qmp_socket").get<std::string>();
    // A VM adopted without a boot range (for `hvtrace attach`) says so; every
    // other spec must describe its boot range.
    const bool attach_only = j.value("attach_only", false);
    s.region_path = attach_only ? j.value("region_path", std::string())
                                : j.at("region_path").get<std::string>();
    s.region_offset =
        attach_only ? j.value("region_offset", uint64_t{0}) : j.at("region_offset").get<uint64_t>();
    s.region_size =
        attach_only ? j.value("region_size", uint64_t{0}) : j.at("region_size").get<uint64_t>();
    s.region_gpa = j.value("region_gpa", uint64_t{0});
    s.pid = j.value("pid", -1);
    s.pid_start_time = j.value("pid_start_time", uint64_t{0});
    s.console_socket = j.value("console_socket", std::string());
    s.owned_paths = j.value("owned_paths", std::vector<std::string>());
    s.exited = j.value("exited", false);
    s.console_log = j.value("console_log", std::string());
    s.booted_by_daemon = j.value("booted_by_daemon", false);
    s.kernel_path = j.value("kernel_path", std::string());
    s.kernel_key = j.value("kernel_key", std::string());
    s.initrd_path = j.value("initrd_path", std::string());
    s.attach_region = j.value("attach_region", std::string());
    s.attach_device = j.value("attach_device", std::string());
    s.attach_memdev = j.value("attach_memdev", std::string());
    if (s.qmp_socket.empty() ||
        (attach_only ? s.region_size != 0 : (s.region_path.empty() || s.region_size == 0))) {
      return Error{"QMP VM spec lacks a socket, region path or size"};
    }
    return s;
  } catch (const std::exception& e) {
    return Error{std::string("bad QMP VM spec: ") + e.what()};
  }
}

Result<QmpVmSpec> ParseBootRegion(std::string_view text) {
  const std::string usage = "boot region '" + std::string(text) + "' is not FILE@GPA:SIZE";
  size_t at = text.rfind('@');
  if (at == std::string_view::npos || at == 0) return Error{usage};
  size_t colon = text.find(':', at);
  if (colon == std::string_view::npos) return Error{usage};
  auto gpa = ParseKernelSize(text.substr(at + 1, colon - at - 1));
  if (!gpa.ok()) return Error{usage + ": GPA: " + gpa.error().message};
  auto size = ParseKernelSize(text.substr(colon + 1));
  if (!size.ok()) return Error{usage + ": SIZE: " + size.error().message};
  if (*size == 0 || *size % 4096 != 0)
    return Error{usage + ": SIZE must be a non-zero multiple of 4 KiB"};
  QmpVmSpec spec;
  spec.region_path = std::filesystem::absolute(std::string(text.substr(0, at)));
  spec.region_gpa = *gpa;
  spec.region_size = *size;
  return spec;
}

std::filesystem::path QmpVmSpecPath(const std::filesystem::path& vm_dir) {
  return vm_dir / "qmp_vm.json";
}

Status SaveQmpVmSpec(const std::filesystem::path& vm_dir, const QmpVmSpec& spec) {
  std::filesystem::path path = QmpVmSpecPath(vm_dir);
  std::filesystem::path tmp = path.string() + ".tmp";
  std::error_code ec;
  std::filesystem::create_directories(vm_dir, ec);
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << spec.ToJson().dump(2) << "\n";
    if (!out.flush()) return Error{"cannot write " + tmp.string()};
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    return Error{"cannot rename " + tmp.string() + " to " + path.string() + ": " + ec.message()};
  return {};
}

Result<QmpVmSpec> LoadQmpVmSpec(const std::filesystem::path& vm_dir) {
  std::filesystem::path path = QmpVmSpecPath(vm_dir);
  std::ifstream in(path);
  if (!in) return Error{"no QMP VM spec at " + path.string()};
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Error{path.string() + " is not a JSON object"};
  auto spec = QmpVmSpec::FromJson(j);
  if (!spec.ok()) return Error{path.string() + ": " + spec.error().message};
  return spec;
}

QmpVmBackend::QmpVmBackend(boost::asio::any_io_executor io, QmpVmSpec spec, std::unique_ptr<Vm> vm,
                           std::filesystem::path spec_dir)
    : io_(std::move(io)),
      spec_(std::move(spec)),
      vm_(std::move(vm)),
      spec_dir_(std::move(spec_dir)),
      attach_spec_(spec_) {}

QmpVmBackend::~QmpVmBackend() {
  life_.reset();
  Stop();
  if (region_fd_ >= 0) ::close(region_fd_);
}

void QmpVmBackend::Start(VmEventSink& sink) {
  {
    std::lock_guard lock(mu_);
    sink_ = &sink;
  }
  if (spec_.region_size > 0) {
    region_fd_ = ::open(spec_.region_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (region_fd_ < 0) {
      throw std::runtime_error("cannot open region " + spec_.region_path.string() + ": " +
                               std::strerror(errno));
    }
  }
  if (!spec_.attach_region.empty()) {
    // A daemon restarted while a region was plugged: map it again.
    auto region = LiveRegion::OpenExisting(spec_.attach_region);
    std::lock_guard lock(mu_);
    if (region.ok()) {
      live_region_ = *region;
      attached_ = true;
    } else {
      attach_spec_.attach_region.clear();
      attach_info_ = {{"error", region.error().message}};
    }
  }
  qmp_ = QmpClient::Create(io_);
  qmp_->SetEventHandler([this](const QmpEvent& e) {
    if (e.name == "DEVICE_DELETED" && e.data.is_object()) {
      OnDeviceDeleted(e.data.value("device", std::string()));
    }
    std::lock_guard lock(mu_);
    last_qmp_event_ = e.name;
    if (sink_) sink_->OnVmEvent(ToVmEvent(e));
  });
  qmp_->SetDisconnectHandler([this](const Error& error) {
    std::lock_guard lock(mu_);
    connected_ = false;
    if (sink_) sink_->OnVmGone("QMP " + spec_.qmp_socket + ": " + error.message);
  });
  qmp_->AsyncConnect(spec_.qmp_socket, kQmpConnectTimeout, [this](Status s) {
    std::lock_guard lock(mu_);
    if (!sink_) return;
    if (!s.ok()) {
      sink_->OnVmGone("QMP " + spec_.qmp_socket + ": " + s.error().message);
      return;
    }
    connected_ = true;
    // A synthetic event on the same timeline: when the watch began.
    const HostTime watch_began = HostTime::Now();
    sink_->OnVmEvent(VmEvent{"HVTRACE_QMP_CONNECTED", {{"socket", spec_.qmp_socket}}, watch_began});
    CheckStatusAtConnect(watch_began);
  });
}

void QmpVmBackend::CheckStatusAtConnect(const HostTime& watch_began) {
  qmp_->AsyncExecute(
      "query-status", json::object(), kQmpCommandTimeout, [this, watch_began](Result<json> r) {
        std::lock_guard lock(mu_);
        if (!sink_) return;
        if (!r.ok() || !r->is_object() || !r->contains("status") || !(*r)["status"].is_string()) {
          sink_->OnVmEvent(VmEvent{
              "HVTRACE_STATUS_UNKNOWN",
              {{"error", r.ok() ? "query-status returned " + r->dump() : r.error().message}},
              HostTime::Now()});
          return;
        }
        const std::string status = (*r)["status"].get<std::string>();
        const char* name = status == "guest-panicked" ? kEventFoundPanicked
                           : status == "paused"       ? kEventFoundPaused
                                                      : nullptr;
        if (name == nullptr) return;
        // Honest about timing: QEMU does not say when the guest stopped, only
        // that it did before this watch began.
        sink_->OnVmEvent(VmEvent{
            name,
            {{"status", status},
             {"watch_began_monotonic_ns", watch_began.monotonic_ns},
             {"note",
              "the VM was already " + status +
                  " when hvtraced connected (it stopped while no daemon watched it); the real "
                  "time of the panic/stop is unknown, only that it came before the watch began; "
                  "trigger_to_disk_ms counts from when hvtraced found it"}},
            HostTime::Now()});
      });
}

void QmpVmBackend::Stop() {
  {
    std::lock_guard lock(mu_);
    sink_ = nullptr;
    // A region no device uses any more (unplugged, or QEMU gone) is ours to
    // remove; the mapping keeps it readable until the backend goes. One
    // still plugged stays: QEMU and the guest use it.
    if (live_region_ && (!attached_ || !connected_)) {
      std::error_code ec;
      std::filesystem::remove(live_region_->path(), ec);
    }
  }
  if (qmp_) qmp_->Close();
  if (vm_) {
    (void)vm_->Stop(nullptr, std::chrono::seconds(2));
    vm_.reset();
  }
}

void QmpVmBackend::Release() {
  {
    std::lock_guard lock(mu_);
    sink_ = nullptr;
  }
  if (qmp_) qmp_->Close();
  if (vm_) {
    vm_->Release();
    vm_.reset();
  }
}

void QmpVmBackend::Quit() {
  if (vm_) {
    vm_->Kill();
    return;
  }
  if (qmp_) qmp_->AsyncExecute("quit", json::object(), kQmpCommandTimeout, [](Result<json>) {});
}

Result<CaptureInputs> QmpVmBackend::PrepareCapture() {
  CaptureInputs in;
  if (spec_.region_size > 0) {
    in.region_file = RegionFileSource{region_fd_,        spec_.region_path, spec_.region_offset,
                                      spec_.region_size, spec_.region_gpa,  true,
                                      spec_.kernel_path, spec_.kernel_key};
  }
  in.attach = live_region();
  std::lock_guard lock(mu_);
  in.transport = {{"kind", "qmp"},
                  {"socket", spec_.qmp_socket},
                  {"pid", vm_ ? vm_->pid() : spec_.pid},
                  {"booted_by_daemon", spec_.booted_by_daemon},
                  {"connected_at_capture", connected_}};
  return in;
}

void QmpVmBackend::ApplyPanicPolicy(PanicPolicy policy) {
  if (!qmp_ || policy == PanicPolicy::kPause) return;
  qmp_->AsyncExecute(policy == PanicPolicy::kResume ? "cont" : "quit", json::object(),
                     kQmpCommandTimeout, [](Result<json>) {});
}

json QmpVmBackend::Describe() const {
  json j = spec_.ToJson();
  if (vm_) j["pid"] = vm_->pid();
  std::lock_guard lock(mu_);
  j["qmp_connected"] = connected_;
  return j;
}

// ---- Attach mode -----------------------------------------------------------

namespace {

constexpr auto kAttachConnectWait = std::chrono::seconds(10);
constexpr auto kAgentPoll = std::chrono::milliseconds(50);
// QEMU's ids for a pcie-root-port (Red Hat's PCI vendor, device 0x000c).
constexpr uint64_t kRootPortVendor = 0x1b36;
constexpr uint64_t kRootPortDevice = 0x000c;

double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// A free pcie-root-port of a q35 VM (query-pci), with the size of its
// 64-bit prefetchable window (0 when the firmware gave it none).
struct RootPort {
  std::string id;
  uint64_t pref_window = 0;
};

void FindRootPorts(const json& devices, std::vector<RootPort>* free_ports, int* busy_ports) {
  if (!devices.is_array()) return;
  for (const json& d : devices) {
    if (!d.is_object()) continue;
    const json* bridge = d.contains("pci_bridge") ? &d["pci_bridge"] : nullptr;
    const json id = d.value("id", json::object());
    const bool root_port = id.is_object() && id.value("vendor", uint64_t{0}) == kRootPortVendor &&
                           id.value("device", uint64_t{0}) == kRootPortDevice;
    if (bridge && bridge->is_object()) {
      const json children = bridge->value("devices", json::array());
      if (root_port) {
        if (children.is_array() && !children.empty()) {
          ++*busy_ports;
        } else {
          RootPort p;
          p.id = d.value("qdev_id", std::string());
          const json range = bridge->value("/bus/prefetchable_range"_json_pointer, json::object());
          if (range.is_object()) {
            const uint64_t base = range.value("base", uint64_t{0});
            const uint64_t limit = range.value("limit", uint64_t{0});
            if (limit > base) p.pref_window = limit - base + 1;
          }
          free_ports->push_back(p);
        }
      }
      FindRootPorts(children, free_ports, busy_ports);
    }
  }
}

}  // namespace

struct QmpVmBackend::AttachJob {
  AttachOptions options;
  AttachDone done;
  std::weak_ptr<int> life;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::string machine;
  std::string bus;  // q35: the root port's id.
  uint32_t cpus = 1;
  std::shared_ptr<LiveRegion> region;
  std::string memdev, device;
  double plug_ms = 0;
  std::chrono::steady_clock::time_point plugged;
  std::shared_ptr<boost::asio::steady_timer> timer;
};

std::shared_ptr<LiveRegion> QmpVmBackend::live_region() const {
  std::lock_guard lock(mu_);
  return live_region_;
}

nlohmann::json QmpVmBackend::AttachStatus() const {
  std::lock_guard lock(mu_);
  if (!live_region_ && attach_info_.is_null()) return nullptr;
  json j = {{"attached", attached_},
            {"busy", attach_busy_},
            {"region", live_region_ ? json(live_region_->path().string()) : json(nullptr)},
            {"last", attach_info_}};
  return j;
}

void QmpVmBackend::SaveAttachSpec() {
  // Caller holds mu_.
  if (spec_dir_.empty()) return;
  (void)SaveQmpVmSpec(spec_dir_, attach_spec_);
}

void QmpVmBackend::Attach(const AttachOptions& options, AttachDone done) {
  {
    std::lock_guard lock(mu_);
    if (attach_busy_) {
      done(Error{"an attach or detach is already under way"});
      return;
    }
    if (attached_ && live_region_) {
      done(Error{"region " + live_region_->path().string() +
                 " is already attached; `hvtrace detach` first"});
      return;
    }
    attach_busy_ = true;
  }
  auto job = std::make_shared<AttachJob>();
  job->options = options;
  job->done = std::move(done);
  job->life = life_;
  job->timer = std::make_shared<boost::asio::steady_timer>(io_);
  boost::asio::post(io_, [this, job] {
    if (job->life.expired()) return;
    AttachWhenConnected(job);
  });
}

void QmpVmBackend::AttachFinish(std::shared_ptr<AttachJob> job, Result<json> result) {
  {
    std::lock_guard lock(mu_);
    attach_busy_ = false;
    attach_info_ = result.ok() ? *result : json{{"error", result.error().message}};
  }
  AttachDone done = std::move(job->done);
  if (done) done(std::move(result));
}

void QmpVmBackend::AttachWhenConnected(std::shared_ptr<AttachJob> job) {
  bool connected;
  {
    std::lock_guard lock(mu_);
    connected = connected_;
  }
  if (connected) {
    AttachCheckMachine(job);
    return;
  }
  if (std::chrono::steady_clock::now() - job->start > kAttachConnectWait) {
    AttachFinish(job, Error{"QMP " + spec_.qmp_socket +
                            " is not connected (is QEMU running, and is no "
                            "other client holding its one QMP connection?)"});
    return;
  }
  job->timer->expires_after(std::chrono::milliseconds(100));
  job->timer->async_wait([this, job](const boost::system::error_code& ec) {
    if (ec || job->life.expired()) return;
    AttachWhenConnected(job);
  });
}

void QmpVmBackend::AttachCheckMachine(std::shared_ptr<AttachJob> job) {
  // Every QOM object has a "type" property: the machine's names its board
  // (pc-i440fx-7.2-machine, pc-q35-7.2-machine, ...).
  qmp_->AsyncExecute(
      "qom-get", {{"path", "/machine"}, {"property", "type"}}, kQmpCommandTimeout,
      [this, job](Result<json> type) {
        if (job->life.expired()) return;
        if (!type.ok()) {
          AttachFinish(job, Error{"cannot read the machine type: " + type.error().message});
          return;
        }
        job->machine = type->is_string() ? type->get<std::string>() : type->dump();
        auto count_cpus = [this, job] {
          qmp_->AsyncExecute("query-cpus-fast", json::object(), kQmpCommandTimeout,
                             [this, job](Result<json> cpus) {
                               if (job->life.expired()) return;
                               if (cpus.ok() && cpus->is_array() && !cpus->empty())
                                 job->cpus = static_cast<uint32_t>(cpus->size());
                               AttachPlug(job);
                             });
        };
        if (job->machine.find("q35") == std::string::npos) {
          count_cpus();
          return;
        }
        // q35: pcie.0 takes no hot-plug; the device needs a free root port whose
        // firmware-assigned 64-bit prefetchable window holds the BAR, or the
        // guest "can't assign; no space" while device_add still answers {}.
        qmp_->AsyncExecute(
            "query-pci", json::object(), kQmpCommandTimeout,
            [this, job, count_cpus](Result<json> pci) {
              if (job->life.expired()) return;
              if (!pci.ok()) {
                AttachFinish(job,
                             Error{"q35 machine: cannot list PCI devices: " + pci.error().message});
                return;
              }
              std::vector<RootPort> ports;
              int busy = 0;
              if (pci->is_array()) {
                for (const json& bus : *pci) {
                  if (bus.is_object())
                    FindRootPorts(bus.value("devices", json::array()), &ports, &busy);
                }
              }
              const uint64_t need = job->options.size_bytes;
              std::string seen;
              for (const RootPort& p : ports) {
                seen += (seen.empty() ? "" : ", ") +
                        (p.id.empty() ? std::string("(no id)") : p.id) + " window " +
                        (p.pref_window ? SizeText(p.pref_window) : std::string("none"));
                if (!p.id.empty() && p.pref_window >= need) {
                  job->bus = p.id;
                  break;
                }
              }
              if (job->bus.empty()) {
                AttachFinish(
                    job,
                    Error{"machine " + job->machine +
                          " (q35) has no free pcie-root-port with a 64-bit prefetchable "
                          "window of " +
                          SizeText(need) +
                          " for the region (free ports: " + (seen.empty() ? "none" : seen) +
                          "; ports in use: " + std::to_string(busy) +
                          "). Start QEMU with a spare port, e.g. "
                          "-device "
                          "pcie-root-port,id=hvtrace-rp0,bus=pcie.0,chassis=9,pref64-reserve=" +
                          SizeText(need) + ", or use the pc machine type"});
                return;
              }
              count_cpus();
            });
      });
}

void QmpVmBackend::AttachPlug(std::shared_ptr<AttachJob> job) {
  LiveRegionOptions ro;
  ro.path = job->options.region_path;
  ro.size_bytes = job->options.size_bytes;
  ro.max_cpus = job->cpus;
  ro.events = job->options.events;
  ro.pump_interval_ms = job->options.pump_interval_ms;
  ro.replace_existing = true;  // Only ever our own file for this VM.
  auto region = LiveRegion::Create(ro);
  if (!region.ok()) {
    AttachFinish(job, region.error());
    return;
  }
  job->region = *region;
  const std::string tag = Hex(job->region->geometry().region_id).substr(0, 8);
  job->memdev = "hvtrace-mem-" + tag;
  job->device = "hvtrace-ivs-" + tag;
  const std::string path = job->region->path().string();
  auto abandon = [this, job, path](const std::string& message) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
    AttachFinish(job, Error{message});
  };
  json memdev = {{"qom-type", "memory-backend-file"},
                 {"id", job->memdev},
                 {"mem-path", path},
                 {"size", job->options.size_bytes},
                 {"share", true}};
  qmp_->AsyncExecute(
      "object-add", memdev, kQmpCommandTimeout, [this, job, abandon](Result<json> added) {
        if (job->life.expired()) return;
        if (!added.ok()) {
          abandon("object-add " + job->memdev + ": " + added.error().message);
          return;
        }
        json dev = {{"driver", "ivshmem-plain"}, {"memdev", job->memdev}, {"id", job->device}};
        if (!job->bus.empty()) dev["bus"] = job->bus;
        qmp_->AsyncExecute(
            "device_add", dev, kQmpCommandTimeout, [this, job, abandon](Result<json> plugged) {
              if (job->life.expired()) return;
              if (!plugged.ok()) {
                qmp_->AsyncExecute("object-del", {{"id", job->memdev}}, kQmpCommandTimeout,
                                   [](Result<json>) {});
                abandon("device_add " + job->device + ": " + plugged.error().message);
                return;
              }
              job->plug_ms = MsSince(job->start);
              job->plugged = std::chrono::steady_clock::now();
              {
                std::lock_guard lock(mu_);
                live_region_ = job->region;
                attached_ = true;
                attach_spec_.attach_region = job->region->path().string();
                attach_spec_.attach_device = job->device;
                attach_spec_.attach_memdev = job->memdev;
                SaveAttachSpec();
              }
              AttachAwaitAgent(job);
            });
      });
}

void QmpVmBackend::AttachAwaitAgent(std::shared_ptr<AttachJob> job) {
  auto snapshot = job->region->Snapshot();
  const bool announced = snapshot.ok() && snapshot->guest.present &&
                         snapshot->guest.status.state == region::kStateRunning;
  const bool timed_out = std::chrono::steady_clock::now() - job->plugged >= job->options.wait;
  if (!announced && !timed_out) {
    job->timer->expires_after(kAgentPoll);
    job->timer->async_wait([this, job](const boost::system::error_code& ec) {
      if (ec || job->life.expired()) return;
      AttachAwaitAgent(job);
    });
    return;
  }
  json reply = {{"region",
                 {{"file", job->region->path().string()},
                  {"size", job->region->size()},
                  {"region_id", Hex(job->region->geometry().region_id)}}},
                {"device", {{"id", job->device}, {"memdev", job->memdev}}},
                {"machine", job->machine},
                {"plug_ms", job->plug_ms}};
  if (!job->bus.empty()) reply["device"]["bus"] = job->bus;
  if (announced) {
    reply["announce_ms"] = MsSince(job->plugged);
    reply["guest"] = AttachGuestJson(snapshot->guest);
  } else {
    reply["guest"] = nullptr;
    reply["note"] =
        "no hvtrace-agent announced itself within " + std::to_string(job->options.wait.count()) +
        " ms; the region stays plugged (start hvtrace-agent in the guest; `hvtrace status` "
        "shows it later)";
  }
  AttachFinish(job, reply);
}

void QmpVmBackend::Detach(std::chrono::milliseconds timeout, AttachDone done) {
  std::string device, memdev;
  {
    std::lock_guard lock(mu_);
    if (attach_busy_) {
      done(Error{"an attach or detach is already under way"});
      return;
    }
    if (!attached_ || !live_region_) {
      done(Error{"no region is attached"});
      return;
    }
    attach_busy_ = true;
    device = attach_spec_.attach_device;
    memdev = attach_spec_.attach_memdev;
    PendingDetach pending;
    pending.device = device;
    pending.memdev = memdev;
    pending.done = std::move(done);
    pending.start = std::chrono::steady_clock::now();
    pending.timer = std::make_shared<boost::asio::steady_timer>(io_);
    pending.timer->expires_after(timeout);
    std::weak_ptr<int> life = life_;
    pending.timer->async_wait([this, life, device, timeout](const boost::system::error_code& ec) {
      if (ec || life.expired()) return;
      AttachDone late;
      {
        std::lock_guard inner(mu_);
        if (!detach_ || detach_->device != device) return;
        late = std::move(detach_->done);
        detach_.reset();
        attach_busy_ = false;
      }
      late(Error{"no DEVICE_DELETED for " + device + " within " + std::to_string(timeout.count()) +
                 " ms: the guest did not release the device (no ACPI PCI hot-plug in the guest?); "
                 "it stays plugged"});
    });
    detach_ = std::move(pending);
  }
  std::weak_ptr<int> life = life_;
  qmp_->AsyncExecute("device_del", {{"id", device}}, kQmpCommandTimeout,
                     [this, life, device](Result<json> r) {
                       if (life.expired() || r.ok()) return;
                       AttachDone failed;
                       {
                         std::lock_guard lock(mu_);
                         if (!detach_ || detach_->device != device) return;
                         detach_->timer->cancel();
                         failed = std::move(detach_->done);
                         detach_.reset();
                         attach_busy_ = false;
                       }
                       failed(Error{"device_del " + device + ": " + r.error().message});
                     });
}

void QmpVmBackend::OnDeviceDeleted(const std::string& device) {
  std::optional<PendingDetach> pending;
  std::shared_ptr<LiveRegion> region;
  std::string memdev;
  {
    std::lock_guard lock(mu_);
    if (device.empty() || device != attach_spec_.attach_device) return;
    // Ours, asked for or not (a guest may eject it): the device is gone.
    attached_ = false;
    region = live_region_;
    memdev = attach_spec_.attach_memdev;
    attach_spec_.attach_region.clear();
    attach_spec_.attach_device.clear();
    attach_spec_.attach_memdev.clear();
    SaveAttachSpec();
    if (detach_ && detach_->device == device) {
      pending = std::move(detach_);
      detach_.reset();
      pending->timer->cancel();
    }
  }
  if (region) region->MarkDetached();
  const double deleted_ms = pending ? MsSince(pending->start) : 0;
  std::weak_ptr<int> life = life_;
  // Only now does QEMU let the backend go ("in use" before DEVICE_DELETED).
  qmp_->AsyncExecute("object-del", {{"id", memdev}}, kQmpCommandTimeout,
                     [this, life, pending = std::move(pending), region, device, memdev,
                      deleted_ms](Result<json> r) mutable {
                       if (life.expired()) return;
                       {
                         std::lock_guard lock(mu_);
                         if (pending) attach_busy_ = false;
                       }
                       if (!pending || !pending->done) return;
                       json reply = {{"detached", true},
                                     {"device", device},
                                     {"device_deleted_ms", deleted_ms},
                                     {"region",
                                      {{"file", region ? region->path().string() : std::string()},
                                       {"kept_open", true}}}};
                       if (!r.ok()) reply["object_del_error"] = memdev + ": " + r.error().message;
                       pending->done(reply);
                     });
}

}  // namespace hvtrace::hostd
