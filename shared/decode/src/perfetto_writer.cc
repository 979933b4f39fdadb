// PerfettoTraceWriter (hvtrace/perfetto_writer.h).
//
// Records come from ForEachRecord (output.h) in trace-cmd's merge order and
// are appended to their CPU's open bundle; a bundle becomes a TracePacket
// when it holds kMaxBundleEvents events, when the CPU lost events before
// the next record, and at the end of the file. Payloads are guest bytes:
// every field is read through FieldValue/FieldText, which check it against
// the record's size, and strings are made valid UTF-8 before they are
// written (ProtoWriter::String).
#include "hvtrace/perfetto_writer.h"

#include <bit>
#include <cstring>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "event_text.h"
#include "hvtrace/decoder.h"
#include "hvtrace/format.h"
#include "hvtrace/proto_writer.h"
#include "perfetto_fields.h"

namespace hvtrace {
namespace {

namespace pf = perfetto_fields;

// Between two boots whose clocks overlap (a kexec'd kernel starts its trace
// clock again): the later one is placed this long after the earlier's last
// event. The real gap is not in the capture; the docs say so.
constexpr uint64_t kBootGapNs = 1000000;
// A pid keeps one name entry; the kernel's pid_max is at most 4 Mi.
constexpr uint64_t kCloneThread = 0x00010000;               // include/uapi/linux/sched.h
constexpr uint64_t kTrackUuidBase = 0x6876747200000000ull;  // "hvtr"
constexpr uint32_t kMaxCpu = 1023;                          // trace_processor refuses cpu >= 1024.

enum class ValueKind : uint8_t { kString, kSigned, kUnsigned };

// One field of a typed Perfetto event: its number and the kernel field it
// comes from.
struct TypedField {
  uint32_t number;
  const char* kernel_name;
  ValueKind kind;
  bool required;
};

struct TypedEvent {
  const char* system;
  const char* name;
  uint32_t event_field;  // FtraceEvent's field for it.
  std::vector<TypedField> fields;
};

// The kernel events Perfetto has typed messages for, and how their fields
// map (sched.proto, task.proto, ftrace.proto, printk.proto).
const std::vector<TypedEvent>& TypedEvents() {
  using K = ValueKind;
  static const std::vector<TypedField> kWake = {{1, "comm", K::kString, true},
                                                {2, "pid", K::kSigned, true},
                                                {3, "prio", K::kSigned, false},
                                                {4, "success", K::kSigned, false},
                                                {5, "target_cpu", K::kSigned, false}};
  static const std::vector<TypedEvent> kEvents = {
      {"sched",
       "sched_switch",
       pf::kEventSchedSwitch,
       {{1, "prev_comm", K::kString, true},
        {2, "prev_pid", K::kSigned, true},
        {3, "prev_prio", K::kSigned, false},
        {4, "prev_state", K::kSigned, true},
        {5, "next_comm", K::kString, true},
        {6, "next_pid", K::kSigned, true},
        {7, "next_prio", K::kSigned, false}}},
      {"sched", "sched_wakeup", pf::kEventSchedWakeup, kWake},
      {"sched", "sched_waking", pf::kEventSchedWaking, kWake},
      {"sched", "sched_wakeup_new", pf::kEventSchedWakeupNew, kWake},
      {"sched",
       "sched_process_fork",
       pf::kEventSchedProcessFork,
       {{1, "parent_comm", K::kString, true},
        {2, "parent_pid", K::kSigned, true},
        {3, "child_comm", K::kString, true},
        {4, "child_pid", K::kSigned, true}}},
      {"sched",
       "sched_process_exec",
       pf::kEventSchedProcessExec,
       {{1, "filename", K::kString, true},
        {2, "pid", K::kSigned, true},
        {3, "old_pid", K::kSigned, false}}},
      {"sched",
       "sched_process_exit",
       pf::kEventSchedProcessExit,
       {{1, "comm", K::kString, true},
        {2, "pid", K::kSigned, true},
        {3, "tgid", K::kSigned, false},
        {4, "prio", K::kSigned, false}}},
      {"sched",
       "sched_process_free",
       pf::kEventSchedProcessFree,
       {{1, "comm", K::kString, true},
        {2, "pid", K::kSigned, true},
        {3, "prio", K::kSigned, false}}},
      {"task",
       "task_newtask",
       pf::kEventTaskNewtask,
       {{1, "pid", K::kSigned, true},
        {2, "comm", K::kString, true},
        {3, "clone_flags", K::kUnsigned, false},
        {4, "oom_score_adj", K::kSigned, false}}},
      // Before 6.12 task_rename has no pid field: the renamed task is
      // common_pid (TaskNameTimeline reads it the same way).
      {"task",
       "task_rename",
       pf::kEventTaskRename,
       {{1, "pid", K::kSigned, false},
        {1, "common_pid", K::kSigned, true},
        {2, "oldcomm", K::kString, true},
        {3, "newcomm", K::kString, true},
        {4, "oom_score_adj", K::kSigned, false}}},
      {"ftrace",
       "print",
       pf::kEventPrint,
       {{1, "ip", K::kUnsigned, false}, {2, "buf", K::kString, true}}},
      {"printk", "console", pf::kEventConsole, {{1, "msg", K::kString, true}}},
  };
  return kEvents;
}

bool IsText(const FieldFormat& f) {
  const bool chars = f.type.starts_with("char") || f.type.find(" char") != std::string::npos;
  return chars && f.type.find("unsigned") == std::string::npos && f.kind != FieldKind::kScalar;
}

// |f|'s integer value in |p|, sign-extended when the kernel says it is
// signed; nullopt when the record is too short or the field no integer.
std::optional<uint64_t> FieldValue(std::span<const std::byte> p, const FieldFormat& f,
                                   bool little_endian) {
  if (f.kind != FieldKind::kScalar || f.size == 0 || f.size > 8 ||
      static_cast<uint64_t>(f.offset) + f.size > p.size()) {
    return std::nullopt;
  }
  const auto* data = reinterpret_cast<const unsigned char*>(p.data()) + f.offset;
  uint64_t v = ReadUnsigned(data, f.size, little_endian);
  if (f.is_signed && f.size < 8) {
    const int shift = 64 - static_cast<int>(f.size) * 8;
    v = static_cast<uint64_t>(static_cast<int64_t>(v << shift) >> shift);
  }
  return v;
}

// |f|'s text in |p| (a char array, __data_loc or __rel_loc char[]), cut at
// its first NUL; nullopt when it lies outside the record.
std::optional<std::string_view> FieldText(std::span<const std::byte> p, const FieldFormat& f,
                                          bool little_endian) {
  if (static_cast<uint64_t>(f.offset) + f.size > p.size()) return std::nullopt;
  const auto* data = reinterpret_cast<const char*>(p.data());
  uint64_t offset = f.offset, len = f.size;
  if (f.kind == FieldKind::kArray && f.size == 0) {
    len = p.size() - f.offset;  // A flexible tail (ftrace:print's buf[]).
  } else if (f.kind == FieldKind::kDataLoc || f.kind == FieldKind::kRelLoc) {
    if (f.size != 4) return std::nullopt;
    const uint64_t loc =
        ReadUnsigned(reinterpret_cast<const unsigned char*>(data) + f.offset, 4, little_endian);
    offset = loc & 0xffff;
    len = loc >> 16;
    if (f.kind == FieldKind::kRelLoc) offset += f.offset + f.size;
    if (offset > p.size() || len > p.size() - offset) return std::nullopt;
  } else if (f.kind != FieldKind::kArray) {
    return std::nullopt;
  }
  std::string_view text(data + offset, static_cast<size_t>(len));
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) text = text.substr(0, nul);
  return text;
}

// How the records of one event id are written.
struct Plan {
  const EventFormat* format = nullptr;  // nullptr: no format for the id.
  const TypedEvent* typed = nullptr;    // nullptr: GenericFtraceEvent.
  std::vector<std::pair<const TypedField*, const FieldFormat*>> fields;
  const FieldFormat* common_pid = nullptr;
  const FieldFormat* common_flags = nullptr;
  // Generic events: the encoded event_name field and, for each field but
  // the common ones, its encoded name, made once per event id rather than
  // once per record.
  struct GenericField {
    const FieldFormat* format;
    std::string name_field;
  };
  std::string name_field;
  std::vector<GenericField> generic_fields;
  uint64_t* count = nullptr;  // Its entry in PerfettoCounts::per_event.
};

Plan MakePlan(const EventFormat* format) {
  Plan plan;
  plan.format = format;
  if (format == nullptr) return plan;
  plan.common_pid = format->FindField("common_pid");
  plan.common_flags = format->FindField("common_flags");
  for (const TypedEvent& t : TypedEvents()) {
    if (format->system != t.system || format->name != t.name) continue;
    bool ok = true;
    uint32_t have = 0;  // A field number already filled (task_rename's pid).
    for (const TypedField& tf : t.fields) {
      const FieldFormat* ff = format->FindField(tf.kernel_name);
      const bool fits =
          ff != nullptr &&
          (tf.kind == ValueKind::kString ? IsText(*ff) : ff->kind == FieldKind::kScalar);
      if (fits && have != tf.number) {
        plan.fields.push_back({&tf, ff});
        have = tf.number;
      } else if (tf.required && have != tf.number) {
        ok = false;
      }
    }
    if (ok) plan.typed = &t;
    if (!ok) plan.fields.clear();
    break;
  }
  return plan;
}

struct CpuBundle {
  ProtoBuffer events;  // Serialized FtraceEvent fields (key + length + body each).
  uint32_t count = 0;
  bool lost = false;  // Set on the bundle's first write.
  uint64_t last_ts = 0;
  // The name last stated for the pid of this CPU's last record, which is
  // usually the next record's pid too: it saves a lookup in names_.
  int32_t named_pid = -1;
  std::string* named = nullptr;
};

// |field| (a string field) encoded, for a plan.
std::string EncodedString(uint32_t field, std::string_view value) {
  ProtoBuffer buf;
  ProtoWriter(&buf).String(field, value);
  return std::string(buf.view());
}

}  // namespace

