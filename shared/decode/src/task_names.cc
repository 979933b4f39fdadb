// TaskNameTimeline and MostUsedNames (hvtrace/task_names.h).
#include "hvtrace/task_names.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <unordered_map>
#include <utility>

#include "hvtrace/format.h"

namespace hvtrace {
namespace {

struct Name {
  char text[kMaxTaskName + 1] = {};
  uint8_t len = 0;
  bool operator==(const Name& o) const {
    return len == o.len && std::memcmp(text, o.text, len) == 0;
  }
};

// A field the timeline reads; size 0 = absent.
struct TaskField {
  uint32_t offset = 0;
  uint32_t size = 0;
};

enum class Kind : uint8_t { kSwitch, kCommPid, kFork, kExec, kNewTask, kRename };

// How one event id states names: |comm_a|/|pid_a| and |comm_b|/|pid_b| (the
// second pair for switch and fork), |extra| is exec's filename or rename's
// newcomm.
struct Spec {
  Kind kind = Kind::kCommPid;
  TaskField comm_a, pid_a, comm_b, pid_b, extra;
};

// One statement: pid |pid| is called |before| up to and including the
// record (when known) and |after| from the record on (after it, for a
// rename).
struct Fact {
  int32_t pid = 0;
  std::optional<Name> before;
  Name after;
  bool deferred = false;  // |after| applies only after the record (rename).
};

TaskField CommField(const EventFormat& f, std::string_view name) {
  const FieldFormat* field = f.FindField(name);
  if (field == nullptr || field->kind != FieldKind::kArray || !field->type.starts_with("char") ||
      field->size == 0) {
    return {};
  }
  return {field->offset, field->size};
}

TaskField PidField(const EventFormat& f, std::string_view name) {
  const FieldFormat* field = f.FindField(name);
  if (field == nullptr || field->kind != FieldKind::kScalar || field->size != 4) return {};
  return {field->offset, field->size};
}

std::optional<Spec> SpecFor(const EventFormat& f) {
  Spec s;
  if (f.system == "sched") {
    if (f.name == "sched_switch") {
      s = {Kind::kSwitch,           CommField(f, "prev_comm"),
           PidField(f, "prev_pid"), CommField(f, "next_comm"),
           PidField(f, "next_pid"), {}};
      if (s.comm_b.size == 0 || s.pid_b.size == 0) return std::nullopt;
    } else if (f.name == "sched_wakeup" || f.name == "sched_wakeup_new" ||
               f.name == "sched_waking" || f.name == "sched_process_exit" ||
               f.name == "sched_process_free" || f.name == "sched_migrate_task") {
      s = {Kind::kCommPid, CommField(f, "comm"), PidField(f, "pid"), {}, {}, {}};
    } else if (f.name == "sched_process_fork") {
      s = {Kind::kFork,
           CommField(f, "parent_comm"),
           PidField(f, "parent_pid"),
           CommField(f, "child_comm"),
           PidField(f, "child_pid"),
           {}};
      if (s.comm_b.size == 0 || s.pid_b.size == 0) return std::nullopt;
    } else if (f.name == "sched_process_exec") {
      const FieldFormat* file = f.FindField("filename");
      if (file == nullptr || file->kind != FieldKind::kDataLoc || file->size != 4)
        return std::nullopt;
      s = {Kind::kExec, {}, PidField(f, "pid"), {}, {}, {file->offset, 4}};
      if (s.pid_a.size == 0) return std::nullopt;
      return s;
    } else {
      return std::nullopt;
    }
  } else if (f.system == "task") {
    if (f.name == "task_newtask") {
      s = {Kind::kNewTask, CommField(f, "comm"), PidField(f, "pid"), {}, {}, {}};
    } else if (f.name == "task_rename") {
      // 6.12 has pid; later kernels dropped it (the task is current).
      TaskField pid = PidField(f, "pid");
      if (pid.size == 0) pid = PidField(f, "common_pid");
      s = {Kind::kRename, CommField(f, "oldcomm"), pid, {}, {}, CommField(f, "newcomm")};
      if (s.extra.size == 0) return std::nullopt;
    } else {
      return std::nullopt;
    }
  } else {
    return std::nullopt;
  }
  if (s.comm_a.size == 0 || s.pid_a.size == 0) return std::nullopt;
  return s;
}

bool ReadPid(std::span<const std::byte> p, TaskField f, int32_t* pid) {
  if (f.size != 4 || f.offset > p.size() || p.size() - f.offset < 4) return false;
  std::memcpy(pid, p.data() + f.offset, 4);
  return true;
}

// Copies a name of at most |max| bytes from |p|[offset..], cut at a NUL and
// at kMaxTaskName bytes.
bool ReadName(std::span<const std::byte> p, uint64_t offset, uint64_t max, Name* name) {
  if (offset > p.size()) return false;
  const uint64_t n = std::min<uint64_t>({max, p.size() - offset, kMaxTaskName});
  const char* src = reinterpret_cast<const char*>(p.data() + offset);
  size_t len = 0;
  while (len < n && src[len] != '\0') ++len;
  std::memcpy(name->text, src, len);
  name->text[len] = '\0';
  name->len = static_cast<uint8_t>(len);
  return true;
}

bool ReadComm(std::span<const std::byte> p, TaskField f, Name* name) {
  // The array must be inside the record, as the kernel writes it.
  if (f.size == 0 || f.offset > p.size() || p.size() - f.offset < f.size) return false;
  return ReadName(p, f.offset, f.size, name);
}

// kbasename(filename) cut to 15 bytes, from a __data_loc string.
bool ReadExecName(std::span<const std::byte> p, TaskField loc, Name* name) {
  uint32_t ref = 0;
  if (loc.offset > p.size() || p.size() - loc.offset < 4) return false;
  std::memcpy(&ref, p.data() + loc.offset, 4);
  const uint64_t start = ref & 0xffff, len = ref >> 16;
  if (start > p.size() || p.size() - start < len) return false;
  const char* text = reinterpret_cast<const char*>(p.data() + start);
  uint64_t end = 0;
  while (end < len && text[end] != '\0') ++end;
  uint64_t base = end;
  while (base > 0 && text[base - 1] != '/') --base;
  return ReadName(p, start + base, end - base, name);
}

Name FromText(const char* text) {
  Name n;
  n.len = static_cast<uint8_t>(strnlen(text, kMaxTaskName));
  std::memcpy(n.text, text, n.len);
  return n;
}

// The record's task (trace_entry.common_pid); 0 when the record is too short.
int32_t CommonPid(std::span<const std::byte> payload) {
  int32_t pid = 0;
  if (payload.size() >= 8) std::memcpy(&pid, payload.data() + 4, 4);
  return pid;
}

}  // namespace

struct TaskNameTimeline::Impl {
  static constexpr uint32_t kNoSpan = UINT32_MAX;

