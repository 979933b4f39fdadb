#include "qmp_vm.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>

#include "capped_file.h"
#include "daemon_log.h"
#include "guest_ram_map.h"
#include "hvtrace/boot_map.h"
#include "private_path.h"
#include "qemu_user.h"
#include "region_file_open.h"
#include "units.h"
#include "vm_process.h"
#include "vm_record.h"

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
  json j = {{"qmp_socket", qmp_socket},         {"region_path", region_path.string()},
            {"region_offset", region_offset},   {"region_size", region_size},
            {"region_gpa", region_gpa},         {"pid", pid},
            {"pid_start_time", pid_start_time}, {"console_socket", console_socket},
            {"owned_paths", owned_paths},       {"exited", exited},
            {"console_log", console_log},       {"booted_by_daemon", booted_by_daemon},
            {"kernel_path", kernel_path},       {"kernel_key", kernel_key},
            {"attach_region", attach_region},   {"attach_device", attach_device},
            {"attach_memdev", attach_memdev},   {"attach_only", region_size == 0},
            {"initrd_path", initrd_path},       {"meta_socket", meta_socket},
            {"qemu_trace_log", qemu_trace_log}, {"vmcore", vmcore},
            {"memory_bytes", memory_bytes}};
  if (region_owner) j["region_owner"] = *region_owner;
  return j;
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
    s.meta_socket = j.value("meta_socket", std::string());
    s.qemu_trace_log = j.value("qemu_trace_log", std::string());
    s.vmcore = j.value("vmcore", std::string());
    s.memory_bytes = j.value("memory_bytes", uint64_t{0});
    s.attach_region = j.value("attach_region", std::string());
    s.attach_device = j.value("attach_device", std::string());
    s.attach_memdev = j.value("attach_memdev", std::string());
    if (auto owner = j.find("region_owner"); owner != j.end() && owner->is_number_unsigned()) {
      s.region_owner = owner->get<uid_t>();
    }
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
  return SaveVmRecord(QmpVmSpecPath(vm_dir), spec);
}

Result<QmpVmSpec> LoadQmpVmSpec(const std::filesystem::path& vm_dir) {
  return LoadVmRecord<QmpVmSpec>(QmpVmSpecPath(vm_dir));
}

QmpVmBackend::QmpVmBackend(boost::asio::any_io_executor io, QmpVmSpec spec, std::unique_ptr<Vm> vm,
                           std::filesystem::path spec_dir)
    : io_(std::move(io)),
      spec_(std::move(spec)),
      vm_(std::move(vm)),
      spec_dir_(std::move(spec_dir)),
      attach_spec_(spec_),
      attach_transport_(
          io_, spec_.qmp_socket,
          [this] {
            std::lock_guard lock(mu_);
            return connected_;
          },
          [this](const LiveRegion* region, const PluggedDevice* device) {
            RememberAttach(region, device);
          }),
      attach_(io_, attach_transport_) {
  attach_transport_.SetQemuPid(vm_ ? vm_->pid() : spec_.pid);
}

void QmpVmBackend::CutMemoryLink() {
  std::lock_guard lock(memory_link_->mu);
  memory_link_->qmp.reset();
  memory_link_->ram.reset();
}

QmpVmBackend::~QmpVmBackend() { Stop(); }

void QmpVmBackend::UseRegionFd(int fd) {
  auto file =
      RegionFile::Adopt(::fcntl(fd, F_DUPFD_CLOEXEC, 0), spec_.region_offset, spec_.region_size);
  std::lock_guard lock(mu_);
  region_file_ = std::move(file);
}

std::shared_ptr<const RegionFile> QmpVmBackend::region_file() const {
  std::lock_guard lock(mu_);
  return region_file_;
}

