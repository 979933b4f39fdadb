// One typed reply per control command, the other half of requests.h: the
// daemon fills these and sends MessageToJson of them, the CLI parses the
// result with ParseMessage<…Reply>(result, "reply") and reads members, so a
// key is spelt once, in Fields. Replies state every field (kWritesDefaults),
// so `hvtrace … --json` prints the same keys every time; an optional one is
// there when it applies. A reply that does not parse is the daemon's bug and the CLI
// says so (daemon_call.h).
//
// A member that is a nlohmann::json is a document with a producer and a
// mapping of its own, passed through as it is: the backend's description,
// the capture queue's and copy pool's counters, the upload's state (fleet's
// UploadStats), the metadata channel's status, a capture's manifest summary.
// Replies made below the daemon are declared where they are made: formats
// list/harvest in formats/formats_replies.h (the CLI's own cache gives the
// same), the upload's state in fleet/upload_stats.h.
#ifndef HVTRACE_HOSTD_CONTROL_REPLIES_H_
#define HVTRACE_HOSTD_CONTROL_REPLIES_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "json_message.h"

namespace hvtrace::hostd {

struct PingReply : ReplyMessage {
  static constexpr const char* kCommand = "ping";
  bool pong = true;
  int pid = 0;
  uint64_t uptime_ms = 0;
  nlohmann::json libvirt;        // DaemonLibvirt::StatusJson; null without libvirt_uri.
  nlohmann::json capture_queue;  // CaptureQueue::StatsJson.
  nlohmann::json copy_buffers;   // CopyBufferPool::ToJson.
  nlohmann::json upload;         // fleet's UploadStats, or {enabled: false}.
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("pong", r.pong);
    m.Field("pid", r.pid);
    m.Field("uptime_ms", r.uptime_ms);
    m.Field("libvirt", r.libvirt);
    m.Field("capture_queue", r.capture_queue);
    m.Field("copy_buffers", r.copy_buffers);
    m.Field("upload", r.upload);
  }
};

struct VersionReply : ReplyMessage {
  static constexpr const char* kCommand = "version";
  std::string version;
  int protocol = 0;
  nlohmann::json config;  // The daemon's configuration as it runs (ConfigJson).
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("version", r.version);
    m.Field("protocol", r.protocol);
    m.Field("config", r.config);
  }
};

// The capture a VM took last.
struct CaptureRef : ReplyMessage {
  std::string id;
  std::string trigger;
  double trigger_to_disk_ms = 0;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("id", r.id);
    m.Field("trigger", r.trigger);
    m.Field("trigger_to_disk_ms", r.trigger_to_disk_ms);
  }
};

// One VM as `status` shows it and `list` lists it (VmSupervisor::Status).
struct VmStatusReply : ReplyMessage {
  static constexpr const char* kCommand = "status";
  std::string name;
  std::string kind = "none";  // qmp | libvirt | none (offline)
  std::string state;
  uint64_t events_seen = 0;
  uint64_t captures_taken = 0;
  uint64_t captures_failed = 0;
  nlohmann::json captures_coalesced;  // {trigger: count} counted into another capture.
  nlohmann::json capture_queue;       // {in_flight, pending [{trigger, coalesced}]}
  std::string captures_dir;
  nlohmann::json backend;  // VmBackend::Describe, as of the last state change.
  nlohmann::json attach;   // AttachSession::Status; null when nothing was attached.
  nlohmann::json meta;     // MetaReceiver::Status; null without a channel.
  // The daemon's watch of the guest's kernel log (log_watcher.h): {looks,
  // last_ms, max_ms, new_lines, oops, warn, error}; null when not watched.
  nlohmann::json log_watch;
  std::optional<std::string> last_error;
  std::optional<std::string> last_event;
  std::optional<CaptureRef> last_capture;
  // `status` only: the kernel's formats (loaded, cached, harvesting, …);
  // null when the kernel is unknown.
  std::optional<std::string> formats;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("name", r.name);
    m.Field("kind", r.kind);
    m.Field("state", r.state);
    m.Field("events_seen", r.events_seen);
    m.Field("captures_taken", r.captures_taken);
    m.Field("captures_failed", r.captures_failed);
    m.Field("captures_coalesced", r.captures_coalesced);
    m.Field("capture_queue", r.capture_queue);
    m.Field("captures_dir", r.captures_dir);
    m.Field("backend", r.backend);
    m.Field("attach", r.attach);
    m.Field("meta", r.meta);
    m.Field("log_watch", r.log_watch);
    m.Field("last_error", r.last_error);
    m.Field("last_event", r.last_event);
    m.Field("last_capture", r.last_capture);
    m.Field("formats", r.formats);
  }
};

struct ListReply : ReplyMessage {
  static constexpr const char* kCommand = "list";
  std::vector<VmStatusReply> vms;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("vms", r.vms);
  }
};

struct CapturesReply : ReplyMessage {
  static constexpr const char* kCommand = "captures";
  std::string vm;
  // Oldest first: each capture's summary (CaptureStore's CaptureEntry):
  // {id, path, trigger, times, totals, files, …} or {id, path, error}.
  nlohmann::json captures = nlohmann::json::array();
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("vm", r.vm);
    m.Field("captures", r.captures);
  }
};

struct ManualCaptureReply : ReplyMessage {
  static constexpr const char* kCommand = "capture";
  std::string capture;
  std::string trigger;
  double trigger_to_disk_ms = 0;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("capture", r.capture);
    m.Field("trigger", r.trigger);
    m.Field("trigger_to_disk_ms", r.trigger_to_disk_ms);
  }
};

