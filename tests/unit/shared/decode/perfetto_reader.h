// A reader of Perfetto trace files for tests only: the protobuf wire format
// parsed from scratch, and the messages `hvtrace show --format perfetto`
// writes picked out by Perfetto's published field numbers. The numbers are
// this file's own, copied from Perfetto's .proto files (google/perfetto,
// protos/perfetto/..., at commit ec5d16b14b74), NOT from the writer's table
// (shared/decode/src/perfetto_fields.h): a wrong number on either side
// makes the tests fail. Everything is bounds-checked: a malformed file
// gives ok = false and the reason.
#ifndef HVTRACE_TESTS_UNIT_SHARED_DECODE_PERFETTO_READER_H_
#define HVTRACE_TESTS_UNIT_SHARED_DECODE_PERFETTO_READER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hvtrace::test {

struct WireField {
  uint32_t number = 0;
  uint32_t wire_type = 0;  // 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32.
  uint64_t value = 0;      // Varint / fixed values.
  std::string_view bytes;  // Length-delimited payload.
};

// Splits |msg| into its fields; nullopt when it is not valid wire format.
inline std::optional<std::vector<WireField>> ParseWire(std::string_view msg) {
  std::vector<WireField> out;
  size_t i = 0;
  auto varint = [&](uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (i >= msg.size()) return false;
      const auto b = static_cast<unsigned char>(msg[i++]);
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  };
  while (i < msg.size()) {
    uint64_t key;
    if (!varint(&key)) return std::nullopt;
    WireField f;
    f.number = static_cast<uint32_t>(key >> 3);
    f.wire_type = static_cast<uint32_t>(key & 7);
    if (f.number == 0) return std::nullopt;
    switch (f.wire_type) {
      case 0:
        if (!varint(&f.value)) return std::nullopt;
        break;
      case 1:
      case 5: {
        const size_t n = f.wire_type == 1 ? 8 : 4;
        if (msg.size() - i < n) return std::nullopt;
        for (size_t k = 0; k < n; ++k)
          f.value |= static_cast<uint64_t>(static_cast<unsigned char>(msg[i + k])) << (8 * k);
        i += n;
        break;
      }
      case 2: {
        uint64_t len;
        if (!varint(&len) || len > msg.size() - i) return std::nullopt;
        f.bytes = msg.substr(i, static_cast<size_t>(len));
        i += static_cast<size_t>(len);
        break;
      }
      default:
        return std::nullopt;
    }
    out.push_back(f);
  }
  return out;
}

// One ftrace event as read back.
struct ReadEvent {
  uint32_t sequence = 0;
  uint32_t machine = 0;
  uint32_t cpu = 0;
  uint64_t ts = 0;
  uint32_t pid = 0;
  std::string kind;  // "sched_switch", ..., or a generic event's event_name.
  bool generic = false;
  std::map<std::string, std::string> strings;  // Typed string fields by name / generic fields.
  std::map<std::string, int64_t> ints;
};

struct ReadTrace {
  bool ok = true;
  std::string error;
  size_t packets = 0;
  bool system_info_first = false;
  std::string release;
  uint64_t num_cpus = 0;
  std::vector<std::string> machine_names;
  std::vector<std::string> track_names;
  size_t clock_snapshots = 0, remote_clock_syncs = 0, bundles = 0, lost_bundles = 0;
  size_t instants = 0;
  std::vector<std::string> instant_names;
  std::vector<ReadEvent> events;
  std::vector<std::pair<int64_t, std::string>> thread_names;  // ProcessTree (tid, name).
};