struct PerfettoTraceWriter::Impl {
  // The file is ~80 bytes per event, written while the next events are
  // encoded: its write(2)s were ~15% of the exporting thread.
  explicit Impl(int fd) : sink(fd, 1 << 20, OutputSink::Mode::kBackground) {}

  OutputSink sink;
  ProtoBuffer packet;  // The packet being built.
  uint32_t next_sequence = 1;
  bool placed_any = false;
  uint64_t placed_end = 0;  // The latest guest time placed, on the trace's axis.
  // The last guest sequence (WriteInstant).
  uint32_t last_sequence = 0;
  int64_t last_offset = 0;

  // Writes |packet| and then |tail| as one TracePacket of the Trace. A
  // bundle's events come as |tail|, so they are copied once, not into
  // |packet| first.
  void Emit(std::string_view tail = {}) {
    char key[2 * ProtoWriter::kMaxVarintBytes];
    char* end = ProtoWriter::PutVarint(key, uint64_t{pf::kTracePacket} << 3 | 2);
    end = ProtoWriter::PutVarint(end, packet.size() + tail.size());
    sink.buffer()->append(key, static_cast<size_t>(end - key));
    sink.buffer()->append(packet.view());
    packet.clear();
    if (tail.empty()) {
      sink.MaybeFlush();
    } else {
      sink.Write(tail);
    }
  }
};

