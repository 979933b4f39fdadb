// One typed message per control command: the CLI fills these and sends them,
// hvtraced parses each request into its struct once (the command table,
// daemon/commands.cc) and hands it to the handler. Each struct's Fields is
// its one JSON mapping (json_message.h: unknown keys and wrong types are
// refused, naming the command and the key), and its member initializers are
// the command's defaults, for both sides. `boot` is BootRequest
// (qemu/boot_request.h), which the VM configuration is built from.
//
// Keys ending in _fd are descriptor indices OpenRequestFiles adds
// (control_protocol.h, fd_passing.h) for the files a command reads.
#ifndef HVTRACE_HOSTD_CONTROL_REQUESTS_H_
#define HVTRACE_HOSTD_CONTROL_REQUESTS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "hvtrace/result.h"
#include "json_message.h"
#include "kernel_file_args.h"

namespace hvtrace::hostd {

// Commands without arguments.
struct NoArgs {
  template <class Self, class Map>
  static void Fields(Self&, Map&) {}
};
struct PingRequest : NoArgs {
  static constexpr const char* kCommand = "ping";
};
struct VersionRequest : NoArgs {
  static constexpr const char* kCommand = "version";
};
struct ListRequest : NoArgs {
  static constexpr const char* kCommand = "list";
};
struct ShutdownRequest : NoArgs {
  static constexpr const char* kCommand = "shutdown";
};
// formats-list: the daemon's formats cache (formats_commands.cc). Reply:
// {cache, harvest_initrd, kernels [{key, release, kernel, events,
// harvested_utc, state}], harvests [{key, state}], problems [text]}.
struct FormatsListRequest : NoArgs {
  static constexpr const char* kCommand = "formats-list";
};

// ValidateVmName, the error prefixed with |command| as every request error is.
Status CheckVmNameArg(const char* command, const std::string& name);

// Commands about one VM the daemon serves, by its name (|Derived| names the
// command).
template <class Derived>
struct VmNameArgs {
  std::string name;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Required("name", r.name);
  }
  Status Check() const { return CheckVmNameArg(Derived::kCommand, name); }
};
struct StatusRequest : VmNameArgs<StatusRequest> {
  static constexpr const char* kCommand = "status";
};
struct CapturesRequest : VmNameArgs<CapturesRequest> {
  static constexpr const char* kCommand = "captures";
};
// A manual capture. Reply: {capture, trigger, trigger_to_disk_ms}.
struct ManualCaptureRequest : VmNameArgs<ManualCaptureRequest> {
  static constexpr const char* kCommand = "capture";
};
// Reply: {stopped, kind, libvirt?}.
struct StopRequest : VmNameArgs<StopRequest> {
  static constexpr const char* kCommand = "stop";
};

// capture-files: a capture's files as read-only descriptors (commands.cc);
// without |name|, the one VM that has a capture |capture|.
struct CaptureFilesRequest {
  static constexpr const char* kCommand = "capture-files";
  std::string capture;
  std::optional<std::string> name;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Required("capture", r.capture);
    m.Field("name", r.name);
  }
  Status Check() const;
};

// stream: the attached region's events live. Stream items {"text": lines}
// (JSON lines for format json) and {"note": text}; the final line {reason,
// events, pages_missed}.
struct StreamRequest {
  static constexpr const char* kCommand = "stream";
  std::string name;
  std::string format = "text";  // text | json
  std::string from = "now";     // now | start
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Required("name", r.name);
    m.Field("format", r.format);
    m.Field("from", r.from);
  }
  Status Check() const;
  bool json() const { return format == "json"; }
  bool from_start() const { return from == "start"; }
};