struct StopReply : ReplyMessage {
  static constexpr const char* kCommand = "stop";
  std::string stopped;  // The VM's name.
  std::string kind;     // Its backend's kind when it was stopped.
  bool libvirt = false;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("stopped", r.stopped);
    m.Field("kind", r.kind);
    m.Field("libvirt", r.libvirt);
  }
};

struct ShutdownReply : ReplyMessage {
  static constexpr const char* kCommand = "shutdown";
  bool stopping = true;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("stopping", r.stopping);
  }
};

// A boot range in a file QEMU maps: |size| bytes at |offset| of |file|, at
// guest-physical |gpa|.
struct BootRegionReply : ReplyMessage {
  std::string file;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t gpa = 0;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("file", r.file);
    m.Field("offset", r.offset);
    m.Field("size", r.size);
    m.Field("gpa", r.gpa);
  }
};

struct BootReply : ReplyMessage {
  static constexpr const char* kCommand = "boot";
  std::string name;
  int pid = 0;
  bool kvm = false;
  std::vector<std::string> argv;
  std::optional<std::string> kvm_probe;  // Why accel auto chose what it chose.
  BootRegionReply region;
  std::string qmp;
  std::string console_log;
  std::string console_socket;
  std::string meta_socket;
  std::optional<std::string> qemu_trace_log;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("name", r.name);
    m.Field("pid", r.pid);
    m.Field("kvm", r.kvm);
    m.List("argv", r.argv);
    m.Field("kvm_probe", r.kvm_probe);
    m.Field("region", r.region);
    m.Field("qmp", r.qmp);
    m.Field("console_log", r.console_log);
    m.Field("console_socket", r.console_socket);
    m.Field("meta_socket", r.meta_socket);
    m.Field("qemu_trace_log", r.qemu_trace_log);
  }
};

// adopt: a QEMU (|qmp|, |region| a BootRegionReply) or a libvirt domain
// (|domain|, |uuid|, |uri|; |region| and |boot_range| as the backend
// describes them, |meta_channel| what decodes a disk-booted guest).
struct AdoptReply : ReplyMessage {
  static constexpr const char* kCommand = "adopt";
  std::string name;
  nlohmann::json region;
  std::optional<std::string> qmp;
  std::optional<std::string> domain;
  std::optional<std::string> uuid;
  std::optional<std::string> uri;
  nlohmann::json kernel;
  nlohmann::json formats_key;
  std::optional<std::string> meta_channel;
  // {gpa, size, guest_meta {state}, cmdline_note?, note?}: the libvirt
  // domain's boot range, null when it has none.
  nlohmann::json boot_range;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("name", r.name);
    m.Field("region", r.region);
    m.Field("qmp", r.qmp);
    m.Field("domain", r.domain);
    m.Field("uuid", r.uuid);
    m.Field("uri", r.uri);
    m.Field("kernel", r.kernel);
    m.Field("formats_key", r.formats_key);
    m.Field("meta_channel", r.meta_channel);
    m.Field("boot_range", r.boot_range);
  }
};

struct SetupBootRange : ReplyMessage {
  uint64_t gpa = 0;
  uint64_t size = 0;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("gpa", r.gpa);
    m.Field("size", r.size);
  }
};

struct SetupReply : ReplyMessage {
  static constexpr const char* kCommand = "setup";
  std::string domain;
  bool undo = false;
  bool dry_run = false;
  bool already_set_up = false;
  bool defined = false;
  bool active = false;
  std::string old_xml;
  std::string new_xml;
  std::vector<std::string> changes;
  std::optional<std::string> kernel_params;  // Not for --undo.
  std::optional<SetupBootRange> boot_range;  // Not for --undo.
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("domain", r.domain);
    m.Field("undo", r.undo);
    m.Field("dry_run", r.dry_run);
    m.Field("already_set_up", r.already_set_up);
    m.Field("defined", r.defined);
    m.Field("active", r.active);
    m.Field("old_xml", r.old_xml);
    m.Field("new_xml", r.new_xml);
    m.List("changes", r.changes);
    m.Field("kernel_params", r.kernel_params);
    m.Field("boot_range", r.boot_range);
  }
};

// stream: items carry decoded text or a note, one of the two.
struct StreamChunk : ReplyMessage {
  static constexpr const char* kCommand = "stream";
  std::optional<std::string> text;
  std::optional<std::string> note;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("text", r.text);
    m.Field("note", r.note);
  }
};

struct StreamEndReply : ReplyMessage {
  static constexpr const char* kCommand = "stream";
  std::string reason;
  uint64_t events = 0;
  uint64_t pages_missed = 0;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("reason", r.reason);
    m.Field("events", r.events);
    m.Field("pages_missed", r.pages_missed);
  }
};

// capture-files: one item per file, its read-only descriptor alongside.
struct CaptureFileItem : ReplyMessage {
  static constexpr const char* kCommand = "capture-files";
  std::string file;  // A plain name in the capture's directory.
  uint64_t bytes = 0;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Required("file", r.file);
    m.Required("bytes", r.bytes);
  }
};

struct CaptureFilesReply : ReplyMessage {
  static constexpr const char* kCommand = "capture-files";
  std::string vm;
  std::string capture;
  std::string dir;
  uint64_t files = 0;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("vm", r.vm);
    m.Field("capture", r.capture);
    m.Field("dir", r.dir);
    m.Field("files", r.files);
  }
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CONTROL_REPLIES_H_