namespace {

// One file's export: its sequence, bundles, plans and names.
class FileExport {
 public:
  FileExport(ProtoBuffer* packet, std::function<void(std::string_view)> emit, uint32_t sequence,
             uint32_t machine, bool sequence_clock, PerfettoCounts* counts)
      : packet_(*packet),
        emit_(std::move(emit)),
        sequence_(sequence),
        machine_(machine),
        sequence_clock_(sequence_clock),
        counts_(counts) {}

  uint64_t track_uuid() const { return kTrackUuidBase | sequence_; }

  // Starts a packet of this sequence (and machine); |ts| on this
  // sequence's clock when set.
  ProtoWriter StartPacket(std::optional<uint64_t> ts = std::nullopt) {
    ProtoWriter w(&packet_);
    if (ts) {
      w.Varint(pf::kPacketTimestamp, *ts);
      if (sequence_clock_) w.Varint(pf::kPacketTimestampClockId, pf::kSequenceClock);
    }
    w.Varint(pf::kPacketTrustedSequenceId, sequence_);
    if (machine_ != 0) w.Varint(pf::kPacketMachineId, machine_);
    if (first_packet_) {
      w.Varint(pf::kPacketSequenceFlags, pf::kSeqIncrementalStateCleared);
      first_packet_ = false;
    }
    return w;
  }

