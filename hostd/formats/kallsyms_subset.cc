#include "kallsyms_subset.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>

namespace hvtrace::hostd {

KallsymsSubset::KallsymsSubset(std::string_view text, int64_t delta,
                               std::shared_ptr<const KallsymsTable> table)
    : delta_(delta) {
  if (!table) table = KallsymsTable::Parse(text);
  lines_.reserve(table->symbols().size());
  for (const KallsymsTable::Symbol& s : table->symbols()) {
    if (s.type == 'A' || s.type == 'a' || KallsymsTable::Name(text, s).starts_with('$')) continue;
    Line k;
    k.addr = s.addr;
    k.digits = s.digits;
    k.movable = k.addr != 0 && !s.module;
    if (k.movable) k.addr += static_cast<uint64_t>(delta);
    k.text = KallsymsTable::Line(text, s);
    lines_.push_back(k);
  }
  // The table is in address order; a delta can move core symbols past
  // module ones. The order among aliases does not matter (they are kept
  // together).
  auto by_addr = [](const Line& a, const Line& b) { return a.addr < b.addr; };
  if (!std::is_sorted(lines_.begin(), lines_.end(), by_addr))
    std::sort(lines_.begin(), lines_.end(), by_addr);
  for (const Line& k : lines_) {
    if (k.addr != 0) {
      lowest_ = k.addr;
      break;
    }
  }
  if (lowest_ == 0) lines_.clear();  // Only zero addresses (kptr_restrict): nothing to name.
  keep_.assign(lines_.size(), 0);
}

void KallsymsSubset::Mark(uint64_t value) {
  if (value < lowest_) return;
  auto it = std::upper_bound(lines_.begin(), lines_.end(), value,
                             [](uint64_t v, const Line& k) { return v < k.addr; });
  const size_t covering = static_cast<size_t>(it - lines_.begin()) - 1;
  keep_[covering] = 1;
  if (covering + 1 < lines_.size()) keep_[covering + 1] = 1;
}

void KallsymsSubset::AddPayload(std::span<const std::byte> p) {
  if (lines_.empty()) return;
  for (size_t off = 0; off + sizeof(uint64_t) <= p.size(); off += 4) {
    uint64_t value;
    std::memcpy(&value, p.data() + off, sizeof(value));
    Mark(value);
  }
}

std::string KallsymsSubset::Text() const {
  std::vector<uint8_t> keep = keep_;
  // Aliases: every line at a kept address.
  for (size_t i = 1; i < lines_.size(); ++i) {
    if (lines_[i].addr == lines_[i - 1].addr && (keep[i] | keep[i - 1])) keep[i] = keep[i - 1] = 1;
  }
  for (size_t i = lines_.size(); i-- > 1;) {
    if (lines_[i].addr == lines_[i - 1].addr && keep[i]) keep[i - 1] = 1;
  }
  std::string out;
  for (size_t i = 0; i < lines_.size(); ++i) {
    if (!keep[i]) continue;
    const Line& k = lines_[i];
    if (!k.movable || delta_ == 0) {
      out.append(k.text);
    } else {
      char hex[17];
      std::snprintf(hex, sizeof hex, "%0*llx", static_cast<int>(std::min<size_t>(k.digits, 16)),
                    static_cast<unsigned long long>(k.addr));
      out.append(hex);
      out.append(k.text.substr(k.digits));
    }
    out.push_back('\n');
  }
  return out;
}

}  // namespace hvtrace::hostd
