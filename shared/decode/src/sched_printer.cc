// plugin_sched_switch's handlers as compiled printers (see sched_printer.h).
#include "sched_printer.h"

#include <traceevent/event-parse.h>

#include <cstring>
#include <string>

#include "event_text.h"

namespace hvtrace {
namespace {

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
  static void State(std::string* out, int val) {
    static const char kStates[] = "SDTtZXxW";
    bool found = false;
    for (int i = 0; i < 8; ++i) {
      if (!(val & (1 << i))) continue;
      if (found) out->push_back('|');
      found = true;
      out->push_back(kStates[i]);
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