  void NameTrack(const std::string& name) {
    ProtoWriter w = StartPacket();
    const size_t td = w.BeginNested(pf::kPacketTrackDescriptor);
    w.Varint(pf::kTrackDescriptorUuid, track_uuid());
    w.String(pf::kTrackDescriptorName, name);
    w.EndNested(td);
    emit_({});
  }

  void TrackEvent(uint64_t ts, uint64_t type, const std::string& name, const std::string& detail) {
    ProtoWriter w = StartPacket(ts);
    const size_t te = w.BeginNested(pf::kPacketTrackEvent);
    w.Varint(pf::kTrackEventType, type);
    w.Varint(pf::kTrackEventTrackUuid, track_uuid());
    if (!name.empty()) w.String(pf::kTrackEventName, name);
    if (!detail.empty()) {
      const size_t da = w.BeginNested(pf::kTrackEventDebugAnnotations);
      w.String(pf::kDebugAnnotationName, "detail");
      w.String(pf::kDebugAnnotationString, detail);
      w.EndNested(da);
    }
    w.EndNested(te);
    emit_({});
  }

  // The sequence clock (64) read |ts| when BOOTTIME read |ts| + |offset|:
  // stated once per sequence, and again in every bundle, which is where
  // trace_processor takes it for ftrace events.
  void StateClock(uint64_t ts, int64_t offset, bool realtime) {
    offset_ = offset;
    clock_ts_ = ts;
    ProtoWriter w = StartPacket();
    const size_t cs = w.BeginNested(pf::kPacketClockSnapshot);
    const auto clock = [&](uint32_t id, uint64_t value) {
      const size_t c = w.BeginNested(pf::kClockSnapshotClocks);
      w.Varint(pf::kClockId, id);
      w.Varint(pf::kClockTimestamp, value);
      w.EndNested(c);
    };
    if (sequence_clock_) clock(pf::kSequenceClock, ts);
    clock(pf::kBuiltinClockBoottime, ts + static_cast<uint64_t>(offset));
    if (realtime) clock(pf::kBuiltinClockRealtime, ts + static_cast<uint64_t>(offset));
    w.EndNested(cs);
    emit_({});
  }

  void set_ftrace_clock(uint64_t clock) { ftrace_clock_ = clock; }
  // For a packet added to a sequence that has begun already.
  void SkipFirstFlag() { first_packet_ = false; }

  // The host machine's first packets: its SystemInfo (named |name|), a
  // RemoteClockSync saying its clock reads what the guest machine's does
  // (offset 0: both sides' events are on the host's CLOCK_REALTIME), the
  // track, the clock and the slice spanning its events from |ts| on.
  void HostPreamble(const std::string& name, uint64_t ts) {
    ProtoWriter w = StartPacket();
    const size_t si = w.BeginNested(pf::kPacketSystemInfo);
    const size_t un = w.BeginNested(pf::kSystemInfoUtsname);
    w.String(pf::kUtsnameSysname, "Linux");
    w.EndNested(un);
    w.String(pf::kSystemInfoMachineName, name);
    w.EndNested(si);
    emit_({});
    // Two rounds of (client, host) readings 1 µs apart, in the order
    // trace_processor's CalculateClockOffsets expects (t1c, t1h, t2c, t2h):
    // both its offset estimates come out 0.
    w = StartPacket();
    const size_t rc = w.BeginNested(pf::kPacketRemoteClockSync);
    for (uint64_t round = 0; round < 2; ++round) {
      const size_t sc = w.BeginNested(pf::kRemoteClockSyncSynced);
      for (const uint32_t side : {pf::kSyncedClientClocks, pf::kSyncedHostClocks}) {
        const size_t cs = w.BeginNested(side);
        const size_t c = w.BeginNested(pf::kClockSnapshotClocks);
        w.Varint(pf::kClockId, pf::kBuiltinClockBoottime);
        w.Varint(pf::kClockTimestamp,
                 ts + 2000 * round + (side == pf::kSyncedHostClocks ? 1000 : 0));
        w.EndNested(c);
        w.EndNested(cs);
      }
      w.EndNested(sc);
    }
    w.EndNested(rc);
    emit_({});
    NameTrack(name);
    StateClock(ts, 0, /*realtime=*/true);
    TrackEvent(ts, pf::kTrackEventSliceBegin, name, "");
  }

