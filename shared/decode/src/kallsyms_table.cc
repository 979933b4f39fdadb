#include "hvtrace/kallsyms_table.h"

#include <algorithm>
#include <array>
#include <future>
#include <system_error>

namespace hvtrace {

namespace {

// Hex digit values, 0xff for any other byte.
constexpr std::array<uint8_t, 256> kHexValue = [] {
  std::array<uint8_t, 256> t{};
  t.fill(0xff);
  for (int c = 0; c < 10; ++c) t['0' + c] = static_cast<uint8_t>(c);
  for (int c = 0; c < 6; ++c) {
    t['a' + c] = static_cast<uint8_t>(10 + c);
    t['A' + c] = static_cast<uint8_t>(10 + c);
  }
  return t;
}();

// The hex number at the start of |line| as std::from_chars(base 16) reads
// it, for up to 16 digits: returns the count of digits (0: none), which
// stops at 17 (a count the caller refuses, as it refuses any longer one).
// from_chars was 30 M of the 105 M instructions of TepSymbols::Build on
// bench/large.dat's kallsyms (callgrind).
size_t ReadHex(std::string_view line, uint64_t* value) {
  uint64_t v = 0;
  size_t n = 0;
  const size_t limit = std::min<size_t>(line.size(), 17);
  for (; n < limit; ++n) {
    const uint8_t d = kHexValue[static_cast<unsigned char>(line[n])];
    if (d == 0xff) break;
    v = v << 4 | d;
  }
  *value = v;
  return n;
}

// Large enough to pay for a thread (~0.1 ms to start and join).
constexpr size_t kTextForAThread = 1 << 20;

}  // namespace

size_t KallsymsTable::ParseLines(std::string_view text, size_t from, size_t to,
                                 std::vector<Symbol>* out) {
  size_t lines = 0;
  for (size_t pos = from; pos < to;) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    const std::string_view line = text.substr(pos, nl - pos);
    Symbol s;
    s.offset = static_cast<uint32_t>(pos);
    s.length = static_cast<uint32_t>(line.size());
    pos = nl + 1;
    if (!line.empty()) ++lines;
    const size_t digits = ReadHex(line, &s.addr);
    if (digits == 0 || digits > 16 || line.size() < digits + 4 || line[digits] != ' ' ||
        line[digits + 2] != ' ') {
      continue;
    }
    s.digits = static_cast<uint8_t>(digits);
    s.type = line[digits + 1];
    s.module = line.find('[', digits + 3) != std::string_view::npos;
    out->push_back(s);
  }
  return lines;
}

std::shared_ptr<const KallsymsTable> KallsymsTable::Parse(std::string_view kallsyms,
                                                          unsigned threads) {
  auto table = std::make_shared<KallsymsTable>();
  std::vector<Symbol>& out = table->symbols_;
  // Room for every line there can be (a symbol's line and its newline are
  // at least 6 bytes), so that the second half's symbols are appended
  // without a copy: pages reserved and never written cost no page fault.
  out.reserve(kallsyms.size() / 6 + 1);
  // Offsets are 32-bit: formats_cache caps kallsyms far below 4 GiB.
  const std::string_view text = kallsyms.substr(0, UINT32_MAX);
  // The second half starts at a line's start: the line the middle falls in
  // belongs to the first.
  size_t half = text.size();
  if (threads > 1 && text.size() >= kTextForAThread) {
    half = text.find('\n', text.size() / 2);
    half = half == std::string_view::npos ? text.size() : half + 1;
  }
  std::vector<Symbol> second;
  std::future<size_t> second_lines;
  if (half < text.size()) {
    try {
      second_lines = std::async(std::launch::async, [&] {
        second.reserve((text.size() - half) / 6 + 1);
        return ParseLines(text, half, text.size(), &second);
      });
    } catch (const std::system_error&) {
      half = text.size();  // No thread to be had: all of it here.
    }
  }
  table->lines_ = ParseLines(text, 0, half, &out);
  if (second_lines.valid()) {
    table->lines_ += second_lines.get();
    out.insert(out.end(), second.begin(), second.end());
  }
  // /proc/kallsyms is in address order but for a few stragglers.
  auto by_addr = [](const Symbol& a, const Symbol& b) { return a.addr < b.addr; };
  if (!std::is_sorted(out.begin(), out.end(), by_addr))
    std::stable_sort(out.begin(), out.end(), by_addr);
  return table;
}

std::string_view KallsymsTable::Name(std::string_view kallsyms, const Symbol& s) {
  return Line(kallsyms, s).substr(s.digits + 3u);
}

}  // namespace hvtrace
