#include "kallsyms_subset.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace hvtrace::hostd {

namespace {

// Calls |fn| with each value at a 4-byte offset of |p| that is at least
// |floor|.
template <typename Fn>
void ForEachValue(std::span<const std::byte> p, uint64_t floor, Fn&& fn) {
  for (size_t off = 0; off + sizeof(uint64_t) <= p.size(); off += 4) {
    uint64_t value;
    std::memcpy(&value, p.data() + off, sizeof(value));
    if (value >= floor) fn(value);
  }
}

}  // namespace

KallsymsSubset::KallsymsSubset(std::string_view text, int64_t delta,
                               std::shared_ptr<const KernelSymbols> symbols, bool with_modules)
    : text_(text), symbols_(symbols ? std::move(symbols) : KernelSymbols::Build(text, {})) {
  // A delta that would carry a low core address below zero (or a high one
  // past the top) would break the list's order; those symbols are no
  // kernel address after a move anyway, so they are left out.
  std::span<const uint32_t> movable = symbols_->movable();
  const auto addr = [&](uint32_t i) { return symbols_->table().symbols()[i].addr; };
  const uint64_t magnitude = delta < 0 ? 0 - static_cast<uint64_t>(delta) : uint64_t(delta);
  while (!movable.empty() && delta < 0 && addr(movable.front()) < magnitude)
    movable = movable.subspan(1);
  while (!movable.empty() && delta > 0 && addr(movable.back()) > UINT64_MAX - magnitude)
    movable = movable.first(movable.size() - 1);
  movable_ = {movable, delta, std::vector<uint8_t>(movable.size())};
  std::span<const uint32_t> fixed = symbols_->fixed();
  if (!with_modules) {
    for (uint32_t i : fixed) {
      if (!symbols_->table().symbols()[i].module) fixed_kept_.push_back(i);
    }
    fixed = fixed_kept_;
  }
  fixed_ = {fixed, 0, std::vector<uint8_t>(fixed.size())};
  // The lowest non-zero address of either list (fixed ones start with the
  // zero addresses of a kptr_restrict read).
  for (size_t i = 0; i < fixed_.index.size(); ++i) {
    if (Addr(fixed_, i) != 0) {
      lowest_ = Addr(fixed_, i);
      break;
    }
  }
  if (!movable_.index.empty()) {
    const uint64_t first = Addr(movable_, 0);
    lowest_ = lowest_ == 0 ? first : std::min(lowest_, first);
  }
}

uint64_t KallsymsSubset::Addr(const List& list, size_t i) const {
  return symbols_->table().symbols()[list.index[i]].addr + static_cast<uint64_t>(list.delta);
}

size_t KallsymsSubset::CountBelow(const List& list, uint64_t value) const {
  return value == 0 ? 0 : CountAtOrBelow(list, value - 1);
}