  void Start(const TraceMetadata& metadata, EventDecoder& decoder) {
    decoder_ = &decoder;
    little_endian_ = !metadata.big_endian;
  }

  // Appends |rec| to its CPU's bundle.
  bool Add(const DecodedRecord& rec) {
    const uint32_t cpu = rec.cpu > kMaxCpu ? kMaxCpu : rec.cpu;
    if (cpu >= bundles_.size()) bundles_.resize(cpu + 1);
    CpuBundle& b = bundles_[cpu];
    if (rec.missed_events != 0) {
      if (b.count != 0) Flush(cpu);
      b.lost = true;
    }
    const std::span<const std::byte> p = rec.payload;
    const uint32_t id =
        p.size() >= 2 ? static_cast<uint32_t>(ReadUnsigned(
                            reinterpret_cast<const unsigned char*>(p.data()), 2, little_endian_))
                      : 0xffffffffu;
    const Plan& plan = PlanFor(id);
    int64_t pid = 0;
    if (plan.common_pid != nullptr) {
      pid = static_cast<int64_t>(FieldValue(p, *plan.common_pid, little_endian_).value_or(0));
    } else if (p.size() >= 8) {
      pid = static_cast<int32_t>(
          ReadUnsigned(reinterpret_cast<const unsigned char*>(p.data()) + 4, 4, little_endian_));
    }
    if (rec.comm != nullptr && pid > 0) StateName(rec, pid, b);
    ProtoWriter w(&b.events);
    const size_t ev = w.BeginCompact(pf::kBundleEvent);
    w.Varint(pf::kEventTimestamp, rec.timestamp);
    w.Varint(pf::kEventPid, static_cast<uint32_t>(pid));
    if (plan.common_flags != nullptr) {
      if (auto flags = FieldValue(p, *plan.common_flags, little_endian_))
        w.Varint(pf::kEventCommonFlags, *flags & 0xff);
    }
    WriteEvent(plan, id, p, pid, w);
    w.EndCompact(ev);
    b.last_ts = rec.timestamp;
    counts_->events++;
    if (++b.count >= PerfettoTraceWriter::kMaxBundleEvents) Flush(cpu);
    return true;
  }

  void FlushAll() {
    for (uint32_t cpu = 0; cpu < bundles_.size(); ++cpu) {
      if (bundles_[cpu].count != 0 || bundles_[cpu].lost) Flush(cpu);
    }
  }

 private:
  // |id|: 0..0xffff, or 0xffffffff for a record too short to hold one.
  const Plan& PlanFor(uint32_t id) {
    // Indexed by id (the last slot for 0xffffffff): one load per record.
    const size_t slot = id <= 0xffff ? id : 0x10000;
    if (slot < plans_.size() && plans_[slot] != nullptr) return *plans_[slot];
    const EventFormat* f = id <= 0xffff ? decoder_->FindFormat(id) : nullptr;
    auto plan = std::make_unique<Plan>(MakePlan(f));
    plan->count = &counts_->per_event[plan->typed != nullptr ? plan->typed->name
                                      : f != nullptr         ? f->name
                                                             : "hvtrace_unknown_event"];
    if (plan->typed == nullptr && f != nullptr) {
      plan->name_field = EncodedString(pf::kGenericEventName, f->name);
      for (const FieldFormat& ff : f->fields) {
        if (!ff.is_common)
          plan->generic_fields.push_back({&ff, EncodedString(pf::kGenericFieldName, ff.name)});
      }
    }
    if (slot >= plans_.size()) plans_.resize(slot + 1);
    plans_[slot] = std::move(plan);
    return *plans_[slot];
  }