void QmpVmBackend::Start(VmEventSink& sink) {
  {
    std::lock_guard lock(mu_);
    sink_ = &sink;
  }
  if (spec_.region_size > 0 && !region_file()) {
    // Re-adoption after a restart opens the recorded path, checked as the
    // libvirt backend checks a domain's file: the owner recorded at
    // registration, and QEMU mapping it while that very QEMU still runs (a
    // QEMU that died left its bytes in the file: captured, not mapped).
    const bool same_qemu = !spec_.exited && StillRunning(spec_.pid, spec_.pid_start_time);
    Result<int> fd = OpenRegionFileChecked({.owner_label = "VM (QMP " + spec_.qmp_socket + ")",
                                            .path = spec_.region_path,
                                            .offset = spec_.region_offset,
                                            .size = spec_.region_size,
                                            .owner_uid = spec_.region_owner,
                                            .mapped_by = same_qemu ? spec_.pid : -1});
    if (!fd.ok()) throw std::runtime_error(fd.error().message);
    auto file = RegionFile::Adopt(*fd, spec_.region_offset, spec_.region_size);
    std::lock_guard lock(mu_);
    region_file_ = std::move(file);
  }
  if (!spec_.attach_region.empty()) {
    // A daemon restarted while a region was plugged: map it again.
    auto region = LiveRegion::OpenExisting(spec_.attach_region);
    if (region.ok()) {
      attach_.Adopt(*region, {spec_.attach_device, spec_.attach_memdev, {}, {}});
    } else {
      RememberAttach(nullptr, nullptr);
      attach_.AdoptFailed(region.error().message);
    }
  }
  qmp_ = QmpClient::Create(io_);
  {
    std::lock_guard lock(memory_link_->mu);
    memory_link_->qmp = qmp_;
  }
  attach_transport_.SetClient(qmp_);
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
    MapGuestRam();
    if (!spec_.qemu_trace_log.empty()) {
      trace_guard_ =
          std::make_shared<QemuTraceGuard>(io_, spec_.qemu_trace_log, kQemuTraceLogLimit,
                                           std::chrono::seconds(2), qmp_, [this](const VmEvent& e) {
                                             std::lock_guard event_lock(mu_);
                                             if (sink_) sink_->OnVmEvent(e);
                                           });
      trace_guard_->Start();
    }
  });
}

void QmpVmBackend::StopTraceGuard() {
  std::shared_ptr<QemuTraceGuard> guard;
  {
    std::lock_guard lock(mu_);
    guard = std::move(trace_guard_);
  }
  if (guard) guard->Stop();
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

void QmpVmBackend::MapGuestRam() {
  // Only a QEMU this daemon started (or took back from its own records),
  // and only while that very process answers on QMP (SO_PEERCRED): an
  // adopted VM's pid comes from a client, and the daemon would read, with
  // its own rights, whatever process that pid named.
  const pid_t pid = vm_ ? vm_->pid() : -1;
  const pid_t peer = qmp_->peer_pid();
  std::string why;
  if (pid <= 0) {
    why = "hvtraced did not start this QEMU";
  } else if (peer != pid) {
    why = "QMP is answered by pid " + std::to_string(peer) + ", not QEMU's " + std::to_string(pid);
  }
  auto done = [link = memory_link_, name = spec_.qmp_socket](auto ram) {
    std::lock_guard lock(link->mu);
    if (!link->qmp) return;  // Stopped meanwhile.
    if (ram.ok()) {
      link->ram = std::move(*ram);
      return;
    }
    link->ram_error = ram.error().message;
    Log(LogLevel::kInfo,
        "QMP " + name + ": panic captures read guest memory through QMP: " + link->ram_error);
  };
  if (!why.empty()) return done(Result<std::shared_ptr<const GuestRam>>(Error{why}));
  // The link, not |this|: the answers may come after the backend is gone.
  AsyncMapGuestRam(qmp_, pid, std::move(done));
}

std::shared_ptr<const GuestRam> QmpVmBackend::guest_ram() const {
  std::lock_guard lock(memory_link_->mu);
  return memory_link_->ram;
}

void QmpVmBackend::Stop() {
  StopTraceGuard();
  {
    std::lock_guard lock(mu_);
    sink_ = nullptr;
    // A region no device uses any more (unplugged, or QEMU gone) is ours to
    // remove; the mapping keeps it readable until the backend goes. One
    // still plugged stays: QEMU and the guest use it.
    if (auto region = attach_.region(); region && (!attach_.device() || !connected_)) {
      std::error_code ec;
      std::filesystem::remove(region->path(), ec);
    }
  }
  CutMemoryLink();
  if (qmp_) qmp_->Close();
  if (vm_) {
    StopQemu(*vm_);
    vm_.reset();
  }
}

// Said in the journal: an operator stopping the service (vm_on_shutdown =
// stop) learns what became of each QEMU, and a scope that outlives it is
// told apart from a QEMU that was never signalled.
void QmpVmBackend::StopQemu(Vm& vm) {
  const std::string which = "VM " + vm.config().name + ": QEMU pid " + std::to_string(vm.pid());
  if (!vm.Running()) {
    LogInfo(which + " had already ended (" + vm.DescribeExit() + ")");
    return;
  }
  const auto began = std::chrono::steady_clock::now();
  const Status s = vm.Stop(nullptr, std::chrono::seconds(2));
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - began)
                      .count();
  if (s.ok()) {
    LogNotice(which + " stopped in " + std::to_string(ms) + " ms (" + vm.DescribeExit() + ")");
  } else {
    LogWarning(which + ": " + s.error().message);
  }
}