// attach: hot-plugs a region into a running VM (attach_commands.cc). A VM
// unknown to hvtraced is adopted first: a QEMU by |qmp|, else the libvirt
// domain of that name. Reply, the same for every backend
// (backend/attach_session.h): {name, region {file, size, region_id}, device
// {id, memdev, bus?}, transport {kind, …}, plug_ms, announce_ms?, guest
// {...} | null, note?}; guest is null when no agent announced itself within
// wait_ms (the device stays plugged).
struct AttachRequest {
  static constexpr const char* kCommand = "attach";
  std::string name;
  std::optional<std::string> qmp;  // An absolute path (the daemon's cwd is not the client's).
  uint64_t size_mib = 16;          // A power of two (LiveRegion's CheckRegionSize).
  std::string events;              // Kernel events for the agent ("" = markers only).
  uint64_t pump_interval_ms = 50;
  uint64_t wait_ms = 30000;  // For the agent's announcement.
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Required("name", r.name);
    m.Field("qmp", r.qmp);
    m.Field("size_mib", r.size_mib, 1, 16384);
    m.Field("events", r.events);
    m.Field("pump_interval_ms", r.pump_interval_ms, 1, 60000);
    m.Field("wait_ms", r.wait_ms, 0, 600000);
  }
  Status Check() const;
  std::chrono::milliseconds wait() const { return std::chrono::milliseconds(wait_ms); }
};

// detach: unplugs the region. Reply: {name, detached, device,
// device_deleted_ms, region {file, kept_open}, object_del_error?}.
struct DetachRequest {
  static constexpr const char* kCommand = "detach";
  std::string name;
  uint64_t timeout_ms = 10000;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Required("name", r.name);
    m.Field("timeout_ms", r.timeout_ms, 1, 600000);
  }
  Status Check() const;
  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeout_ms); }
};

// adopt: a QEMU someone else started (|qmp|, optionally its |boot_region|
// FILE@GPA:SIZE, whose file comes as descriptor |boot_region_fd|), or a
// libvirt domain (|domain|, default |name|). Which one a VM is, is its
// record's business once it has one (daemon/boot_commands.cc); the request
// only says what the client believes.
struct AdoptRequest {
  static constexpr const char* kCommand = "adopt";
  std::string name;
  std::optional<std::string> qmp;
  std::optional<std::string> boot_region;
  std::optional<uint64_t> boot_region_fd;
  std::optional<std::string> domain;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Required("name", r.name);
    m.Field("qmp", r.qmp);
    m.Field("boot_region", r.boot_region);
    m.Field("boot_region_fd", r.boot_region_fd);
    m.Field("domain", r.domain);
  }
  Status Check() const;
};

// formats-harvest: the kernel comes as a descriptor the client opened with
// its own rights (KernelFileArgs); its path is for messages and the entry's
// manifest only. Stream items ProgressItem, the final line
// FormatsHarvestReply (formats/formats_replies.h). An initrd is refused with
// the reason: only the daemon's harvest_initrd boots.
struct FormatsHarvestRequest : KernelFileArgs {
  static constexpr const char* kCommand = "formats-harvest";
  uint64_t timeout_ms = 180000;  // How long the harvest guest may take to boot.
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    KernelFileArgs::Fields(r, m);
    m.Field("timeout_ms", r.timeout_ms, 1000, 3600000);
  }
  Status Check() const;
  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeout_ms); }
};
// Longest kernel path a request may name (PATH_MAX).
inline constexpr size_t kMaxKernelPathBytes = 4096;

// setup: edits a libvirt domain's persistent definition (setup_commands.cc).
// Reply: {domain, undo, dry_run, already_set_up, defined, active, old_xml,
// new_xml, changes, kernel_params?, boot_range? {gpa, size}}.
struct SetupRequest {
  static constexpr const char* kCommand = "setup";
  std::string domain;  // Name or UUID.
  // The boot range in bytes (absent: libvirt_setup's default) and the
  // trace_instance events (absent: the boot sequence, kDefaultBootEvents).
  std::optional<uint64_t> range;
  std::optional<std::string> events;
  bool dry_run = false;
  bool undo = false;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Required("domain", r.domain);
    m.Field("range", r.range);
    m.Field("events", r.events);
    m.Field("dry_run", r.dry_run);
    m.Field("undo", r.undo);
  }
  Status Check() const;
};
inline constexpr uint64_t kMaxSetupRangeBytes = 1ull << 30;

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CONTROL_REQUESTS_H_
