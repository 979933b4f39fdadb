// LazyFormats (see lazy_formats.h).
#include "lazy_formats.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <system_error>

namespace hvtrace {
namespace {

// Below this many formats (a panic's crash summary loads a handful) a
// thread costs more than it saves: Complete() parses them.
constexpr size_t kFormatsForAThread = 64;

}  // namespace

LazyFormats::LazyFormats(const std::vector<FormatText>& texts)
    : texts_(texts), results_(texts.size()), states_(new std::atomic<uint8_t>[texts.size()]) {
  std::vector<std::pair<uint32_t, uint32_t>> ids;  // {id, index}, in file order.
  ids.reserve(texts_.size());
  uint32_t limit = 0;
  for (size_t i = 0; i < texts_.size(); ++i) {
    states_[i].store(kFree, std::memory_order_relaxed);
    std::optional<uint32_t> id = ScanEventFormatId(texts_[i].text);
    if (!id) {
      // Only the parser can tell (no "ID:" before "format:", or a bad one).
      Ensure(i);
      if (!results_[i]->ok()) continue;
      id = (*results_[i])->id;
    }
    ids.emplace_back(*id, static_cast<uint32_t>(i));
    limit = std::max(limit, *id + 1);
  }
  candidates_.resize(limit);
  chosen_.resize(limit);
  for (auto [id, index] : ids) candidates_[id].push_back(index);
}

LazyFormats::~LazyFormats() {
  stop_.store(true, std::memory_order_relaxed);
  if (background_.joinable()) background_.join();
}

void LazyFormats::Ensure(size_t index) {
  uint8_t state = kFree;
  if (states_[index].compare_exchange_strong(state, kClaimed, std::memory_order_acquire)) {
    results_[index].emplace(ParseEventFormat(texts_[index].system, texts_[index].text));
    states_[index].store(kDone, std::memory_order_release);
    return;
  }
  // The background thread has it: one format is some microseconds.
  while (states_[index].load(std::memory_order_acquire) != kDone) std::this_thread::yield();
}

size_t LazyFormats::Resolve(uint32_t id) {
  if (id >= candidates_.size()) return kNone;
  if (chosen_[id]) return *chosen_[id];
  size_t chosen = kNone;
  for (uint32_t index : candidates_[id]) {
    Ensure(index);
    // A text whose scanned id is |id| and that parses has that id.
    if (results_[index]->ok()) {
      chosen = index;
      break;
    }
  }
  chosen_[id] = chosen;
  return chosen;
}

std::optional<std::pair<EventFormat, size_t>> LazyFormats::ResolveInChild(uint32_t id) const {
  if (id >= candidates_.size()) return std::nullopt;
  for (uint32_t index : candidates_[id]) {
    Result<EventFormat> parsed = ParseEventFormat(texts_[index].system, texts_[index].text);
    if (parsed.ok()) return std::make_pair(std::move(*parsed), static_cast<size_t>(index));
  }
  return std::nullopt;
}

void LazyFormats::ParseRest() {
  for (size_t i = 0; i < texts_.size() && !stop_.load(std::memory_order_relaxed); ++i) {
    uint8_t state = kFree;
    if (!states_[i].compare_exchange_strong(state, kClaimed, std::memory_order_acquire)) continue;
    results_[i].emplace(ParseEventFormat(texts_[i].system, texts_[i].text));
    states_[i].store(kDone, std::memory_order_release);
  }
}

void LazyFormats::StartBackground() {
  if (background_.joinable() || texts_.size() < kFormatsForAThread) return;
  try {
    background_ = std::thread([this] {
      // The lowest priority: the report's own threads come first, and what
      // this thread has not parsed when Complete() runs, Complete parses.
      setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 19);
      ParseRest();
    });
  } catch (const std::system_error&) {
    // No thread to be had (a process at its limit): Complete() parses them.
  }
}

void LazyFormats::Complete() {
  for (size_t i = 0; i < texts_.size(); ++i) Ensure(i);
  if (background_.joinable()) background_.join();
  for (uint32_t id = 0; id < candidates_.size(); ++id) Resolve(id);
}

std::vector<std::string> LazyFormats::Warnings(const std::string& source) const {
  std::vector<std::string> out;
  for (size_t i = 0; i < texts_.size(); ++i) {
    const Result<EventFormat>& r = *results_[i];
    if (!r.ok()) {
      out.push_back(source + ": " + r.error().message);
      continue;
    }
    if (*chosen_[r->id] == i) continue;
    out.push_back(source + ": event id " + std::to_string(r->id) + " (" + texts_[i].system + "/" +
                  r->name + ") defined twice; keeping the first");
  }
  return out;
}

std::vector<std::pair<uint32_t, size_t>> LazyFormats::Defined() const {
  std::vector<std::pair<uint32_t, size_t>> out;
  for (uint32_t id = 0; id < chosen_.size(); ++id) {
    if (chosen_[id] && *chosen_[id] != kNone) out.emplace_back(id, *chosen_[id]);
  }
  return out;
}

}  // namespace hvtrace