  void WriteEvent(const Plan& plan, uint32_t id, std::span<const std::byte> p, int64_t pid,
                  ProtoWriter& w) {
    if (plan.typed != nullptr) {
      const size_t m = w.BeginCompact(plan.typed->event_field);
      for (const auto& [tf, ff] : plan.fields) {
        if (tf->kind == ValueKind::kString) {
          if (auto text = FieldText(p, *ff, little_endian_)) w.String(tf->number, *text);
        } else if (auto v = FieldValue(p, *ff, little_endian_)) {
          w.Varint(tf->number, *v);
        }
      }
      w.EndCompact(m);
      ++*plan.count;
      if (plan.typed->event_field == pf::kEventTaskNewtask) LearnTgid(plan, p, pid);
      return;
    }
    const size_t g = w.BeginCompact(pf::kEventGeneric);
    if (plan.format == nullptr) {
      w.String(pf::kGenericEventName, "hvtrace_unknown_event");
      const size_t f = w.BeginCompact(pf::kGenericField);
      w.String(pf::kGenericFieldName, "id");
      w.Varint(pf::kGenericFieldUint, id);
      w.EndCompact(f);
    } else {
      w.Raw(plan.name_field);
      for (const Plan::GenericField& gf : plan.generic_fields)
        WriteGenericField(*gf.format, gf.name_field, p, w);
    }
    ++*plan.count;
    w.EndCompact(g);
    counts_->generic++;
  }

  void WriteGenericField(const FieldFormat& ff, const std::string& name_field,
                         std::span<const std::byte> p, ProtoWriter& w) {
    const size_t f = w.BeginCompact(pf::kGenericField);
    w.Raw(name_field);
    if (ff.kind == FieldKind::kScalar) {
      if (auto v = FieldValue(p, ff, little_endian_)) {
        if (ff.is_signed) {
          w.Signed(pf::kGenericFieldInt, static_cast<int64_t>(*v));
        } else {
          w.Varint(pf::kGenericFieldUint, *v);
        }
      }
    } else if (IsText(ff)) {
      if (auto text = FieldText(p, ff, little_endian_)) w.String(pf::kGenericFieldStr, *text);
    } else {
      // Other arrays (u8 buf[16], unsigned long stack[]): their elements as
      // `hvtrace show --json` prints them, "[1,2,3]", bounded by the record.
      scratch_.clear();
      AppendJsonFieldValue(&scratch_, ff, reinterpret_cast<const unsigned char*>(p.data()),
                           static_cast<uint32_t>(p.size()), little_endian_);
      w.String(pf::kGenericFieldStr, scratch_);
    }
    w.EndCompact(f);
  }

  // task_newtask: the new task shares its creator's thread group when
  // cloned with CLONE_THREAD, else leads its own.
  void LearnTgid(const Plan& plan, std::span<const std::byte> p, int64_t creator) {
    std::optional<uint64_t> child, flags;
    for (const auto& [tf, ff] : plan.fields) {
      if (tf->number == 1) child = FieldValue(p, *ff, little_endian_);
      if (tf->number == 3) flags = FieldValue(p, *ff, little_endian_);
    }
    if (!child || !flags) return;
    const auto c = static_cast<int32_t>(*child);
    if ((*flags & kCloneThread) == 0) {
      tgids_[c] = c;
    } else {
      auto it = tgids_.find(static_cast<int32_t>(creator));
      tgids_[c] = it != tgids_.end() ? it->second : static_cast<int32_t>(creator);
    }
  }