  // Records between two statements about one pid that disagree: from
  // |first| up to (not including) |end|, by record index in the pass. The
  // pid's records there take |name|, the later statement's; the earlier one
  // said otherwise.
  struct Span {
    uint64_t first = 0, end = 0;
    uint32_t next = kNoSpan;  // The pid's next span, later in the trace.
    Name name;
  };

  struct Pid {
    // Pass 1: the name after the pid's latest statement. Pass 2: the name
    // after its latest statement so far (|known|: there was one, or the
    // first one said what the pid was called before it).
    Name name;
    bool known = false;
    // Pass 1: what the pid's first statement says it was called before it.
    std::optional<Name> first_before;
    // The pid's spans, oldest first: a list through Span::next. |cursor|:
    // pass 2's next one.
    uint32_t head = kNoSpan, tail = kNoSpan, cursor = kNoSpan;
    // Pass 1: the record of its latest statement.
    uint64_t stated = 0;
  };

  std::vector<std::optional<Spec>> specs;  // By event id.
  bool usable = false;
  std::unordered_map<int32_t, Pid> pids;  // Pids with a statement.
  // At most one per statement, so bounded by the records.
  std::vector<Span> spans;
  uint64_t record = 0;  // Index of the record in the current pass.
  uint64_t inferred = 0;
  Name out;

  const Spec* SpecOf(std::span<const std::byte> p) const {
    if (p.size() < 8) return nullptr;
    uint16_t id = 0;
    std::memcpy(&id, p.data(), 2);
    return id < specs.size() && specs[id] ? &*specs[id] : nullptr;
  }

  // The statements of record |p| (at most two).
  size_t Facts(std::span<const std::byte> p, Fact facts[2]) const {
    const Spec* s = SpecOf(p);
    if (s == nullptr) return 0;
    size_t n = 0;
    Fact& a = facts[0];
    Name name;
    switch (s->kind) {
      case Kind::kSwitch:
      case Kind::kCommPid:
      case Kind::kFork:
      case Kind::kNewTask:
      case Kind::kRename:
        if (!ReadPid(p, s->pid_a, &a.pid) || !ReadComm(p, s->comm_a, &name)) return 0;
        a.after = name;
        // A new task did not exist before the record.
        if (s->kind != Kind::kNewTask) a.before = name;
        if (s->kind == Kind::kRename) {
          if (!ReadComm(p, s->extra, &a.after)) return 0;
          a.deferred = true;
        }
        n = 1;
        break;
      case Kind::kExec:
        if (!ReadPid(p, s->pid_a, &a.pid) || !ReadExecName(p, s->extra, &a.after)) return 0;
        n = 1;
        break;
    }
    if (s->kind == Kind::kSwitch || s->kind == Kind::kFork) {
      Fact& b = facts[1];
      if (ReadPid(p, s->pid_b, &b.pid) && ReadComm(p, s->comm_b, &b.after)) {
        if (s->kind == Kind::kSwitch) b.before = b.after;  // A fork child is new.
        n = 2;
      }
    }
    return n;
  }

