// plugin_sched_switch's handlers as compiled printers (see sched_printer.h).
#include "sched_printer.h"

#include <traceevent/event-parse.h>

#include <cstring>
#include <optional>
#include <string>

#include "event_text.h"
#include "tep_setup.h"

namespace hvtrace {
namespace {

// What the installed plugin_sched_switch prints for prev_state: a letter per
// set bit, joined by '|', or 'R' for none, with the letters of its own table:
// "SDTtZXxW" in libtraceevent 1.7 (Debian 12), "SDTtXZPI" in 1.8 (Debian 13,
// the kernel's order since 4.14; seen as trace-cmd 3.3 printing 'Z' where
// this printer had said 'X', tests/run.sh in a trixie container,
// 2026-12-03). letter[i] is 0 for a bit the plugin does not name.
struct StateLetters {
  char letter[16] = {};
};

// The plugin's sched_switch text for |state| on a throwaway handle and a
// format of our own (no guest text, no comm registered on a real handle).
std::string PluginStateText(tep_handle* tep, int id, uint64_t state) {
  unsigned char data[64] = {};
  data[0] = static_cast<unsigned char>(id);
  data[8] = 'a';
  data[24] = 1;  // prev_pid
  std::memcpy(data + 32, &state, sizeof state);
  data[40] = 'b';
  data[56] = 2;  // next_pid
  tep_record rec{};
  rec.data = data;
  rec.size = sizeof data;
  rec.record_size = sizeof data;
  trace_seq seq;
  trace_seq_init(&seq);
  tep_print_event(tep, &seq, &rec, "%s", TEP_PRINT_INFO);
  std::string text(seq.buffer, seq.len);
  trace_seq_destroy(&seq);
  // "a:1 [0] S|D ==> b:2 [0]": the part between the prio and the arrow.
  const size_t from = text.find("[0] "), to = text.find(" ==> ");
  if (from == std::string::npos || to == std::string::npos || to < from + 4) return "?";
  return text.substr(from + 4, to - from - 4);
}

// Asks the plugin once per process. Null when it is not there or its answers
// fit no per-bit table (a plugin that names states some other way): its
// sched_switch lines are then left to it.
const StateLetters* ProbeStateLetters() {
  static const std::optional<StateLetters> probed = []() -> std::optional<StateLetters> {
    static constexpr char kFormat[] =
        "name: sched_switch\nID: 1\nformat:\n"
        "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
        "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
        "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
        "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
        "\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n"
        "\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;\n"
        "\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;\n"
        "\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;\n"
        "\tfield:char next_comm[16];\toffset:40;\tsize:16;\tsigned:0;\n"
        "\tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;\n"
        "\tfield:int next_prio;\toffset:60;\tsize:4;\tsigned:1;\n\n"
        "print fmt: \"prev_comm=%s prev_pid=%d prev_prio=%d prev_state=%ld ==> next_comm=%s "
        "next_pid=%d next_prio=%d\", REC->prev_comm, REC->prev_pid, REC->prev_prio, "
        "REC->prev_state, REC->next_comm, REC->next_pid, REC->next_prio\n";
    tep_handle* tep = tep_alloc();
    if (tep == nullptr) return std::nullopt;
    tep_plugin_list* plugins = LoadTepPlugins(tep);
    tep_set_file_bigendian(tep, TEP_LITTLE_ENDIAN);
    tep_set_local_bigendian(tep, TEP_LITTLE_ENDIAN);
    tep_set_long_size(tep, 8);
    std::optional<StateLetters> out;
    tep_event* event = nullptr;
    if (tep_parse_event(tep, kFormat, sizeof kFormat - 1, "sched") == 0)
      event = tep_find_event_by_name(tep, "sched", "sched_switch");
    if (event != nullptr && event->handler != nullptr) {
      StateLetters t;
      bool fits = PluginStateText(tep, 1, 0) == "R";
      for (int i = 0; i < 16 && fits; ++i) {
        const std::string one = PluginStateText(tep, 1, uint64_t{1} << i);
        if (one.size() != 1) fits = false;
        if (one != "R") t.letter[i] = one[0];
      }
      // The rule checked on values with several bits, set and unset.
      for (uint64_t v : {0x3ull, 0x30ull, 0x81ull, 0xc0ull, 0x7fffull, 0x10001ull}) {
        if (!fits) break;
        std::string want;
        for (int i = 0; i < 16; ++i) {
          if (!(v & (uint64_t{1} << i)) || t.letter[i] == 0) continue;
          if (!want.empty()) want.push_back('|');
          want.push_back(t.letter[i]);
        }
        fits = PluginStateText(tep, 1, v) == (want.empty() ? "R" : want);
      }
      if (fits) out = t;
    }
    tep_unload_plugins(plugins, tep);
    tep_free(tep);
    return out;
  }();
  return probed ? &*probed : nullptr;
}

// plugin_sched_switch's handlers, including their tep_register_comm() calls.
class SchedPrinter : public EventPrinter {
 public:
  struct F {
    uint32_t offset = 0, size = 0;
    bool present = false;
  };
  tep_handle* tep = nullptr;
  bool is_switch = false;
  F prev_pid, prev_comm, prev_prio, prev_state, next_pid, next_comm, next_prio;
  F pid, comm, prio, success, target_cpu;

