// The VmBackend for QEMU guests hvtraced talks to over QMP: guests the daemon
// boots itself (`hvtrace boot`, with a host-backed boot range) and guests
// someone else launched (`hvtrace adopt NAME --qmp SOCK [--boot-region
// FILE@GPA:SIZE]`). Any of them can get an attach-mode region hot-plugged
// (`hvtrace attach`): an ivshmem-plain device backed by a file hvtraced
// creates, which the guest agent fills; a VM with both captures both.
//
// The backend keeps the VM's one QMP session on the daemon's io_context and
// forwards every event, stamped with the host time it arrived, to the
// supervisor. The region file is opened when the backend starts and kept
// open, so a capture still reads it after QEMU is gone and the file unlinked.
//
// A capture: the backend names the region file (kept open) and the
// attached region; the CaptureService copies, decodes and commits them
// (capture_service.h). After GUEST_PANICKED with -action panic=pause the
// vCPUs are stopped, so the copy is exact.
#ifndef HVTRACE_HOSTD_QMP_VM_H_
#define HVTRACE_HOSTD_QMP_VM_H_

#include <sys/types.h>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attach_session.h"
#include "hvtrace/result.h"
#include "qemu_trace_guard.h"
#include "qmp_attach.h"
#include "qmp_client.h"
#include "region_file.h"
#include "vm_backend.h"
#include "vm_process.h"

namespace hvtrace::hostd {

struct QmpVmSpec {
  std::string qmp_socket;
  std::filesystem::path region_path;  // Host file backing the trace range.
  uint64_t region_offset = 0;         // Of the range in that file.
  uint64_t region_size = 0;           // What the host configured.
  uint64_t region_gpa = 0;
  pid_t pid = -1;                        // QEMU's pid when known.
  uint64_t pid_start_time = 0;           // vm_process.h ProcessStartTime: tells a reused pid apart.
  std::string console_socket;            // ttyS0 socket when the daemon booted it.
  std::vector<std::string> owned_paths;  // Files `hvtrace stop` removes (booted VMs).
  bool exited = false;      // QEMU exited unwatched; its region was captured at re-adopt.
  std::string console_log;  // Guest ttyS0 log when the daemon booted it.
  bool booted_by_daemon = false;
  std::string kernel_path;  // When known: names the formats to decode with.
  std::string kernel_key;   // formats_cache.h key (SHA-256 of vmlinuz).
  // Attach mode: the region hot-plugged now (empty when none), so a
  // restarted daemon maps it again. region_size 0 = no boot range.
  std::string attach_region;
  std::string attach_device;   // ivshmem-plain id.
  std::string attach_memdev;   // memory-backend-file id.
  std::string initrd_path;     // When known: lets the daemon harvest the formats.
  std::string meta_socket;     // The metadata channel's socket (empty: none).
  std::string qemu_trace_log;  // QEMU's boot-handshake trace log (empty: not traced).
  std::string vmcore;          // "" (the daemon's setting) | off | on-panic.
  uint64_t memory_bytes = 0;   // The guest's RAM when known (a vmcore's bound).
  // The region file's owner when the VM was registered (the client's file
  // at adopt, hvtraced's or QEMU's user's at boot): a restarted daemon opens
  // the path again and takes only a file of that owner or root
  // (region_file_open.h). Unset in records of older daemons: not checked.
  std::optional<uid_t> region_owner;

  nlohmann::json ToJson() const;
  static Result<QmpVmSpec> FromJson(const nlohmann::json& j);
};

// "FILE@GPA:SIZE" (GPA/SIZE as the kernel's memmap= parses: 0x…, K/M/G). The
// range starts at file offset 0 (the file is the node-1 backing file).
Result<QmpVmSpec> ParseBootRegion(std::string_view text);

// Where the daemon remembers a QMP VM so a restarted daemon re-adopts it.
std::filesystem::path QmpVmSpecPath(const std::filesystem::path& vm_dir);
Status SaveQmpVmSpec(const std::filesystem::path& vm_dir, const QmpVmSpec& spec);
Result<QmpVmSpec> LoadQmpVmSpec(const std::filesystem::path& vm_dir);

// Synthetic event names on the QMP timeline (data says what was found).
inline constexpr const char* kEventFoundPanicked = "HVTRACE_FOUND_PANICKED";
inline constexpr const char* kEventFoundPaused = "HVTRACE_FOUND_PAUSED";

class QmpVmBackend : public VmBackend {
 public:
  // |vm| is the QEMU the daemon launched or re-attached to (owned: stopped
  // with the backend unless released), or null for an adopted one.
  //
  // Once QMP is up the backend asks query-status: a guest that already sits
  // in guest-panicked (it panicked while no daemon watched: hvtraced was down,
  // or the VM was adopted after the fact) is reported to the supervisor as
  // kEventFoundPanicked, which captures it as "panic-while-away".
  // |spec_dir| is the VM's state dir, where attach changes to the spec are
  // saved (empty: not saved).
  QmpVmBackend(boost::asio::any_io_executor io, QmpVmSpec spec, std::unique_ptr<Vm> vm,
               std::filesystem::path spec_dir = {});
  ~QmpVmBackend() override;

