// What the agent puts in the region's text areas (hvtrace/region.h): the
// kernel's text symbols and its saved_cmdlines, so the host prints function
// and task names for a kernel it never saw.
#ifndef HVTRACE_AGENT_TEXT_AREAS_H_
#define HVTRACE_AGENT_TEXT_AREAS_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "hvtrace/region.h"
#include "hvtrace/region_text.h"

namespace hvtrace::agent {

// The text symbols of /proc/kallsyms, compressed. Reading ~160k lines and
// compressing ~4.7 MB takes seconds in a TCG guest, so it runs once per
// agent (one boot) on a worker thread while the pump goes on; the region is
// written by the agent's own thread once the result is ready.
class SymbolSource {
 public:
  struct Symbols {
    region::SymbolsState state = region::kSymbolsPending;
    EncodedText text;
    std::string note;  // For the agent's log: sizes and times, or why not.
  };

  explicit SymbolSource(std::string kallsyms_path) : path_(std::move(kallsyms_path)) {}
  ~SymbolSource();
  SymbolSource(const SymbolSource&) = delete;
  SymbolSource& operator=(const SymbolSource&) = delete;

  // Starts the worker the first time; later calls do nothing.
  void Start();
  // The result once the worker finished, else nullptr.
  const Symbols* Ready() const {
    return done_.load(std::memory_order_acquire) ? &result_ : nullptr;
  }

 private:
  void Work();

  std::string path_;
  std::thread worker_;
  std::atomic<bool> done_{false};
  Symbols result_;
};

// Whole file |path| (no size cap), or "" and |*error| set.
std::string ReadWholeFile(const std::string& path, int* error);

}  // namespace hvtrace::agent

#endif  // HVTRACE_AGENT_TEXT_AREAS_H_
