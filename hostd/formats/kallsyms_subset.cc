#include "kallsyms_subset.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace hvtrace::hostd {

KallsymsSubset::KallsymsSubset(std::string_view text, int64_t delta,
                               std::shared_ptr<const KernelSymbols> symbols)
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
  fixed_ = {symbols_->fixed(), 0, std::vector<uint8_t>(symbols_->fixed().size())};
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

void KallsymsSubset::AddPayload(std::span<const std::byte> p) {
  if (empty()) return;
  for (size_t off = 0; off + sizeof(uint64_t) <= p.size(); off += 4) {
    uint64_t value;
    std::memcpy(&value, p.data() + off, sizeof(value));
    Mark(value);
  }
}

void KallsymsSubset::AppendLine(const List& list, size_t i, std::string& out) const {
  const KallsymsTable::Symbol& s = symbols_->table().symbols()[list.index[i]];
  const std::string_view line = KallsymsTable::Line(text_, s);
  if (list.delta == 0) {
    out.append(line);
  } else {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%0*llx", static_cast<int>(std::min<size_t>(s.digits, 16)),
                  static_cast<unsigned long long>(Addr(list, i)));
    out.append(hex);
    out.append(line.substr(s.digits));
  }
  out.push_back('\n');
}

// The two lists merged by address; a run of equal addresses (aliases, from
// either list) is printed whole when any of it is marked.
std::string KallsymsSubset::Text() const {
  std::string out;
  if (empty()) return out;
  size_t m = 0, f = 0;
  const size_t nm = movable_.index.size(), nf = fixed_.index.size();
  while (m < nm || f < nf) {
    const uint64_t at = m < nm && (f >= nf || Addr(movable_, m) <= Addr(fixed_, f))
                            ? Addr(movable_, m)
                            : Addr(fixed_, f);
    size_t m_end = m, f_end = f;
    bool keep = false;
    for (; m_end < nm && Addr(movable_, m_end) == at; ++m_end) keep |= movable_.keep[m_end] != 0;
    for (; f_end < nf && Addr(fixed_, f_end) == at; ++f_end) keep |= fixed_.keep[f_end] != 0;
    // Aliases in the table's order (the kallsyms file's).
    for (size_t i = m, j = f; keep && (i < m_end || j < f_end);) {
      if (j >= f_end || (i < m_end && movable_.index[i] < fixed_.index[j])) {
        AppendLine(movable_, i++, out);
      } else {
        AppendLine(fixed_, j++, out);
      }
    }
    m = m_end;
    f = f_end;
  }
  return out;
}

}  // namespace hvtrace::hostd
