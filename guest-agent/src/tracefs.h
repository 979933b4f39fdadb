// The few tracefs operations the agent needs, as plain file I/O. A Tracefs
// is rooted at the top level or at one instance (instances/NAME): the
// relative paths are the same.
//
// libtracefs does link statically here (checked: a static test binary built
// and ran), but it drags in libtraceevent, whose plugin loader makes a
// static link warn about dlopen, and ~0.5 MB for what is a handful of
// writes to "enable" files. Plain I/O also lets the pump read
// trace_pipe_raw non-blocking straight into buffers allocated once.
#ifndef HVTRACE_AGENT_TRACEFS_H_
#define HVTRACE_AGENT_TRACEFS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace hvtrace::agent {

class Tracefs {
 public:
  explicit Tracefs(std::string root) : root_(std::move(root)) {}
  const std::string& root() const { return root_; }

  // Whole small file (format, header_page, stats), or "" on error.
  std::string Read(const std::string& rel) const;
  bool Write(const std::string& rel, const std::string& value) const;
  bool Exists(const std::string& rel) const;

  // Events a request names: "sys:event", "sys:*" or "sys". Returns
  // "sys/event" pairs that exist; unknown names are left out.
  std::vector<std::string> Resolve(const std::string& spec) const;
  // The active clock from trace_clock ("[mono] local ..." -> "mono").
  std::string CurrentClock() const;
  // per_cpu/cpuN/stats "overrun: N".
  uint64_t Overrun(unsigned cpu) const;
  // per_cpu/cpuN/stats "entries: N": events buffered and not read yet.
  uint64_t Entries(unsigned cpu) const;

 private:
  std::string root_;
};

}  // namespace hvtrace::agent

#endif  // HVTRACE_AGENT_TRACEFS_H_