size_t KallsymsSubset::CountAtOrBelow(const List& list, uint64_t value) const {
  size_t lo = 0, hi = list.index.size();
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (Addr(list, mid) <= value) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// trace-cmd names |value| by the highest symbol at or below it, bounded by
// the lowest one above it: both are kept, from whichever list holds them
// (both when their addresses tie).
void KallsymsSubset::Mark(uint64_t value) {
  if (value < lowest_) return;
  const size_t m = CountAtOrBelow(movable_, value), f = CountAtOrBelow(fixed_, value);
  const bool has_m = m > 0, has_f = f > 0;
  const uint64_t below_m = has_m ? Addr(movable_, m - 1) : 0;
  const uint64_t below_f = has_f ? Addr(fixed_, f - 1) : 0;
  if (has_m && (!has_f || below_m >= below_f)) movable_.keep[m - 1] = 1;
  if (has_f && (!has_m || below_f >= below_m)) fixed_.keep[f - 1] = 1;
  const bool next_m = m < movable_.index.size(), next_f = f < fixed_.index.size();
  const uint64_t above_m = next_m ? Addr(movable_, m) : 0;
  const uint64_t above_f = next_f ? Addr(fixed_, f) : 0;
  if (next_m && (!next_f || above_m <= above_f)) movable_.keep[m] = 1;
  if (next_f && (!next_m || above_f <= above_m)) fixed_.keep[f] = 1;
}

void KallsymsSubset::MarkOnce(uint64_t value) {
  // Events repeat their pointers: a value marked lately needs no search.
  uint64_t& seen = seen_[(value ^ (value >> 12)) % seen_.size()];
  if (seen == value) return;
  seen = value;
  Mark(value);
}

void KallsymsSubset::AddPayload(std::span<const std::byte> p, KallsymsSubset* also) {
  if (also != nullptr && also->empty()) also = nullptr;
  if (empty()) {
    if (also != nullptr) also->AddPayload(p);
    return;
  }
  if (also == nullptr) {
    ForEachValue(p, lowest_, [this](uint64_t v) { MarkOnce(v); });
    return;
  }
  ForEachValue(p, std::min(lowest_, also->lowest_), [this, also](uint64_t v) {
    if (v >= lowest_) MarkOnce(v);
    if (v >= also->lowest_) also->MarkOnce(v);
  });
}

void KallsymsSubset::AppendLine(const List& list, size_t i, std::string& out) const {
  const KallsymsTable::Symbol& s = symbols_->table().symbols()[list.index[i]];
  const std::string_view line = KallsymsTable::Line(text_, s);
  if (list.delta == 0) {
    out.append(line);
  } else {
    // The moved address in the line's own width.
    AppendKallsymsAddress(Addr(list, i), std::min<size_t>(s.digits, 16), out);
    out.append(line.substr(s.digits));
  }
  out.push_back('\n');
}

// Every symbol at |at| in both lists, in the table's (the kallsyms file's)
// order: the aliases trace-cmd may print for it.
void KallsymsSubset::AppendAliases(uint64_t at, std::string& out) const {
  size_t m = CountBelow(movable_, at), f = CountBelow(fixed_, at);
  const size_t nm = movable_.index.size(), nf = fixed_.index.size();
  while ((m < nm && Addr(movable_, m) == at) || (f < nf && Addr(fixed_, f) == at)) {
    const bool take_m = m < nm && Addr(movable_, m) == at &&
                        (f >= nf || Addr(fixed_, f) != at || movable_.index[m] < fixed_.index[f]);
    if (take_m) {
      AppendLine(movable_, m++, out);
    } else {
      AppendLine(fixed_, f++, out);
    }
  }
}

// The marked addresses of both lists, ascending and distinct, each printed
// with all its aliases. Only the marks are visited: walking all ~160k
// symbols of a distro kernel took ~1 ms per capture (perf of the pipeline
// on a real panic's region, 2026-11-28).
std::string KallsymsSubset::Text() const {
  std::string out;
  if (empty()) return out;
  std::vector<uint64_t> at;
  for (const List* list : {&movable_, &fixed_}) {
    const uint8_t* keep = list->keep.data();
    const size_t n = list->keep.size();
    for (size_t i = 0; i < n;) {
      const void* hit = std::memchr(keep + i, 1, n - i);
      if (hit == nullptr) break;
      i = static_cast<size_t>(static_cast<const uint8_t*>(hit) - keep);
      at.push_back(Addr(*list, i++));
    }
  }
  std::sort(at.begin(), at.end());
  at.erase(std::unique(at.begin(), at.end()), at.end());
  for (uint64_t a : at) AppendAliases(a, out);
  return out;
}

BootKallsyms::BootKallsyms(std::string_view kallsyms, int64_t delta,
                           std::shared_ptr<const KernelSymbols> symbols,
                           const ModuleKallsyms* modules)
    : core_(kallsyms, delta, std::move(symbols), /*with_modules=*/false) {
  if (modules != nullptr && !modules->text.empty())
    modules_.emplace(modules->text, 0, modules->symbols);
}

std::string BootKallsyms::Text() const {
  return modules_ ? core_.Text() + modules_->Text() : core_.Text();
}

}  // namespace hvtrace::hostd