  static uint64_t Read(const unsigned char* data, const F& f) {
    uint64_t v = 0;
    std::memcpy(&v, data + f.offset, f.size);  // tep_read_number_field: no record bound.
    return v;
  }
  void Comm(const unsigned char* data, const F& f, uint64_t pid_value, std::string* out) {
    const char* s = reinterpret_cast<const char*>(data + f.offset);
    size_t n = strnlen(s, f.size);
    size_t start = out->size();
    out->append(s, n);
    tep_register_comm(tep, out->c_str() + start, static_cast<int>(pid_value));
  }
  const StateLetters* states = nullptr;
  void State(std::string* out, int val) const {
    bool found = false;
    for (int i = 0; i < 16; ++i) {
      if (!(val & (1 << i)) || states->letter[i] == 0) continue;
      if (found) out->push_back('|');
      found = true;
      out->push_back(states->letter[i]);
    }
    if (!found) out->push_back('R');
  }

  void Print(const unsigned char* data, uint32_t, std::string* out) override {
    if (is_switch) {
      uint64_t v = Read(data, prev_pid);
      if (prev_comm.present) {
        Comm(data, prev_comm, v, out);
        out->push_back(':');
      }
      AppendInt(out, static_cast<long long>(v));
      out->push_back(' ');
      if (prev_prio.present) {
        out->push_back('[');
        AppendInt(out, static_cast<int>(Read(data, prev_prio)));
        out->append("] ");
      }
      if (prev_state.present) State(out, static_cast<int>(Read(data, prev_state)));
      out->append(" ==> ");
      v = Read(data, next_pid);
      if (next_comm.present) {
        Comm(data, next_comm, v, out);
        out->push_back(':');
      }
      AppendInt(out, static_cast<long long>(v));
      if (next_prio.present) {
        out->append(" [");
        AppendInt(out, static_cast<int>(Read(data, next_prio)));
        out->push_back(']');
      }
      return;
    }
    uint64_t v = Read(data, pid);
    if (comm.present) {
      Comm(data, comm, v, out);
      out->push_back(':');
    }
    AppendInt(out, static_cast<long long>(v));
    if (prio.present) {
      out->append(" [");
      AppendInt(out, static_cast<long long>(Read(data, prio)));
      out->push_back(']');
    }
    if (success.present) {
      out->append(" success=");
      AppendInt(out, static_cast<long long>(Read(data, success)));
    }
    if (target_cpu.present) {
      out->append(" CPU:");
      AppendUintZeroPad(out, Read(data, target_cpu), 3);
    }
  }
};

bool NumberField(tep_event* event, const char* name, SchedPrinter::F* f) {
  tep_format_field* field = tep_find_any_field(event, name);
  if (field == nullptr) return true;  // Optional; the handler skips it too.
  if (field->offset < 0 ||
      (field->size != 1 && field->size != 2 && field->size != 4 && field->size != 8)) {
    return false;  // The handler would print '!' or skip; leave it to libtraceevent.
  }
  f->offset = static_cast<uint32_t>(field->offset);
  f->size = static_cast<uint32_t>(field->size);
  f->present = true;
  return true;
}

bool CommField(tep_event* event, const char* name, SchedPrinter::F* f) {
  tep_format_field* field = tep_find_any_field(event, name);
  if (field == nullptr) return true;
  if (field->offset < 0 || field->size <= 0 || field->size > 256) return false;
  f->offset = static_cast<uint32_t>(field->offset);
  f->size = static_cast<uint32_t>(field->size);
  f->present = true;
  return true;
}

}  // namespace

std::unique_ptr<EventPrinter> CompileSchedPrinter(tep_handle* tep, tep_event* event,
                                                  bool is_switch) {
  auto p = std::make_unique<SchedPrinter>();
  p->tep = tep;
  p->is_switch = is_switch;
  if (is_switch) {
    p->states = ProbeStateLetters();
    if (p->states == nullptr) return nullptr;
  }
  bool ok;
  if (is_switch) {
    ok = NumberField(event, "prev_pid", &p->prev_pid) &&
         CommField(event, "prev_comm", &p->prev_comm) &&
         NumberField(event, "prev_prio", &p->prev_prio) &&
         NumberField(event, "prev_state", &p->prev_state) &&
         NumberField(event, "next_pid", &p->next_pid) &&
         CommField(event, "next_comm", &p->next_comm) &&
         NumberField(event, "next_prio", &p->next_prio);
    // Without a pid the handler prints '!' and stops; leave that to it.
    ok = ok && p->prev_pid.present && p->next_pid.present;
  } else {
    ok = NumberField(event, "pid", &p->pid) && CommField(event, "comm", &p->comm) &&
         NumberField(event, "prio", &p->prio) && NumberField(event, "success", &p->success) &&
         NumberField(event, "target_cpu", &p->target_cpu) && p->pid.present;
  }
  if (!ok) return nullptr;
  return p;
}

}  // namespace hvtrace
