#pragma GCC diagnostic ignored "-Wnull-dereference"  // Asio internals under GCC 12 (see daemon.cc).
#include "qmp_vm.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

#include "hvtrace/boot_map.h"
#include "libvirt_backend.h"  // ParseKernelSize.

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
  return {{"qmp_socket", qmp_socket},     {"region_path", region_path.string()},
          {"region_offset", region_offset}, {"region_size", region_size},
          {"region_gpa", region_gpa},     {"pid", pid},
          {"pid_start_time", pid_start_time}, {"console_socket", console_socket},
          {"owned_paths", owned_paths},   {"exited", exited},
          {"console_log", console_log},   {"booted_by_daemon", booted_by_daemon},
          {"kernel_path", kernel_path},   {"kernel_key", kernel_key}};
}

Result<QmpVmSpec> QmpVmSpec::FromJson(const json& j) {
  try {
    QmpVmSpec s;
    s.qmp_socket = j.at("qmp_socket").get<std::string>();
    s.region_path = j.at("region_path").get<std::string>();
    s.region_offset = j.at("region_offset").get<uint64_t>();
    s.region_size = j.at("region_size").get<uint64_t>();
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
    if (s.qmp_socket.empty() || s.region_path.empty() || s.region_size == 0) {
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
  if (*size == 0 || *size % 4096 != 0) return Error{usage + ": SIZE must be a non-zero multiple of 4 KiB"};
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
  if (ec) return Error{"cannot rename " + tmp.string() + " to " + path.string() + ": " + ec.message()};
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

QmpVmBackend::QmpVmBackend(boost::asio::any_io_executor io, QmpVmSpec spec, std::unique_ptr<Vm> vm)
    : io_(std::move(io)), spec_(std::move(spec)), vm_(std::move(vm)) {}

QmpVmBackend::~QmpVmBackend() {
  Stop();
  if (region_fd_ >= 0) ::close(region_fd_);
}

void QmpVmBackend::Start(VmEventSink& sink) {
  {
    std::lock_guard lock(mu_);
    sink_ = &sink;
  }
  region_fd_ = ::open(spec_.region_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (region_fd_ < 0) {
    throw std::runtime_error("cannot open region " + spec_.region_path.string() + ": " +
                             std::strerror(errno));
  }
  qmp_ = QmpClient::Create(io_);
  qmp_->SetEventHandler([this](const QmpEvent& e) {
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
  qmp_->AsyncExecute("query-status", json::object(), kQmpCommandTimeout, [this, watch_began](Result<json> r) {
    std::lock_guard lock(mu_);
    if (!sink_) return;
    if (!r.ok() || !r->is_object() || !r->contains("status") || !(*r)["status"].is_string()) {
      sink_->OnVmEvent(VmEvent{"HVTRACE_STATUS_UNKNOWN",
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
         {"note", "the VM was already " + status +
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

Status QmpVmBackend::Capture(PendingCapture& capture, CaptureManifest& manifest) {
  const auto copy_start = std::chrono::steady_clock::now();
  if (region_fd_ < 0) return Error{"region " + spec_.region_path.string() + " is not open"};
  std::vector<std::byte> bytes(spec_.region_size);
  uint64_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::pread(region_fd_, bytes.data() + done, bytes.size() - done,
                        static_cast<off_t>(spec_.region_offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return Error{"reading region " + spec_.region_path.string() + " at offset " +
                   std::to_string(spec_.region_offset + done) + ": " + std::strerror(errno)};
    }
    if (n == 0) {
      return Error{"region " + spec_.region_path.string() + " ends at offset " +
                   std::to_string(spec_.region_offset + done) + ", before the configured size " +
                   std::to_string(spec_.region_size)};
    }
    done += static_cast<uint64_t>(n);
  }
  const auto copied = std::chrono::steady_clock::now();
  // The raw copy goes to disk (fsynced) first: everything else can be redone
  // from it.
  if (Status s = capture.WriteFile("region.bin", bytes); !s.ok()) return s;
  const auto written = std::chrono::steady_clock::now();

  const bool exact = manifest.trigger == "panic" || manifest.trigger == "qemu-gone" ||
                     manifest.trigger == "shutdown";
  json consistency = {
      {"vm_paused", manifest.trigger == "panic"},
      {"note", exact ? "vCPUs were stopped (or QEMU gone) while copying: the copy is exact"
                     : "the guest kept running while copying: each page was copied once; the "
                       "head/commit pages listed per CPU may have been written during the copy"}};
  BootMapOptions options;
  options.layout = PageLayout::Default();
  Result<BootMap> map = ReadBootMap(bytes, options);
  json pages_in_flight = json::array();
  if (map.ok()) {
    json issues = json::array();
    for (const BootMapIssue& issue : map->issues) {
      if (issues.size() < 64) issues.push_back(issue.message);
    }
    manifest.validation = {{"reader", "boot_map"},      {"layout", map->layout},
                           {"cpus", map->cpus},          {"boots", map->boots},
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
      pages_in_flight.push_back(
          {{"cpu", cpu.cpu}, {"head_slot", cpu.head_slot}, {"commit_slot", cpu.commit_slot}});
    }
  } else {
    manifest.validation = {{"reader", "boot_map"}, {"error", map.error().message}};
  }
  if (!exact) consistency["pages_being_written"] = pages_in_flight;
  if (!spec_.kernel_path.empty()) manifest.kernel["path"] = spec_.kernel_path;
  if (!spec_.kernel_key.empty()) manifest.kernel["formats_key"] = spec_.kernel_key;
  manifest.region = {{"kind", "boot-range"},
                     {"source", spec_.region_path.string()},
                     {"offset", spec_.region_offset},
                     {"size", spec_.region_size},
                     {"gpa", spec_.region_gpa}};
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  std::lock_guard lock(mu_);
  manifest.extra["qmp"] = {{"socket", spec_.qmp_socket},
                           {"pid", vm_ ? vm_->pid() : spec_.pid},
                           {"booted_by_daemon", spec_.booted_by_daemon},
                           {"connected_at_capture", connected_},
                           {"consistency", consistency},
                           {"copy_ms", ms(copy_start, copied)},
                           {"write_fsync_ms", ms(copied, written)}};
  return {};
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

}  // namespace hvtrace::hostd
