#include "task_name_agreement.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include "trace_text.h"

namespace hvtrace::e2e {
namespace {

using nlohmann::json;

// The kernel's comm after an exec of |filename|: kbasename cut to 15 bytes.
std::string ExecComm(const std::string& filename) {
  return filename.substr(filename.rfind('/') + 1).substr(0, 15);
}

}  // namespace

// `hvtrace show --json`'s output: the events, and the boot file lines.
void ParseShown(const std::string& out, std::vector<Event>* events,
                std::vector<std::string>* boot_files) {
  for (const std::string& line : TextLines(out)) {
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << line;
    if (j.contains("crash")) continue;  // The crash summary `show --json` opens with.
    if (!j.contains("event")) {
      boot_files->push_back(j["file"].get<std::string>());
      continue;
    }
    events->push_back({j["cpu"].get<int>(), j["pid"].get<int>(), j["comm"].get<std::string>(),
                       j["event"].is_string() ? j["event"].get<std::string>() : "",
                       j.contains("fields") ? j["fields"] : json::object()});
  }
}

std::vector<std::string> KernelNames(const std::vector<Event>& events, bool at_switch_only) {
  std::vector<std::string> ref(events.size());
  std::map<int, std::vector<size_t>> pending;  // Per CPU, since its last switch.
  struct Run {
    int pid = -1;
    std::string comm;  // "": not known.
  };
  std::map<int, Run> running;  // Per CPU.
  // Pending events of |pid| on |on_cpu| get |name| ("": left out).
  auto settle = [&](std::vector<size_t>& on_cpu, int pid, const std::string& name) {
    std::erase_if(on_cpu, [&](size_t j) {
      if (events[j].pid != pid) return false;
      ref[j] = name;
      return true;
    });
  };
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    std::vector<size_t>& on_cpu = pending[e.cpu];
    Run& run = running[e.cpu];
    on_cpu.push_back(i);
    if (!at_switch_only && e.name == "task_rename" && e.pid != 0 &&
        e.fields.value("pid", -1) == e.pid) {
      settle(on_cpu, e.pid, e.fields.value("oldcomm", std::string()));
      if (run.pid == e.pid) run.comm = e.fields.value("newcomm", std::string());
      continue;
    }
    if (!at_switch_only && e.name == "sched_process_exec" && e.pid != 0 &&
        e.fields.value("pid", -1) == e.pid) {
      on_cpu.pop_back();
      settle(on_cpu, e.pid, run.pid == e.pid ? run.comm : "");
      // The exec runs under the name it gave (begin_new_exec sets it first),
      // whatever the program renames itself to next (busybox run as
      // /proc/self/exe renames itself to the applet).
      ref[i] = ExecComm(e.fields.value("filename", std::string()));
      if (run.pid == e.pid) run.comm = ref[i];
      continue;
    }
    if (e.name != "sched_switch") continue;
    const int prev_pid = e.fields.value("prev_pid", -1);
    const std::string prev_comm = e.fields.value("prev_comm", std::string());
    for (size_t j : on_cpu) {
      if (events[j].pid == prev_pid && events[j].pid != 0) ref[j] = prev_comm;
    }
    on_cpu.clear();
    run = {e.fields.value("next_pid", -1), e.fields.value("next_comm", std::string())};
  }
  return ref;
}

Agreement Compare(const std::vector<std::string>& ref, const std::vector<std::string>& names) {
  Agreement a;
  for (size_t i = 0; i < ref.size() && i < names.size(); ++i) {
    if (ref[i].empty()) continue;
    ++a.compared;
    a.agree += names[i] == ref[i];
  }
  return a;
}

std::vector<std::string> ShownNames(const std::vector<Event>& events) {
  std::vector<std::string> names;
  names.reserve(events.size());
  for (const Event& e : events) names.push_back(e.comm);
  return names;
}

void PrintDisagreements(const char* tag, const std::vector<Event>& events,
                        const std::vector<std::string>& ref, const std::vector<std::string>& names,
                        size_t max) {
  size_t printed = 0;
  for (size_t i = 0; i < events.size() && i < ref.size() && i < names.size() && printed < max;
       ++i) {
    if (ref[i].empty() || ref[i] == names[i]) continue;
    ++printed;
    std::printf("[%s] event %zu cpu %d pid %d %s: show '%s', kernel '%s'\n", tag, i, events[i].cpu,
                events[i].pid, events[i].name.c_str(), names[i].c_str(), ref[i].c_str());
  }
}

}  // namespace hvtrace::e2e