void QmpVmBackend::Release() {
  StopTraceGuard();
  {
    std::lock_guard lock(mu_);
    sink_ = nullptr;
  }
  CutMemoryLink();
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

std::optional<RegionFileSource> QmpVmBackend::boot_range() const {
  if (spec_.region_size == 0) return std::nullopt;
  return RegionFileSource{region_file(),     spec_.region_path, spec_.region_offset,
                          spec_.region_size, spec_.region_gpa,  true,
                          spec_.kernel_path, spec_.kernel_key};
}

Result<CaptureInputs> QmpVmBackend::PrepareCapture() {
  CaptureInputs in;
  in.region_file = boot_range();
  in.attach = live_region();
  in.qemu_trace_log = spec_.qemu_trace_log;
  in.vmcore_bound = spec_.memory_bytes;
  std::lock_guard lock(mu_);
  in.transport = {{"kind", "qmp"},
                  {"socket", spec_.qmp_socket},
                  {"pid", vm_ ? vm_->pid() : spec_.pid},
                  {"booted_by_daemon", spec_.booted_by_daemon},
                  {"connected_at_capture", connected_}};
  return in;
}

namespace {

// A file QEMU writes by name (memsave, dump-guest-memory) at |path|, after
// any -runas: a QEMU that is not the daemon's user gets a file the daemon
// made, in the guest memory directory it may only traverse, through its
// group. Checked at each call, not when the reader is made: that can be
// before QEMU dropped root.
Status PrepareQemuTarget(const std::string& path, pid_t pid, const char* what) {
  ::unlink(path.c_str());
  std::optional<gid_t> qemu_group;
  if (auto creds = ReadProcessCredentials(pid); creds && creds->uid != ::geteuid()) {
    qemu_group = creds->gid;
  }
  if (!qemu_group) return {};
  Result<UniqueFd> target = CreateExclusiveFile(path, 0660, what);
  if (!target.ok()) return target.error();
  if (::fchown(target->get(), static_cast<uid_t>(-1), *qemu_group) != 0) {
    return Error{std::string(what) + " " + path + ": cannot give it to QEMU's group " +
                 std::to_string(*qemu_group) + ": " + std::strerror(errno)};
  }
  return {};
}

// Runs |command| on the VM's QMP session from a pool thread and waits for
// its reply (bounded by |timeout|).
template <class Link>
Result<json> ExecuteAndWait(boost::asio::any_io_executor io, std::shared_ptr<Link> link,
                            std::string command, json args, std::chrono::seconds timeout) {
  auto done = std::make_shared<std::promise<Result<json>>>();
  std::future<Result<json>> reply = done->get_future();
  boost::asio::post(io, [link, command, args = std::move(args), timeout, done] {
    std::shared_ptr<QmpClient> qmp;
    {
      std::lock_guard lock(link->mu);
      qmp = link->qmp;
    }
    if (!qmp) {
      done->set_value(Error{"no QMP session"});
      return;
    }
    qmp->AsyncExecute(command, args, timeout, [done](Result<json> r) { done->set_value(r); });
  });
  if (reply.wait_for(timeout + std::chrono::seconds(1)) != std::future_status::ready) {
    return Error{"QMP " + command + " timed out"};
  }
  Result<json> r = reply.get();
  if (!r.ok()) return Error{"QMP " + command + ": " + r.error().message};
  return r;
}

// dump-guest-memory of a 1 GiB guest under TCG takes seconds; its reply
// comes when the file is written (detach false).
constexpr auto kDumpTimeout = std::chrono::seconds(600);

}  // namespace

GuestMemoryReader QmpVmBackend::guest_memory_reader() {
  if (!spec_.booted_by_daemon || spec_.meta_socket.empty()) return nullptr;
  const std::string path = spec_.meta_socket + ".notes";
  const pid_t pid = vm_ ? vm_->pid() : spec_.pid;
  // The reader may outlive this backend (a frame still being checked on the
  // pool): it holds the link, never |this|.
  return [io = io_, link = memory_link_, path, pid](uint64_t addr,
                                                    size_t size) -> Result<std::vector<std::byte>> {
    if (Status s = PrepareQemuTarget(path, pid, "QEMU's memsave target"); !s.ok()) return s.error();
    // QEMU's "val" is a JSON int64: a kernel address above 2^63 goes as its
    // two's-complement negative (QEMU reads it as target_ulong).
    Result<json> r = ExecuteAndWait(
        io, link, "memsave",
        {{"val", static_cast<int64_t>(addr)}, {"size", size}, {"filename", path}, {"cpu-index", 0}},
        std::chrono::duration_cast<std::chrono::seconds>(kQmpCommandTimeout));
    if (!r.ok()) return r.error();
    Result<std::vector<std::byte>> bytes = ReadCappedFileBytes(path, size);
    ::unlink(path.c_str());
    return bytes;
  };
}

CaptureInputs::GuestMemoryDumper QmpVmBackend::guest_memory_dumper() {
  if (!spec_.booted_by_daemon || spec_.meta_socket.empty()) return nullptr;
  const std::string path = spec_.meta_socket + ".vmcore";
  const pid_t pid = vm_ ? vm_->pid() : spec_.pid;
  // QEMU may not enter the capture's directory (the daemon's alone): it
  // writes beside the memsave target, and the capture moves the file in.
  return [io = io_, link = memory_link_, path,
          pid](const std::filesystem::path&) -> Result<std::filesystem::path> {
    if (Status s = PrepareQemuTarget(path, pid, "QEMU's dump target"); !s.ok()) return s.error();
    // kdump-zlib: what makedumpfile and crash read; paging false: physical
    // memory as the guest sees it, with the guest's VMCOREINFO note.
    Result<json> r = ExecuteAndWait(
        io, link, "dump-guest-memory",
        {{"paging", false}, {"protocol", "file:" + path}, {"format", "kdump-zlib"}}, kDumpTimeout);
    if (!r.ok()) {
      ::unlink(path.c_str());
      return r.error();
    }
    return std::filesystem::path(path);
  };
}

void QmpVmBackend::ApplyPanicPolicy(PanicPolicy policy) {
  if (!qmp_ || policy == PanicPolicy::kPause) return;
  qmp_->AsyncExecute(policy == PanicPolicy::kResume ? "cont" : "quit", json::object(),
                     kQmpCommandTimeout, [](Result<json>) {});
}

json QmpVmBackend::Describe() const {
  json j = spec_.ToJson();
  if (vm_) j["pid"] = vm_->pid();
  {
    std::lock_guard lock(memory_link_->mu);
    if (const auto& ram = memory_link_->ram) {
      uint64_t bytes = 0;
      for (const GuestRamRange& r : ram->ranges()) bytes += r.bytes;
      j["guest_ram"] = {{"ranges", ram->ranges().size()}, {"bytes", bytes}};
    } else if (!memory_link_->ram_error.empty()) {
      j["guest_ram"] = {{"error", memory_link_->ram_error}};
    }
  }
  std::lock_guard lock(mu_);
  j["qmp_connected"] = connected_;
  return j;
}

void QmpVmBackend::RememberAttach(const LiveRegion* region, const PluggedDevice* device) {
  std::lock_guard lock(mu_);
  attach_spec_.attach_region = region ? region->path().string() : std::string();
  attach_spec_.attach_device = device ? device->id : std::string();
  attach_spec_.attach_memdev = device ? device->memdev : std::string();
  if (!spec_dir_.empty()) (void)SaveQmpVmSpec(spec_dir_, attach_spec_);
}

void QmpVmBackend::OnDeviceDeleted(const std::string& device) {
  std::optional<PluggedDevice> plugged = attach_.device();
  if (!plugged || plugged->id != device || !attach_.DeviceGone(device)) return;
  attach_transport_.Unplugged(*plugged);
}

}  // namespace hvtrace::hostd