namespace perfetto_read {

// trace.proto: Trace.packet = 1.
// trace_packet.proto: TracePacket fields.
constexpr uint32_t kFtraceEvents = 1, kProcessTree = 2, kClockSnapshot = 6, kTrustedSequenceId = 10,
                   kTrackEvent = 11, kSystemInfo = 45, kTrackDescriptor = 60, kMachineId = 98,
                   kRemoteClockSync = 107;
// system_info.proto: SystemInfo.utsname = 1, num_cpus = 8, machine_name = 17;
// Utsname.release = 3.
// ftrace_event_bundle.proto: cpu = 1, event = 2, lost_events = 3.
// ftrace_event.proto: FtraceEvent.timestamp = 1, pid = 2, and the events.
inline const std::map<uint32_t, std::string>& TypedEvents() {
  static const std::map<uint32_t, std::string> kEvents = {
      {3, "print"},                 // ftrace.proto PrintFtraceEvent
      {4, "sched_switch"},          // sched.proto
      {17, "sched_wakeup"},         // sched.proto
      {20, "sched_waking"},         // sched.proto
      {114, "sched_wakeup_new"},    // sched.proto
      {235, "task_newtask"},        // task.proto
      {236, "task_rename"},         // task.proto
      {237, "sched_process_exec"},  // sched.proto
      {238, "sched_process_exit"},  // sched.proto
      {239, "sched_process_fork"},  // sched.proto
      {240, "sched_process_free"},  // sched.proto
      {408, "console"},             // printk.proto ConsoleFtraceEvent
  };
  return kEvents;
}
// The string fields the tests look at, per typed event (number -> name).
inline std::string TypedStringField(const std::string& kind, uint32_t number) {
  if (kind == "sched_switch") return number == 1 ? "prev_comm" : number == 5 ? "next_comm" : "";
  if (kind == "print") return number == 2 ? "buf" : "";
  if (kind == "console") return number == 1 ? "msg" : "";
  if (kind == "task_rename") return number == 2 ? "oldcomm" : number == 3 ? "newcomm" : "";
  if (kind == "sched_process_fork")
    return number == 1 ? "parent_comm" : number == 3 ? "child_comm" : "";
  if (kind.starts_with("sched_wak") || kind == "sched_process_exit")
    return number == 1 ? "comm" : "";
  return "";
}
constexpr uint32_t kGeneric = 327;  // ftrace_event.proto: GenericFtraceEvent generic
// generic.proto: event_name = 1, field = 2; Field.name = 1, str_value = 3,
// int_value = 4, uint_value = 5.

}  // namespace perfetto_read

inline bool ReadFtraceEvent(std::string_view msg, ReadEvent* e) {
  auto fields = ParseWire(msg);
  if (!fields) return false;
  for (const WireField& f : *fields) {
    if (f.number == 1 && f.wire_type == 0) e->ts = f.value;
    if (f.number == 2 && f.wire_type == 0) e->pid = static_cast<uint32_t>(f.value);
    if (f.wire_type != 2) continue;
    if (f.number == perfetto_read::kGeneric) {
      e->generic = true;
      auto g = ParseWire(f.bytes);
      if (!g) return false;
      for (const WireField& gf : *g) {
        if (gf.number == 1) e->kind = std::string(gf.bytes);
        if (gf.number != 2) continue;
        auto field = ParseWire(gf.bytes);
        if (!field) return false;
        std::string name;
        for (const WireField& x : *field) {
          if (x.number == 1) name = std::string(x.bytes);
          if (x.number == 3) e->strings[name] = std::string(x.bytes);
          if (x.number == 4 || x.number == 5) e->ints[name] = static_cast<int64_t>(x.value);
        }
      }
      continue;
    }
    auto it = perfetto_read::TypedEvents().find(f.number);
    if (it == perfetto_read::TypedEvents().end()) continue;
    e->kind = it->second;
    auto t = ParseWire(f.bytes);
    if (!t) return false;
    for (const WireField& tf : *t) {
      const std::string name = perfetto_read::TypedStringField(e->kind, tf.number);
      if (!name.empty() && tf.wire_type == 2) e->strings[name] = std::string(tf.bytes);
      if (tf.wire_type == 0) e->ints[std::to_string(tf.number)] = static_cast<int64_t>(tf.value);
    }
  }
  return true;
}

