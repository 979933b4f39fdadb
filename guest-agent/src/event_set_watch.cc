#include "event_set_watch.h"

#include "text_areas.h"

namespace hvtrace::agent {
namespace {

// FNV-1a, 64 bits: a change detector, not a defence (the guest is ours).
uint64_t Fnv(uint64_t h, std::string_view text) {
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

uint64_t EventSetSignature(std::string_view proc_modules, std::string_view dynamic_events) {
  uint64_t h = 0xcbf29ce484222325ull;
  while (!proc_modules.empty()) {
    const size_t nl = proc_modules.find('\n');
    const std::string_view line = proc_modules.substr(0, nl);
    proc_modules.remove_prefix(nl == std::string_view::npos ? proc_modules.size() : nl + 1);
    // "name size refs deps state addr": the name if the state is Live.
    const size_t name_end = line.find(' ');
    if (name_end == std::string_view::npos || line.find(" Live ") == std::string_view::npos) {
      continue;
    }
    h = Fnv(h, line.substr(0, name_end));
    h = Fnv(h, "\n");
  }
  h = Fnv(h, "\x01");
  return Fnv(h, dynamic_events);
}

bool EventSetWatch::Observe(uint64_t signature, uint64_t now_ns) {
  last_read_ns_ = now_ns;
  if (!published_) {
    published_ = signature;
    candidate_ = signature;
    return false;
  }
  if (signature != candidate_) {
    candidate_ = signature;
    candidate_since_ns_ = now_ns;
    return false;
  }
  if (signature == *published_ || now_ns < candidate_since_ns_ + settle_ns_) return false;
  published_ = signature;
  ++changes_;
  return true;
}

uint64_t ReadEventSetSignature(const std::string& proc, const std::string& tracefs) {
  int error = 0;
  const std::string modules = ReadWholeFile(proc + "/modules", &error);
  const std::string dynamic = ReadWholeFile(tracefs + "/dynamic_events", &error);
  return EventSetSignature(modules, dynamic);
}

}  // namespace hvtrace::agent