  // Pass 1: statement |f| at the current record. The pid's records since
  // its previous statement are named by that one going forward; when |f|
  // says the pid was called something else up to here, the name changed
  // unrecorded in between (prctl(PR_SET_NAME) without task_rename, lost
  // events), most likely early (a forked busybox applet renames itself first
  // thing), so those records take |f|'s name. An exec does not say the old
  // name: the records before it keep the previous statement's. Only
  // statements come here: the other records cost pass 1 no lookup.
  void Learn(const Fact& f) {
    auto [it, added] = pids.try_emplace(f.pid);
    Pid& s = it->second;
    if (added) {
      s.first_before = f.before;
    } else if (f.before && !(*f.before == s.name) && record - s.stated > 1 &&
               spans.size() < kNoSpan) {
      spans.push_back({s.stated + 1, record, kNoSpan, *f.before});
      const uint32_t index = static_cast<uint32_t>(spans.size() - 1);
      (s.tail == kNoSpan ? s.head : spans[s.tail].next) = index;
      s.tail = index;
    }
    s.name = f.after;
    s.stated = record;
  }

  // Pass 2: the span holding the current record of pid |s|, if any.
  const Span* SpanAt(Pid& s) {
    while (s.cursor != kNoSpan && spans[s.cursor].end <= record) s.cursor = spans[s.cursor].next;
    if (s.cursor == kNoSpan || spans[s.cursor].first > record) return nullptr;
    return &spans[s.cursor];
  }
};

TaskNameTimeline::TaskNameTimeline(const std::vector<FormatText>& formats)
    : impl_(std::make_unique<Impl>()) {
  for (const FormatText& ft : formats) {
    if (ft.system != "sched" && ft.system != "task") continue;
    Result<EventFormat> f = ParseEventFormat(ft.system, ft.text);
    if (!f.ok() || f->id > 0xffff) continue;
    std::optional<Spec> spec = SpecFor(*f);
    if (!spec) continue;
    if (impl_->specs.size() <= f->id) impl_->specs.resize(f->id + 1);
    if (impl_->specs[f->id]) continue;  // Defined twice: the first wins, as in the decoder.
    impl_->specs[f->id] = spec;
    impl_->usable = true;
  }
}

TaskNameTimeline::~TaskNameTimeline() = default;

bool TaskNameTimeline::usable() const { return impl_->usable; }

uint64_t TaskNameTimeline::inferred() const { return impl_->inferred; }

void TaskNameTimeline::Scan(std::span<const std::byte> payload) {
  Impl& m = *impl_;
  Fact facts[2];
  const size_t n = m.Facts(payload, facts);
  for (size_t i = 0; i < n; ++i) {
    if (facts[i].pid > 0) m.Learn(facts[i]);
  }
  ++m.record;
}

void TaskNameTimeline::StartNaming() {
  Impl& m = *impl_;
  for (auto& [pid, s] : m.pids) {
    s.known = s.first_before.has_value();
    if (s.known) s.name = *s.first_before;
    s.cursor = s.head;
  }
  m.record = 0;
  m.inferred = 0;
}

const char* TaskNameTimeline::Next(std::span<const std::byte> payload) {
  Impl& m = *impl_;
  Fact facts[2];
  const size_t n = m.Facts(payload, facts);
  auto set = [&m](const Fact& f, const Name& name) {
    Impl::Pid& s = m.pids[f.pid];
    s.name = name;
    s.known = true;
  };
  for (size_t i = 0; i < n; ++i) {
    if (facts[i].pid <= 0) continue;
    if (!facts[i].deferred) {
      set(facts[i], facts[i].after);
    } else if (facts[i].before) {
      set(facts[i], *facts[i].before);
    }
  }
  const int32_t pid = CommonPid(payload);
  const char* result = nullptr;
  if (pid > 0) {
    if (auto it = m.pids.find(pid); it != m.pids.end()) {
      if (const Impl::Span* span = m.SpanAt(it->second)) {
        m.out = span->name;
        result = m.out.text;
        ++m.inferred;
      } else if (it->second.known) {
        m.out = it->second.name;
        result = m.out.text;
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (facts[i].pid > 0 && facts[i].deferred) set(facts[i], facts[i].after);
  }
  ++m.record;
  return result;
}

namespace {

// Every record of |cpus| in trace-cmd's merge order.
template <typename F>
void ForEachMerged(const PageLayout& layout,
                   const std::vector<std::vector<std::span<const std::byte>>>& cpus,
                   F&& on_record) {
  struct Cursor {
    const std::vector<std::span<const std::byte>>* pages = nullptr;
    size_t next_page = 0;
    std::optional<PageCursor> cursor;
    RawRecord record;
    bool has = false;
  };
  std::vector<Cursor> cs(cpus.size());
  auto advance = [&](Cursor& c) {
    for (;;) {
      if (c.cursor && c.cursor->Next(&c.record)) return (c.has = true);
      c.cursor.reset();
      if (c.next_page >= c.pages->size()) return (c.has = false);
      c.cursor.emplace((*c.pages)[c.next_page++], layout);
    }
  };
  for (size_t i = 0; i < cpus.size(); ++i) {
    cs[i].pages = &cpus[i];
    advance(cs[i]);
  }
  for (;;) {
    Cursor* best = nullptr;
    for (Cursor& c : cs) {
      if (c.has && (best == nullptr || c.record.timestamp < best->record.timestamp)) best = &c;
    }
    if (best == nullptr) return;
    on_record(best->record.payload);
    advance(*best);
  }
}

}  // namespace

std::string MostUsedNames(const std::vector<FormatText>& formats, const PageLayout& layout,
                          const std::vector<std::vector<std::span<const std::byte>>>& cpus,
                          std::string_view fallback, TaskNameStats* stats) {
  TaskNameStats local;
  TaskNameStats& st = stats != nullptr ? *stats : local;
  st = {};
  TaskNameTimeline timeline(formats);
  // Per pid, in the order first seen: each name and its event count.
  std::unordered_map<int32_t, std::vector<std::pair<Name, uint64_t>>> counts;
  std::vector<int32_t> order;
  if (timeline.usable()) {
    // The records in time order, merged once for both passes: walking and
    // merging the pages again was ~2 M of the ~13 M instructions this took
    // at a 6.12 panic (callgrind of hvtraced, bench/README.md).
    std::vector<std::span<const std::byte>> merged;
    ForEachMerged(layout, cpus, [&](std::span<const std::byte> p) {
      merged.push_back(p);
      timeline.Scan(p);
    });
    timeline.StartNaming();
    for (std::span<const std::byte> p : merged) {
      ++st.events;
      const char* name = timeline.Next(p);
      if (name == nullptr) continue;
      ++st.named;
      int32_t pid = 0;
      std::memcpy(&pid, p.data() + 4, 4);
      const Name n = FromText(name);
      auto [it, added] = counts.try_emplace(pid);
      if (added) order.push_back(pid);
      auto& names = it->second;
      auto found = std::find_if(names.begin(), names.end(),
                                [&](const auto& entry) { return entry.first == n; });
      if (found == names.end()) {
        names.emplace_back(n, 1);
      } else {
        ++found->second;
      }
    }
    st.inferred = timeline.inferred();
  }
  std::sort(order.begin(), order.end());
  std::string out;
  for (int32_t pid : order) {
    const auto& names = counts[pid];
    const auto best =
        std::max_element(names.begin(), names.end(), [](const auto& a, const auto& b) {
          return a.second < b.second;  // max_element keeps the first of equals.
        });
    uint64_t total = 0;
    for (const auto& entry : names) total += entry.second;
    st.not_most_used += total - best->second;
    st.renamed_pids += names.size() > 1;
    out += std::to_string(pid) + " " + best->first.text + "\n";
  }
  st.pids = order.size();
  // The fallback's lines for the pids the trace does not name.
  while (!fallback.empty()) {
    const size_t nl = fallback.find('\n');
    const std::string_view line = fallback.substr(0, nl);
    fallback.remove_prefix(nl == std::string_view::npos ? fallback.size() : nl + 1);
    const size_t space = line.find(' ');
    if (space == 0 || space == std::string_view::npos) continue;
    int64_t pid = 0;
    bool digits = space <= 10;
    for (size_t i = 0; digits && i < space; ++i) {
      digits = line[i] >= '0' && line[i] <= '9';
      pid = pid * 10 + (line[i] - '0');
    }
    if (!digits || pid > INT32_MAX || counts.contains(static_cast<int32_t>(pid))) continue;
    out.append(line);
    out.push_back('\n');
  }
  return out;
}

}  // namespace hvtrace
