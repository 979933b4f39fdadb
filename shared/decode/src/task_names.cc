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

// The record's task (trace_entry.common_pid); 0 when the record is too short.
int32_t CommonPid(std::span<const std::byte> payload) {
  int32_t pid = 0;
  if (payload.size() >= 8) std::memcpy(&pid, payload.data() + 4, 4);
  return pid;
}

// |s| without blanks at either end, as the format parser trims.
std::string_view TrimBlanks(std::string_view s) {
  auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

// The event name on |text|'s first line ("name: NAME"), as ParseEventFormat
// reads it; nullopt when the text does not start so (it is parsed then).
std::optional<std::string_view> FirstLineName(std::string_view text) {
  const std::string_view line = TrimBlanks(text.substr(0, text.find('\n')));
  if (!line.starts_with("name:")) return std::nullopt;
  return TrimBlanks(line.substr(5));
}

// Whether SpecFor knows event |system|:|name|.
bool StatesNames(std::string_view system, std::string_view name) {
  static constexpr std::string_view kSched[] = {
      "sched_switch",       "sched_wakeup",       "sched_wakeup_new",
      "sched_waking",       "sched_process_exit", "sched_process_free",
      "sched_migrate_task", "sched_process_fork", "sched_process_exec"};
  if (system == "task") return name == "task_newtask" || name == "task_rename";
  return std::find(std::begin(kSched), std::end(kSched), name) != std::end(kSched);
}

}  // namespace

struct TaskNameTimeline::Impl {
  static constexpr uint32_t kNoSpan = UINT32_MAX;
  // Statements kept from pass 1 for pass 2 (MostUsedNames), at most this
  // many (64 bytes each): past it pass 2 reads the rest from the records.
  static constexpr size_t kMaxKept = size_t{1} << 20;

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
    // MostUsedNames: the pid's names and how many of its records each
    // named, in the order first counted; |current| is |name|'s slot there
    // (-1: not looked up since |name| last changed).
    std::vector<std::pair<Name, uint64_t>> counts;
    int32_t current = -1;
  };

  // A statement pass 1 read, with its pid's entry (map nodes do not move).
  struct Kept {
    uint64_t record = 0;
    Pid* pid = nullptr;
    Fact fact;
  };

  // A record's statements for pass 2, read from it or taken from |kept|.
  struct Statements {
    Fact read[2];
    const Fact* fact[2] = {};
    Pid* pid[2] = {};
    size_t n = 0;
  };

  std::vector<std::optional<Spec>> specs;  // By event id.
  bool usable = false;
  std::unordered_map<int32_t, Pid> pids;  // Pids with a statement.
  // At most one per statement, so bounded by the records.
  std::vector<Span> spans;
  uint64_t record = 0;  // Index of the record in the current pass.
  uint64_t inferred = 0;
  Name out;
  // Pass 1 keeps the statements of records before |kept_through| (all of
  // them unless kMaxKept was reached): pass 2 then neither reads those
  // records' names again nor finds their pids by hash. Off: 0.
  bool keep = false;
  uint64_t kept_through = 0;
  std::vector<Kept> kept;
  size_t next_kept = 0;

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
  Pid& Learn(const Fact& f) {
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
    return s;
  }

  // Pass 2: the span holding the current record of pid |s|, if any.
  const Span* SpanAt(Pid& s) {
    while (s.cursor != kNoSpan && spans[s.cursor].end <= record) s.cursor = spans[s.cursor].next;
    if (s.cursor == kNoSpan || spans[s.cursor].first > record) return nullptr;
    return &spans[s.cursor];
  }

  // Pass 2: the statements of the current record |p| about pids > 0.
  void StatementsOf(std::span<const std::byte> p, Statements& st) {
    if (record < kept_through) {
      for (; next_kept < kept.size() && kept[next_kept].record == record; ++next_kept) {
        st.fact[st.n] = &kept[next_kept].fact;
        st.pid[st.n++] = kept[next_kept].pid;
      }
      return;
    }
    const size_t n = Facts(p, st.read);
    for (size_t i = 0; i < n; ++i) {
      if (st.read[i].pid <= 0) continue;
      st.fact[st.n] = &st.read[i];
      st.pid[st.n++] = &pids[st.read[i].pid];
    }
  }

  static void Set(Pid& s, const Name& name) {
    s.name = name;
    s.known = true;
    s.current = -1;
  }

  // Pass 2, one record: its statements applied (a rename's new name only
  // after it), and |named| called with its task's entry and its name at the
  // record's time, when the trace says it.
  template <typename Named>
  void Step(std::span<const std::byte> p, Named&& named) {
    Statements st;
    StatementsOf(p, st);
    for (size_t i = 0; i < st.n; ++i) {
      const Fact& f = *st.fact[i];
      if (!f.deferred) {
        Set(*st.pid[i], f.after);
      } else if (f.before) {
        Set(*st.pid[i], *f.before);
      }
    }
    const int32_t pid = CommonPid(p);
    if (pid > 0) {
      // A record states its own task's name mostly (sched_switch's prev):
      // its entry is at hand then.
      Pid* s = nullptr;
      for (size_t i = 0; i < st.n && s == nullptr; ++i) {
        if (st.fact[i]->pid == pid) s = st.pid[i];
      }
      if (s == nullptr) {
        if (auto it = pids.find(pid); it != pids.end()) s = &it->second;
      }
      if (s != nullptr) {
        if (const Span* span = SpanAt(*s)) {
          ++inferred;
          named(*s, span->name, true);
        } else if (s->known) {
          named(*s, s->name, false);
        }
      }
    }
    for (size_t i = 0; i < st.n; ++i) {
      if (st.fact[i]->deferred) Set(*st.pid[i], st.fact[i]->after);
    }
    ++record;
  }
};