  // States |pid|'s name at |rec|'s time with a ProcessTree packet when it
  // differs from the name stated last. A task whose thread group the trace
  // never showed (it existed before the trace began) is named as its own
  // group's leader: in a boot trace those are init and kernel threads.
  void StateName(const DecodedRecord& rec, int64_t pid, CpuBundle& b) {
    const auto tid = static_cast<int32_t>(pid);
    if (b.named_pid != tid) {
      b.named = &names_[tid];  // Stays valid: names_ never erases.
      b.named_pid = tid;
    }
    std::string& known = *b.named;
    if (known == rec.comm) return;
    known = rec.comm;
    const auto it = tgids_.find(tid);
    ProtoWriter w = StartPacket(rec.timestamp);
    const size_t pt = w.BeginNested(pf::kPacketProcessTree);
    const size_t th = w.BeginNested(pf::kProcessTreeThreads);
    w.Signed(pf::kThreadTid, tid);
    w.Signed(pf::kThreadTgid, it != tgids_.end() ? it->second : tid);
    w.String(pf::kThreadName, known);
    w.EndNested(th);
    w.EndNested(pt);
    emit_({});
    counts_->name_changes++;
  }

  void Flush(uint32_t cpu) {
    CpuBundle& b = bundles_[cpu];
    // The bundle's own fields first, to know its exact size; its events
    // follow them as the packet's tail, never copied into |packet_|.
    bundle_head_.clear();
    ProtoWriter h(&bundle_head_);
    h.Varint(pf::kBundleCpu, cpu);
    if (b.lost) {
      h.Bool(pf::kBundleLostEvents, true);
      counts_->lost_bundles++;
    }
    if (sequence_clock_) {
      h.Varint(pf::kBundleFtraceClock, ftrace_clock_);
      h.Signed(pf::kBundleFtraceTimestamp, static_cast<int64_t>(clock_ts_));
      h.Signed(pf::kBundleBootTimestamp, static_cast<int64_t>(clock_ts_) + offset_);
    }
    ProtoWriter w = StartPacket();
    w.LengthDelimited(pf::kPacketFtraceEvents, bundle_head_.size() + b.events.size());
    w.Raw(bundle_head_.view());
    emit_(b.events.view());
    counts_->bundles++;
    b.events.clear();
    b.count = 0;
    b.lost = false;
  }

  ProtoBuffer& packet_;
  std::function<void(std::string_view)> emit_;
  const uint32_t sequence_;
  const uint32_t machine_;
  const bool sequence_clock_;
  PerfettoCounts* counts_;
  bool first_packet_ = true;
  uint64_t ftrace_clock_ = pf::kFtraceClockLocal;
  uint64_t clock_ts_ = 0;
  int64_t offset_ = 0;
  EventDecoder* decoder_ = nullptr;
  bool little_endian_ = true;
  std::vector<CpuBundle> bundles_;
  std::vector<std::unique_ptr<Plan>> plans_;
  std::unordered_map<int32_t, std::string> names_;
  std::unordered_map<int32_t, int32_t> tgids_;
  std::string scratch_;
  ProtoBuffer bundle_head_;
};

// "[local] global counter" -> the FtraceClock of the clock in brackets.
uint64_t FtraceClockOf(const std::string& trace_clock) {
  const size_t open = trace_clock.find('[');
  const size_t close = trace_clock.find(']', open == std::string::npos ? 0 : open);
  const std::string name = open != std::string::npos && close != std::string::npos
                               ? trace_clock.substr(open + 1, close - open - 1)
                               : trace_clock;
  return name == "global" ? pf::kFtraceClockGlobal : pf::kFtraceClockLocal;
}

}  // namespace

PerfettoTraceWriter::PerfettoTraceWriter(int fd) : impl_(std::make_unique<Impl>(fd)) {}
PerfettoTraceWriter::~PerfettoTraceWriter() = default;

void PerfettoTraceWriter::WriteSystemInfo(const std::string& release, uint32_t cpus,
                                          const std::string& machine_name) {
  ProtoWriter w(&impl_->packet);
  const size_t si = w.BeginNested(pf::kPacketSystemInfo);
  const size_t un = w.BeginNested(pf::kSystemInfoUtsname);
  w.String(pf::kUtsnameSysname, "Linux");
  if (!release.empty()) w.String(pf::kUtsnameRelease, release);
  w.String(pf::kUtsnameMachine, "x86_64");
  w.EndNested(un);
  if (cpus != 0) w.Varint(pf::kSystemInfoNumCpus, cpus);
  if (!machine_name.empty()) w.String(pf::kSystemInfoMachineName, machine_name);
  w.EndNested(si);
  impl_->Emit();
}

