#include "hvtrace/kernel_log.h"

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "event_text.h"

namespace hvtrace {
namespace {

void AppendEscaped(uint8_t byte, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->append("\\x");
  out->push_back(kHex[byte >> 4]);
  out->push_back(kHex[byte & 0xf]);
}

// Length of the valid UTF-8 sequence at |s[i]| that encodes a printable code
// point (not a C1 control: U+0080..U+009F include CSI, which some terminals
// obey), or 0.
size_t PrintableUtf8Length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const auto cont = [&](size_t k) { return i + k < s.size() && (b(k) & 0xc0) == 0x80; };
  const uint8_t lead = b(0);
  if (lead >= 0xc2 && lead <= 0xdf && cont(1)) {
    const uint32_t cp = (uint32_t{lead & 0x1fu} << 6) | (b(1) & 0x3fu);
    return cp >= 0xa0 ? 2 : 0;
  }
  if (lead >= 0xe0 && lead <= 0xef && cont(1) && cont(2)) {
    const uint32_t cp =
        (uint32_t{lead & 0x0fu} << 12) | (uint32_t{b(1) & 0x3fu} << 6) | (b(2) & 0x3fu);
    const bool surrogate = cp >= 0xd800 && cp <= 0xdfff;
    return cp >= 0x800 && !surrogate ? 3 : 0;
  }
  if (lead >= 0xf0 && lead <= 0xf4 && cont(1) && cont(2) && cont(3)) {
    const uint32_t cp = (uint32_t{lead & 0x07u} << 18) | (uint32_t{b(1) & 0x3fu} << 12) |
                        (uint32_t{b(2) & 0x3fu} << 6) | (b(3) & 0x3fu);
    return cp >= 0x10000 && cp <= 0x10ffff ? 4 : 0;
  }
  return 0;
}

bool NeedsEscape(uint8_t byte) {
  return (byte < 0x20 && byte != '\n' && byte != '\t') || byte >= 0x7f;
}

// Whether the sixteen bytes at |p| hold one that NeedsEscape(), exactly, so
// a line's own '\n' and a tab do not send its block to the byte loop; they
// are taken out only in a block that has a candidate (a line's last, its
// '\n'). Signed compares (a byte >= 0x80 is negative, so "< 0x20" takes it
// with the controls): SSE2 has those, and a lane mask in one instruction.
bool BlockNeedsEscape(const char* p) {
#if defined(__SSE2__)
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i odd =
      _mm_or_si128(_mm_cmplt_epi8(v, _mm_set1_epi8(0x20)), _mm_cmpeq_epi8(v, _mm_set1_epi8(0x7f)));
  if (_mm_movemask_epi8(odd) == 0) return false;
  const __m128i kept =
      _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('\n')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\t')));
  return _mm_movemask_epi8(_mm_andnot_si128(kept, odd)) != 0;
#else
  using Bytes = int8_t __attribute__((vector_size(16)));
  const auto any = [](Bytes lanes) {
    uint64_t halves[2];
    std::memcpy(halves, &lanes, sizeof halves);
    return (halves[0] | halves[1]) != 0;
  };
  Bytes v;
  std::memcpy(&v, p, sizeof v);
  const Bytes odd = (v < 0x20) | (v == 0x7f);  // -1 lanes where true.
  return any(odd) && any(odd & (v != '\n') & (v != '\t'));
#endif
}

// The index of the first byte of |s| at or after |from| that NeedsEscape(),
// or s.size(). Every event line of a report passes here (MakePrintableFrom),
// almost always printable through: sixteen bytes at a time, the byte loop
// only in the block that holds the byte, and a line's last partial block
// checked as the sixteen bytes that end it. On bench/large.dat (1.37 M
// events) the byte loop alone was 31 % of `hvtrace report`'s CPU in perf;
// eight bytes at a time 9.5 % (2026-12-02); 260 M of 2,726 M instructions
// in callgrind (2026-12-03), sixteen bytes with unsigned compares 284 M
// (SSE2 has none: each was three instructions), signed ones 200 M, with
// SSE2's lane mask 177 M.
size_t FirstToEscape(std::string_view s, size_t from) {
  constexpr size_t kBlock = 16;
  size_t i = from;
  for (; i + kBlock <= s.size(); i += kBlock) {
    if (BlockNeedsEscape(s.data() + i)) break;
  }
  if (i + kBlock > s.size() && s.size() - from >= kBlock &&
      !BlockNeedsEscape(s.data() + s.size() - kBlock)) {
    return s.size();
  }
  for (; i < s.size(); ++i) {
    if (NeedsEscape(static_cast<uint8_t>(s[i]))) return i;
  }
  return s.size();
}

}  // namespace

std::string PrintableLogText(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto byte = static_cast<uint8_t>(text[i]);
    if (byte >= 0x20 && byte < 0x7f) {
      out.push_back(static_cast<char>(byte));
      ++i;
    } else if (size_t n = byte >= 0x80 ? PrintableUtf8Length(text, i) : 0; n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      AppendEscaped(byte, &out);
      ++i;
    }
  }
  return out;
}

void MakePrintableFrom(std::string* text, size_t from) {
  const size_t first = FirstToEscape(*text, from);
  if (first >= text->size()) return;
  std::string tail;
  std::string_view rest = std::string_view(*text).substr(first);
  while (!rest.empty()) {
    const size_t keep = rest.find_first_of("\n\t");
    tail += PrintableLogText(rest.substr(0, keep));
    if (keep == std::string_view::npos) break;
    tail.push_back(rest[keep]);
    rest.remove_prefix(keep + 1);
  }
  text->resize(first);
  text->append(tail);
}

// The report's number helpers (event_text.h), not snprintf: a panic's
// kernel log is ~400 lines printed twice (dmesg text and the capture's log
// file), and snprintf was 1.5 M of the ~7.7 M instructions of the crash
// step beside the trace.dat writing (callgrind of hvtraced at a 6.12 panic,
// bench/README.md).
void AppendDmesgStamp(uint64_t ts_ns, std::string* out) {
  out->push_back('[');
  AppendUintPadLeft(out, ts_ns / 1000000000, 5);
  out->push_back('.');
  AppendUintZeroPad(out, ts_ns % 1000000000 / 1000, 6);
  out->push_back(']');
}

std::string DmesgLine(const KernelLogRecord& record) {
  std::string line;
  AppendDmesgStamp(record.ts_ns, &line);
  line.push_back(' ');
  line += PrintableLogText(record.text);
  return line;
}

std::string DmesgText(const KernelLog& log) {
  std::string out;
  for (const KernelLogRecord& r : log.records) {
    out += DmesgLine(r);
    out.push_back('\n');
  }
  return out;
}

}  // namespace hvtrace
