// Small, allocation-free text helpers for the decoder's hot path: integer
// formatting with printf's padding rules and JSON string escaping. They
// append to a std::string that the caller reuses as its write buffer.
#ifndef HVTRACE_SHARED_DECODE_SRC_EVENT_TEXT_H_
#define HVTRACE_SHARED_DECODE_SRC_EVENT_TEXT_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#include "hvtrace/format.h"

namespace hvtrace {

// "00" "01" ... "99": two decimal digits per division in the hot path's
// number printing (a division by a constant is a multiply and shifts, each
// worth halving: the line prefix's six microsecond digits were 100 M of
// 2,662 M instructions of `hvtrace report` on bench/large.dat, 2026-12-03).
struct DigitPairs {
  char text[200];
  constexpr DigitPairs() : text() {
    for (int i = 0; i < 100; ++i) {
      text[2 * i] = static_cast<char>('0' + i / 10);
      text[2 * i + 1] = static_cast<char>('0' + i % 10);
    }
  }
  const char* of(uint64_t below_100) const { return text + 2 * below_100; }
};
inline constexpr DigitPairs kDigitPairs;

// Writes the decimal digits of |v| backwards ending at |end|; returns the start.
inline char* FormatUintBackwards(uint64_t v, char* end) {
  while (v >= 100) {
    end -= 2;
    std::memcpy(end, kDigitPairs.of(v % 100), 2);
    v /= 100;
  }
  if (v >= 10) {
    end -= 2;
    std::memcpy(end, kDigitPairs.of(v), 2);
  } else {
    *--end = static_cast<char>('0' + v);
  }
  return end;
}

// "00" ... "ff" (or "FF"): a byte's two hex digits per step.
struct HexPairs {
  char text[512];
  constexpr explicit HexPairs(bool upper) : text() {
    const char* digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
    for (int i = 0; i < 256; ++i) {
      text[2 * i] = digits[i >> 4];
      text[2 * i + 1] = digits[i & 15];
    }
  }
  const char* of(uint64_t byte) const { return text + 2 * byte; }
};
inline constexpr HexPairs kHexPairsLower(false);
inline constexpr HexPairs kHexPairsUpper(true);

// Writes the hex digits of |v| (no leading zeros) backwards ending at |end|;
// returns the start. A byte at a time: "%lx" of addresses and flags is most
// of a report's hex, 16 digits one at a time took 67 M instructions of
// `hvtrace report` on bench/large.dat (2026-12-03).
inline char* FormatHexBackwards(uint64_t v, char* end, bool upper) {
  const HexPairs& pairs = upper ? kHexPairsUpper : kHexPairsLower;
  while (v >= 0x100) {
    end -= 2;
    std::memcpy(end, pairs.of(v & 0xff), 2);
    v >>= 8;
  }
  if (v >= 0x10) {
    end -= 2;
    std::memcpy(end, pairs.of(v), 2);
  } else {
    *--end = pairs.of(v)[1];
  }
  return end;
}

// Writes the six digits of |v| < 1,000,000, zero-padded, at |p|.
inline void FormatSixDigits(uint32_t v, char* p) {
  std::memcpy(p, kDigitPairs.of(v / 10000), 2);
  std::memcpy(p + 2, kDigitPairs.of(v / 100 % 100), 2);
  std::memcpy(p + 4, kDigitPairs.of(v % 100), 2);
}

template <typename T>
inline void AppendInt(std::string* out, T value) {
  char buf[24];
  char* end = buf + sizeof(buf);
  char* p;
  if constexpr (std::is_signed_v<T>) {
    uint64_t mag = value < 0 ? 0 - static_cast<uint64_t>(value) : static_cast<uint64_t>(value);
    p = FormatUintBackwards(mag, end);
    if (value < 0) *--p = '-';
  } else {
    p = FormatUintBackwards(static_cast<uint64_t>(value), end);
  }
  out->append(p, static_cast<size_t>(end - p));
}

// printf("%*s", width, s).
inline void AppendPadLeft(std::string* out, const char* s, size_t len, size_t width) {
  if (len < width) out->append(width - len, ' ');
  out->append(s, len);
}

// printf("%-*d", width, v).
inline void AppendIntPadRight(std::string* out, int64_t v, size_t width) {
  size_t before = out->size();
  AppendInt(out, v);
  size_t n = out->size() - before;
  if (n < width) out->append(width - n, ' ');
}

// printf("%0*llu", width, v).
inline void AppendUintZeroPad(std::string* out, uint64_t v, size_t width) {
  char buf[24];
  char* end = buf + sizeof(buf);
  char* p = FormatUintBackwards(v, end);
  size_t n = static_cast<size_t>(end - p);
  if (n < width) out->append(width - n, '0');
  out->append(p, n);
}

// printf("%*llu", width, v).
inline void AppendUintPadLeft(std::string* out, uint64_t v, size_t width) {
  char buf[24];
  char* end = buf + sizeof(buf);
  char* p = FormatUintBackwards(v, end);
  size_t n = static_cast<size_t>(end - p);
  if (n < width) out->append(width - n, ' ');
  out->append(p, n);
}

// A JSON string literal. Bytes >= 0x80 are escaped as \u00XX (read as
// Latin-1): trace data is not guaranteed UTF-8 and the output must stay valid
// JSON.
void AppendJsonString(std::string* out, std::string_view s);
inline void AppendJsonString(std::string* out, const char* s) {
  AppendJsonString(out, std::string_view(s ? s : ""));
}

// The |size|-byte (at most 8) unsigned integer at |p|, any byte order.
uint64_t ReadUnsignedBytes(const unsigned char* p, uint32_t size, bool little_endian);

// The same; the common case, a little-endian trace read on a little-endian
// host in one of the sizes fields have, is one load (fixed-size copies
// compile to single loads): it runs for several fields of every event the
// Perfetto export writes.
inline uint64_t ReadUnsigned(const unsigned char* p, uint32_t size, bool little_endian) {
  if (little_endian && std::endian::native == std::endian::little) {
    switch (size) {
      case 1:
        return *p;
      case 2: {
        uint16_t v;
        std::memcpy(&v, p, 2);
        return v;
      }
      case 4: {
        uint32_t v;
        std::memcpy(&v, p, 4);
        return v;
      }
      case 8: {
        uint64_t v;
        std::memcpy(&v, p, 8);
        return v;
      }
      default:
        break;
    }
  }
  return ReadUnsignedBytes(p, size, little_endian);
}

// The value of |field| in |data| (a zero-padded scratch copy of a record of
// |size| bytes) as JSON. Dynamic references are bounded by |size|.
void AppendJsonFieldValue(std::string* out, const FieldFormat& field, const unsigned char* data,
                          uint32_t size, bool little_endian);

}  // namespace hvtrace

#endif  // HVTRACE_SHARED_DECODE_SRC_EVENT_TEXT_H_
