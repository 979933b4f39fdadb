// Noticing that the guest's set of trace events changed (a module with
// events loaded or unloaded, a kprobe or synthetic event added or removed),
// so the agent re-publishes its formats: the metadata channel's boot archive
// (meta_sender.h) and the attach-mode format table (agent.cc). Module events
// appear after the agent started: a capture decoded with the formats of the
// agent's start would print them raw.
//
// Cheap on purpose: at most one look per |period|, reading /proc/modules
// (only the names of live modules count: the use counts change all the time)
// and tracefs dynamic_events, a few kilobytes. A change is reported once the
// signature has held for |settle| (an insmod of A then B costs one rebuild,
// not two).
#ifndef HVTRACE_AGENT_EVENT_SET_WATCH_H_
#define HVTRACE_AGENT_EVENT_SET_WATCH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace hvtrace::agent {

// The signature of an event set: a hash of the live modules' names in
// |proc_modules| (the text of /proc/modules; lines "name size refs deps
// state addr", state "Live" counts) and of |dynamic_events| as is.
uint64_t EventSetSignature(std::string_view proc_modules, std::string_view dynamic_events);

// The decision, without I/O: fed signatures with the time they were read.
class EventSetWatch {
 public:
  EventSetWatch(uint64_t period_ns = 1000000000ull, uint64_t settle_ns = 500000000ull)
      : period_ns_(period_ns), settle_ns_(settle_ns) {}

  // Whether a signature should be read now (a period passed since the last).
  bool Due(uint64_t now_ns) const {
    return !last_read_ns_ || now_ns >= *last_read_ns_ + period_ns_;
  }
  // Takes a signature read at |now_ns|; true once per change, when the new
  // signature has been the same for |settle|. The first signature sets the
  // baseline (what the agent's first publication covers) and reports nothing.
  bool Observe(uint64_t signature, uint64_t now_ns);
  uint64_t changes() const { return changes_; }

 private:
  uint64_t period_ns_, settle_ns_;
  std::optional<uint64_t> last_read_ns_;
  std::optional<uint64_t> published_;  // What the last publication covered.
  uint64_t candidate_ = 0;
  uint64_t candidate_since_ns_ = 0;
  uint64_t changes_ = 0;
};

// Reads the signature of the running guest: |proc|/modules and
// |tracefs|/dynamic_events (either may be missing: a kernel without
// modules, or without dynamic events, counts as an empty file).
uint64_t ReadEventSetSignature(const std::string& proc, const std::string& tracefs);

}  // namespace hvtrace::agent

#endif  // HVTRACE_AGENT_EVENT_SET_WATCH_H_