Result<ReportStats> PerfettoTraceWriter::WriteGuestFile(const std::string& path,
                                                        const Sequence& seq,
                                                        PerfettoCounts* counts) {
  Impl& m = *impl_;
  const uint32_t sequence = m.next_sequence++;
  FileExport file(
      &m.packet, [&m](std::string_view tail) { m.Emit(tail); }, sequence, 0,
      /*sequence_clock=*/true, counts);
  file.NameTrack(seq.name);
  bool started = false;
  uint64_t last = 0;
  ReportOptions options;
  options.time_names = true;
  options.symbols = false;  // Fields are written as numbers, never as symbols.
  Result<ReportStats> stats = ForEachRecord(
      path, options,
      [&](const TraceMetadata& metadata, EventDecoder& decoder) {
        file.Start(metadata, decoder);
        file.set_ftrace_clock(FtraceClockOf(metadata.trace_clock));
        return true;
      },
      [&](const DecodedRecord& rec) {
        if (!started) {
          started = true;
          // Host-clock files are placed by their own stamps; a guest clock
          // that starts again (kexec) goes after the boot before it.
          int64_t offset = 0;
          if (!seq.host_clock && m.placed_any && rec.timestamp < m.placed_end + kBootGapNs)
            offset = static_cast<int64_t>(m.placed_end + kBootGapNs - rec.timestamp);
          file.StateClock(rec.timestamp, offset, /*realtime=*/seq.host_clock);
          file.TrackEvent(rec.timestamp, pf::kTrackEventSliceBegin, seq.name, "");
          m.last_offset = offset;
        }
        last = rec.timestamp > last ? rec.timestamp : last;
        return file.Add(rec) && m.sink.status().ok();
      });
  file.FlushAll();
  if (started) {
    file.TrackEvent(last, pf::kTrackEventSliceEnd, "", "");
    const uint64_t end = last + static_cast<uint64_t>(m.last_offset);
    m.placed_end = m.placed_any && m.placed_end > end ? m.placed_end : end;
    m.placed_any = true;
    m.last_sequence = sequence;
  }
  if (!m.sink.status().ok()) return m.sink.status().error();
  return stats;
}

Result<ReportStats> PerfettoTraceWriter::WriteHostMachine(const std::string& path,
                                                          const std::string& name,
                                                          PerfettoCounts* counts) {
  Impl& m = *impl_;
  const uint32_t sequence = m.next_sequence++;
  FileExport file(
      &m.packet, [&m](std::string_view tail) { m.Emit(tail); }, sequence, kHostMachineId,
      /*sequence_clock=*/false, counts);
  bool started = false;
  uint64_t last = 0;
  ReportOptions options;
  options.time_names = true;
  options.symbols = false;  // Fields are written as numbers, never as symbols.
  Result<ReportStats> stats = ForEachRecord(
      path, options,
      [&](const TraceMetadata& metadata, EventDecoder& decoder) {
        file.Start(metadata, decoder);
        return true;
      },
      [&](const DecodedRecord& rec) {
        if (!started) {
          started = true;
          file.HostPreamble(name, rec.timestamp);
        }
        last = rec.timestamp > last ? rec.timestamp : last;
        return file.Add(rec) && m.sink.status().ok();
      });
  file.FlushAll();
  if (started) file.TrackEvent(last, pf::kTrackEventSliceEnd, "", "");
  if (!m.sink.status().ok()) return m.sink.status().error();
  return stats;
}

void PerfettoTraceWriter::WriteInstant(uint64_t ts_ns, const std::string& name,
                                       const std::string& detail) {
  Impl& m = *impl_;
  if (m.last_sequence == 0) return;
  PerfettoCounts unused;
  // A packet on the last guest sequence: its clock and track already exist.
  FileExport file(
      &m.packet, [&m](std::string_view tail) { m.Emit(tail); }, m.last_sequence, 0,
      /*sequence_clock=*/true, &unused);
  file.SkipFirstFlag();
  file.TrackEvent(ts_ns, pf::kTrackEventInstant, name, detail);
}

Status PerfettoTraceWriter::Finish() { return impl_->sink.Flush(); }

}  // namespace hvtrace
