// LazyFormats: a kernel's event formats, each parsed (ParseEventFormat)
// when an event of its id is first needed instead of all of them up front.
//
// trace-cmd stores every format of the system (~1,800 on bench/large.dat's
// kernel), while a trace uses a few dozen: parsing them all was 136 M of the
// ~310 M instructions `hvtrace report` ran before its first record
// (callgrind). Each text's id is read first (ScanEventFormatId: the "ID:"
// line, which the kernel writes second), so an event's candidates are known
// without parsing; a text whose id that cannot tell is parsed at once.
//
// What the decoder reports stays what parsing everything at its making
// reported: the format chosen for an id is the first of its texts (in file
// order) that parses, and Warnings() gives the same messages in the same
// order (each bad format, each later duplicate of an id). The formats no
// event asked for are parsed on a background thread at the lowest priority
// (StartBackground), so Warnings() at the end of a report rarely waits.
#ifndef HVTRACE_SHARED_DECODE_SRC_LAZY_FORMATS_H_
#define HVTRACE_SHARED_DECODE_SRC_LAZY_FORMATS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "hvtrace/format.h"
#include "hvtrace/result.h"
#include "hvtrace/tracedat.h"

namespace hvtrace {

class LazyFormats {
 public:
  static constexpr size_t kNone = static_cast<size_t>(-1);

  // Copies |texts| (the decoder may outlive its metadata) and reads their ids.
  explicit LazyFormats(const std::vector<FormatText>& texts);
  ~LazyFormats();  // Joins the background thread.
  LazyFormats(const LazyFormats&) = delete;
  LazyFormats& operator=(const LazyFormats&) = delete;

  // One more than the largest id any text can have; 0 when there is none.
  uint32_t id_limit() const { return static_cast<uint32_t>(candidates_.size()); }
  size_t size() const { return texts_.size(); }
  const FormatText& text(size_t index) const { return texts_[index]; }

  // The index of the format that defines event |id| (parsed), or kNone.
  size_t Resolve(uint32_t id);
  // The parse of text |index|; only after Resolve returned it or Complete().
  const Result<EventFormat>& Parsed(size_t index) const { return *results_[index]; }

  // The same as Resolve(id) then Parsed(), for a forked child (the trial
  // run): it parses the texts itself, since a thread that was parsing one
  // at the fork is not in the child, and leaves no trace in this object.
  std::optional<std::pair<EventFormat, size_t>> ResolveInChild(uint32_t id) const;

  // Parses the formats no one asked for yet on a thread of its own (nice 19:
  // it takes what the report leaves of the CPUs). Without one (too few
  // formats to pay for a thread, or none to be had) Complete() does it.
  void StartBackground();
  // Every text parsed and every id resolved.
  void Complete();
  // After Complete(): ParseEventFormat's error for each text that fails, and
  // "event id N (sys/name) defined twice; keeping the first" for each text
  // whose id an earlier one defines, in file order, each after "|source|: ".
  std::vector<std::string> Warnings(const std::string& source) const;
  // After Complete(): each id some text defines, with the index of its format.
  std::vector<std::pair<uint32_t, size_t>> Defined() const;

 private:
  enum State : uint8_t { kFree, kClaimed, kDone };
  // Parses text |index| unless done, or waits for the thread parsing it.
  void Ensure(size_t index);
  void ParseRest();

  std::vector<FormatText> texts_;
  // By id: the texts whose id it is, in file order.
  std::vector<std::vector<uint32_t>> candidates_;
  // By id: kNone, the chosen index, or unset (not resolved yet).
  std::vector<std::optional<size_t>> chosen_;
  std::vector<std::optional<Result<EventFormat>>> results_;
  std::unique_ptr<std::atomic<uint8_t>[]> states_;
  std::atomic<bool> stop_{false};  // The decoder is going: the thread stops early.
  std::thread background_;
};

}  // namespace hvtrace

#endif  // HVTRACE_SHARED_DECODE_SRC_LAZY_FORMATS_H_
