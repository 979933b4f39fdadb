// Attach mode in hvtraced: the control commands attach, detach and stream
// (handlers: Daemon::HandleAttach/HandleDetach in attach_commands.cc) and their
// arguments.
//
//   attach {name, qmp?, size_mib? = 16, events? = "", pump_interval_ms? = 50,
//           wait_ms? = 30000}
//     A VM unknown to hvtraced is adopted first (a QEMU by |qmp|, a libvirt
//     domain by name). Reply, the same for every backend
//     (backend/attach_session.h): {name, region {file, size, region_id},
//     device {id, memdev, bus?}, transport {kind, …}, plug_ms, announce_ms?,
//     guest {...} | null, note?}; guest is null when no agent announced
//     itself within wait_ms (the device stays plugged).
//   detach {name, timeout_ms? = 10000}
//     Reply: {name, detached, device, device_deleted_ms, region {file,
//     kept_open}}.
//   stream {name, format? = "text" | "json", from? = "now" | "start"}
//     Stream items {"text": lines} (JSON lines for format json) and
//     {"note": text}; the final line {reason, events, pages_missed}.
#ifndef HVTRACE_HOSTD_ATTACH_ARGS_H_
#define HVTRACE_HOSTD_ATTACH_ARGS_H_

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "hvtrace/result.h"
#include "supervisor.h"

namespace hvtrace::hostd {

struct AttachArgs {
  std::string name;
  std::string qmp;  // Empty: the VM must already be known.
  AttachOptions options;
};
Result<AttachArgs> ParseAttachArgs(const nlohmann::json& args);

struct DetachArgs {
  std::string name;
  std::chrono::milliseconds timeout{10000};
};
Result<DetachArgs> ParseDetachArgs(const nlohmann::json& args);

struct StreamArgs {
  std::string name;
  bool json = false;
  bool from_start = false;
};
Result<StreamArgs> ParseStreamArgs(const nlohmann::json& args);

// How often `stream` looks at the region.
inline constexpr std::chrono::milliseconds kStreamPollInterval{50};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_ATTACH_ARGS_H_
