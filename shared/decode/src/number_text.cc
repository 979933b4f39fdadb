// NumberText (see number_text.h).
#include "number_text.h"

#include <bit>
#include <cstring>

#include "event_text.h"

namespace hvtrace {
namespace {

size_t DecimalDigits(uint64_t v) {
  size_t n = 1;
  for (uint64_t limit = 10; n < 20 && v >= limit; limit *= 10) ++n;
  return n;
}

}  // namespace

bool NumberText::SetPrefix(std::string_view text) {
  if (text.size() > kMaxPrefix) return false;
  std::memcpy(prefix, text.data(), text.size());
  prefix_len = static_cast<uint8_t>(text.size());
  return true;
}

void NumberText::Append(int64_t sv, uint64_t uv, std::string* out) const {
  bool negative = false;
  uint64_t mag = uv;
  size_t digits;
  switch (conv) {
    case 'd':
    case 'i':
      negative = sv < 0;
      mag = negative ? 0 - static_cast<uint64_t>(sv) : static_cast<uint64_t>(sv);
      digits = DecimalDigits(mag);
      break;
    case 'u':
      digits = DecimalDigits(mag);
      break;
    case 'x':
    case 'X':
      digits = mag == 0 ? 1 : (static_cast<size_t>(std::bit_width(mag)) + 3) / 4;
      break;
    default:
      digits = mag == 0 ? 1 : (static_cast<size_t>(std::bit_width(mag)) + 2) / 3;
      break;
  }
  const size_t len = digits + (negative ? 1 : 0);
  const size_t w = static_cast<size_t>(width);
  const size_t pad = len < w ? w - len : 0;
  // Prefix, padding (fills of up to kFill are fixed-size stores), sign, up
  // to 22 digits.
  constexpr size_t kFill = 16;
  char buf[kMaxPrefix + kMaxWidth + kFill + 24];
  std::memcpy(buf, prefix, kMaxPrefix);
  char* p = buf + prefix_len;
  if (pad != 0 && !left && zero && negative) *p++ = '-';  // Zeros go after the sign.
  if (pad != 0 && !left) {
    const char fill = zero ? '0' : ' ';
    if (pad <= kFill) {
      std::memset(p, fill, kFill);
    } else {
      std::memset(p, fill, pad);
    }
    p += pad;
  }
  if (negative && (pad == 0 || left || !zero)) *p++ = '-';
  p += digits;
  switch (conv) {
    case 'd':
    case 'i':
    case 'u':
      FormatUintBackwards(mag, p);
      break;
    case 'x':
    case 'X':
      FormatHexBackwards(mag, p, conv == 'X');
      break;
    default: {
      char* d = p;
      uint64_t o = mag;
      do {
        *--d = static_cast<char>('0' + (o & 7));
        o >>= 3;
      } while (o);
      break;
    }
  }
  if (pad != 0 && left) {
    std::memset(p, ' ', pad);
    p += pad;
  }
  out->append(buf, static_cast<size_t>(p - buf));
}

}  // namespace hvtrace