  std::string_view kind() const override { return "qmp"; }
  void Start(VmEventSink& sink) override;
  void Stop() override;
  // Stops watching and leaves the QEMU running (daemon exit, vm_on_shutdown = keep).
  void Release() override;
  Result<CaptureInputs> PrepareCapture() override;
  uint64_t region_file_bytes() const override { return spec_.region_size; }
  KernelFiles kernel_files() const override {
    return {spec_.kernel_key, spec_.kernel_path, spec_.initrd_path};
  }
  // In the daemon's own 0700 directory: no peer check needed.
  std::function<MetaSocketTarget()> meta_socket() const override {
    if (spec_.meta_socket.empty()) return nullptr;
    return [path = spec_.meta_socket] { return MetaSocketTarget{path, -1}; };
  }
  // QMP memsave into a file beside the metadata socket (a booted VM's QEMU
  // runs as the daemon's user and writes into its private directory).
  GuestMemoryReader guest_memory_reader() override;
  CaptureInputs::GuestMemoryDumper guest_memory_dumper() override;
  // Mapped once QMP is up (guest_ram_map.h), for any QEMU whose pid is known
  // and whose memory the daemon may read.
  std::shared_ptr<const GuestRam> guest_ram() const override;
  std::optional<bool> vmcore_on_panic() const override {
    if (spec_.vmcore.empty()) return std::nullopt;
    return spec_.vmcore == "on-panic";
  }
  void ApplyPanicPolicy(PanicPolicy policy) override;
  nlohmann::json Describe() const override;

  const QmpVmSpec& spec() const { return spec_; }
  // Reads the region through |fd| (a duplicate is kept), which the client
  // that adopted the VM opened, instead of opening spec.region_path as root.
  // Call before Start.
  void UseRegionFd(int fd);
  std::shared_ptr<const RegionFile> region_file() const override;
  std::optional<RegionFileSource> boot_range() const override;
  // Kills an owned QEMU (for `hvtrace stop --kill`); asks QMP quit otherwise.
  void Quit() override;

  // Attach mode (attach_session.h; the QMP steps in qmp_attach.h).
  void Attach(const AttachOptions& options, AttachDone done) override {
    attach_.Attach(options, std::move(done));
  }
  void Detach(std::chrono::milliseconds timeout, DetachDone done) override {
    attach_.Detach(timeout, std::move(done));
  }
  std::shared_ptr<LiveRegion> live_region() const override { return attach_.region(); }
  nlohmann::json AttachStatus() const override { return attach_.Status(); }

 private:
  // Quits |vm| (SIGTERM, then SIGKILL) and logs how it ended and how long it took.
  static void StopQemu(Vm& vm);
  void CheckStatusAtConnect(const HostTime& watch_began);
  void MapGuestRam();
  void StopTraceGuard();
  void CutMemoryLink();  // guest_memory_reader()'s readers fail from now on.
  void OnDeviceDeleted(const std::string& device);
  // Saves the attach fields of the spec (region null: none attached).
  void RememberAttach(const LiveRegion* region, const PluggedDevice* device);
  boost::asio::any_io_executor io_;
  const QmpVmSpec spec_;
  std::unique_ptr<Vm> vm_;
  std::shared_ptr<const RegionFile> region_file_;  // Mapped once, for every capture.
  std::shared_ptr<QmpClient> qmp_;
  std::shared_ptr<QemuTraceGuard> trace_guard_;  // With spec_.qemu_trace_log.
  // What guest_memory_reader()'s readers use: the QMP client while the
  // backend watches, null after Stop/Release.
  struct MemoryLink {
    std::mutex mu;
    std::shared_ptr<QmpClient> qmp;
    std::shared_ptr<const GuestRam> ram;  // Null until mapped, and after Stop/Release.
    std::string ram_error;                // Why it was not mapped.
  };
  const std::shared_ptr<MemoryLink> memory_link_ = std::make_shared<MemoryLink>();

  mutable std::mutex mu_;  // Guards the fields below.
  VmEventSink* sink_ = nullptr;
  bool connected_ = false;
  std::string last_qmp_event_;
  const std::filesystem::path spec_dir_;
  QmpVmSpec attach_spec_;  // spec_ with the attach fields as they are now.
  // Last: they go first, while the fields above still stand.
  QmpRegionTransport attach_transport_;
  AttachSession attach_;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_QMP_VM_H_