TaskNameTimeline::TaskNameTimeline(const std::vector<FormatText>& formats, bool keep_statements)
    : impl_(std::make_unique<Impl>()) {
  impl_->keep = keep_statements;
  impl_->kept_through = keep_statements ? UINT64_MAX : 0;
  for (const FormatText& ft : formats) {
    if (ft.system != "sched" && ft.system != "task") continue;
    // Only the events above state names: the others are not parsed (a
    // capture's formats hold ~30 sched events; parsing them all was ~1 M
    // instructions at each panic, callgrind of hvtraced).
    if (const std::optional<std::string_view> name = FirstLineName(ft.text);
        name && !StatesNames(ft.system, *name)) {
      continue;
    }
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
  if (m.keep && m.kept.size() + 2 > Impl::kMaxKept) {
    m.keep = false;
    m.kept_through = m.record;
  }
  for (size_t i = 0; i < n; ++i) {
    if (facts[i].pid <= 0) continue;
    Impl::Pid& s = m.Learn(facts[i]);
    if (m.keep) m.kept.push_back({m.record, &s, facts[i]});
  }
  ++m.record;
}

void TaskNameTimeline::StartNaming() {
  Impl& m = *impl_;
  for (auto& [pid, s] : m.pids) {
    s.known = s.first_before.has_value();
    if (s.known) s.name = *s.first_before;
    s.cursor = s.head;
    s.current = -1;
  }
  m.keep = false;
  m.record = 0;
  m.inferred = 0;
  m.next_kept = 0;
}

const char* TaskNameTimeline::Next(std::span<const std::byte> payload) {
  Impl& m = *impl_;
  const char* result = nullptr;
  m.Step(payload, [&](Impl::Pid&, const Name& name, bool) {
    m.out = name;
    result = m.out.text;
  });
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

// The slot of |name| in |counts|, added with no records when new.
size_t SlotOf(std::vector<std::pair<Name, uint64_t>>& counts, const Name& name) {
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i].first == name) return i;
  }
  counts.emplace_back(name, 0);
  return counts.size() - 1;
}

// The fallback's lines ("pid comm") for the pids |named| does not name.
void AppendFallback(std::string_view fallback, const auto& named, std::string& out) {
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
    if (!digits || pid > INT32_MAX || named(static_cast<int32_t>(pid))) continue;
    out.append(line);
    out.push_back('\n');
  }
}

}  // namespace

std::string MostUsedNames(const std::vector<FormatText>& formats, const PageLayout& layout,
                          const std::vector<std::vector<std::span<const std::byte>>>& cpus,
                          std::string_view fallback, TaskNameStats* stats) {
  TaskNameStats local;
  TaskNameStats& st = stats != nullptr ? *stats : local;
  st = {};
  // A capture's records, bounded by its region: pass 1 keeps what it read
  // for pass 2 (Kept).
  TaskNameTimeline timeline(formats, /*keep_statements=*/true);
  TaskNameTimeline::Impl& m = *timeline.impl_;
  // Per pid that names records: its entry, sorted by pid below.
  std::vector<std::pair<int32_t, const TaskNameTimeline::Impl::Pid*>> named;
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
    st.events = merged.size();
    for (std::span<const std::byte> p : merged) {
      m.Step(p, [&](TaskNameTimeline::Impl::Pid& s, const Name& name, bool from_span) {
        if (s.counts.empty()) named.emplace_back(CommonPid(p), &s);
        if (from_span) {
          ++s.counts[SlotOf(s.counts, name)].second;
          return;
        }
        if (s.current < 0) s.current = static_cast<int32_t>(SlotOf(s.counts, name));
        ++s.counts[static_cast<size_t>(s.current)].second;
      });
    }
    st.inferred = timeline.inferred();
  }
  std::sort(named.begin(), named.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out;
  for (const auto& [pid, s] : named) {
    const auto best =
        std::max_element(s->counts.begin(), s->counts.end(), [](const auto& a, const auto& b) {
          return a.second < b.second;  // max_element keeps the first of equals.
        });
    uint64_t total = 0;
    for (const auto& entry : s->counts) total += entry.second;
    st.named += total;
    st.not_most_used += total - best->second;
    st.renamed_pids += s->counts.size() > 1;
    out += std::to_string(pid);
    out += ' ';
    out += best->first.text;
    out += '\n';
  }
  st.pids = named.size();
  AppendFallback(
      fallback,
      [&](int32_t pid) {
        return std::binary_search(named.begin(), named.end(), std::pair{pid, nullptr},
                                  [](const auto& a, const auto& b) { return a.first < b.first; });
      },
      out);
  return out;
}

}  // namespace hvtrace
