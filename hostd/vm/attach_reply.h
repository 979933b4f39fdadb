// What `attach` and `detach` answer, for every backend: AttachSession
// (backend/attach_session.h) makes them, hvtraced sends them, `hvtrace
// attach/detach` reads them. One JSON mapping each (json_message.h); every
// field is written, an unset optional left out (no "guest" when no agent
// announced itself).
#ifndef HVTRACE_HOSTD_VM_ATTACH_REPLY_H_
#define HVTRACE_HOSTD_VM_ATTACH_REPLY_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "json_message.h"

namespace hvtrace::hostd {

// The region file the device carries.
struct AttachedRegion : ReplyMessage {
  std::string file;
  uint64_t size = 0;
  std::string region_id;  // Hex, as the region header holds it.
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("file", r.file);
    m.Field("size", r.size);
    m.Field("region_id", r.region_id);
  }
};

// The device that carries it in the VM.
struct AttachedDevice : ReplyMessage {
  std::string id;                  // QMP device id, or libvirt alias.
  std::string memdev;              // Its memory backend.
  std::optional<std::string> bus;  // q35: the root port.
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("id", r.id);
    m.Field("memdev", r.memdev);
    m.Field("bus", r.bus);
  }
};

// What the guest's agent wrote into the region header when it announced
// itself (copied out of guest memory, then checked: live_region.h).
struct AgentAnnouncement : ReplyMessage {
  std::string boot_id;
  uint64_t boot_generation = 0;
  std::string kernel_release;
  uint32_t nr_cpus = 0;
  uint32_t agent_pid = 0;
  std::string trace_clock;  // local, mono, x86-tsc, boot, global, unknown
  uint32_t page_size = 0;
  uint32_t state = 0;  // region::kState*
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("boot_id", r.boot_id);
    m.Field("boot_generation", r.boot_generation);
    m.Field("kernel_release", r.kernel_release);
    m.Field("nr_cpus", r.nr_cpus);
    m.Field("agent_pid", r.agent_pid);
    m.Field("trace_clock", r.trace_clock);
    m.Field("page_size", r.page_size);
    m.Field("state", r.state);
  }
};

struct AttachReply : ReplyMessage {
  static constexpr const char* kCommand = "attach";
  std::string name;  // The VM, as hvtraced calls it.
  AttachedRegion region;
  AttachedDevice device;
  // {kind: qmp|libvirt, …}: what the backend's transport adds (its socket,
  // QEMU's uid/gid, the machine type, libvirt's timings).
  nlohmann::json transport = nlohmann::json::object();
  double plug_ms = 0;
  std::optional<double> announce_ms;       // From the plug to the announcement.
  std::optional<AgentAnnouncement> guest;  // None: no agent within the wait.
  std::optional<std::string> note;         // Why guest is null.
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("name", r.name);
    m.Field("region", r.region);
    m.Field("device", r.device);
    m.Field("transport", r.transport);
    m.Field("plug_ms", r.plug_ms);
    m.Field("announce_ms", r.announce_ms);
    m.Field("guest", r.guest);
    m.Field("note", r.note);
  }
};

struct DetachedRegion : ReplyMessage {
  std::string file;
  bool kept_open = true;  // Still mapped: captures and streams read it.
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("file", r.file);
    m.Field("kept_open", r.kept_open);
  }
};

struct DetachReply : ReplyMessage {
  static constexpr const char* kCommand = "detach";
  std::string name;
  bool detached = true;
  std::string device;
  double device_deleted_ms = 0;
  DetachedRegion region;
  // QEMU let the device go but kept its memory backend (QMP object-del).
  std::optional<std::string> object_del_error;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("name", r.name);
    m.Field("detached", r.detached);
    m.Field("device", r.device);
    m.Field("device_deleted_ms", r.device_deleted_ms);
    m.Field("region", r.region);
    m.Field("object_del_error", r.object_del_error);
  }
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_VM_ATTACH_REPLY_H_