inline void ReadPacketPayloads(const std::vector<WireField>& p, uint32_t seq, uint32_t machine,
                               ReadTrace* t) {
  namespace pr = perfetto_read;
  for (const WireField& f : p) {
    if (f.wire_type != 2) continue;
    auto sub = ParseWire(f.bytes);
    if (!sub) {
      t->ok = false;
      t->error = "bad submessage " + std::to_string(f.number);
      return;
    }
    if (f.number == pr::kSystemInfo) {
      if (t->packets == 1) t->system_info_first = true;
      for (const WireField& s : *sub) {
        if (s.number == 8) t->num_cpus = s.value;
        if (s.number == 17) t->machine_names.emplace_back(s.bytes);
        if (s.number != 1) continue;
        if (auto un = ParseWire(s.bytes)) {
          for (const WireField& u : *un)
            if (u.number == 3 && machine == 0) t->release = std::string(u.bytes);
        }
      }
    } else if (f.number == pr::kFtraceEvents) {
      t->bundles++;
      uint32_t cpu = 0;
      for (const WireField& b : *sub) {
        if (b.number == 1) cpu = static_cast<uint32_t>(b.value);
        if (b.number == 3 && b.value != 0) t->lost_bundles++;
      }
      for (const WireField& b : *sub) {
        if (b.number != 2) continue;
        ReadEvent e;
        e.sequence = seq;
        e.machine = machine;
        e.cpu = cpu;
        if (!ReadFtraceEvent(b.bytes, &e)) {
          t->ok = false;
          t->error = "bad FtraceEvent";
          return;
        }
        t->events.push_back(std::move(e));
      }
    } else if (f.number == pr::kProcessTree) {
      for (const WireField& th : *sub) {
        if (th.number != 2) continue;  // process_tree.proto: threads = 2
        int64_t tid = 0;
        std::string name;
        if (auto x = ParseWire(th.bytes)) {
          for (const WireField& y : *x) {
            if (y.number == 1) tid = static_cast<int64_t>(y.value);  // Thread.tid = 1
            if (y.number == 2) name = std::string(y.bytes);          // Thread.name = 2
          }
        }
        t->thread_names.push_back({tid, name});
      }
    } else if (f.number == pr::kClockSnapshot) {
      t->clock_snapshots++;
    } else if (f.number == pr::kRemoteClockSync) {
      t->remote_clock_syncs++;
    } else if (f.number == pr::kTrackDescriptor) {
      for (const WireField& d : *sub)
        if (d.number == 2) t->track_names.emplace_back(d.bytes);  // TrackDescriptor.name = 2
    } else if (f.number == pr::kTrackEvent) {
      uint64_t type = 0;  // track_event.proto: type = 9 (3 = TYPE_INSTANT), name = 23
      std::string name;
      for (const WireField& d : *sub) {
        if (d.number == 9) type = d.value;
        if (d.number == 23) name = std::string(d.bytes);
      }
      if (type == 3) {
        t->instants++;
        t->instant_names.push_back(name);
      }
    }
  }
}

inline ReadTrace ReadPerfettoTrace(std::string_view file) {
  ReadTrace t;
  auto top = ParseWire(file);
  if (!top) {
    t.ok = false;
    t.error = "the file is not protobuf wire format";
    return t;
  }
  for (const WireField& f : *top) {
    if (f.number != 1 || f.wire_type != 2) {
      t.ok = false;
      t.error = "Trace holds a field other than packet = 1";
      return t;
    }
    t.packets++;
    auto p = ParseWire(f.bytes);
    if (!p) {
      t.ok = false;
      t.error = "bad TracePacket";
      return t;
    }
    uint32_t seq = 0, machine = 0;
    for (const WireField& x : *p) {
      if (x.number == perfetto_read::kTrustedSequenceId) seq = static_cast<uint32_t>(x.value);
      if (x.number == perfetto_read::kMachineId) machine = static_cast<uint32_t>(x.value);
    }
    ReadPacketPayloads(*p, seq, machine, &t);
    if (!t.ok) return t;
  }
  return t;
}

}  // namespace hvtrace::test

#endif  // HVTRACE_TESTS_UNIT_SHARED_DECODE_PERFETTO_READER_H_
