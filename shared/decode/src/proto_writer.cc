// ProtoWriter's out-of-line parts (hvtrace/proto_writer.h).
#include "hvtrace/proto_writer.h"

namespace hvtrace {
namespace {

// The length of the valid UTF-8 sequence at |s|[0], or 0 when there is none
// (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF).
size_t Utf8SequenceLength(std::string_view s) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xbf;  // The second byte's range.
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  if (s.size() < n || b(1) < lo || b(1) > hi) return 0;
  for (size_t i = 2; i < n; ++i) {
    if (b(i) < 0x80 || b(i) > 0xbf) return 0;
  }
  return n;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    // ASCII, most of a trace's text, without the sequence checks.
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = Utf8SequenceLength(s.substr(i));
    if (n == 0) return false;
    i += n;
  }
  return true;
}

ProtoBuffer& ProtoBuffer::operator=(ProtoBuffer&& other) noexcept {
  data_ = std::move(other.data_);
  size_ = other.size_;
  capacity_ = other.capacity_;
  other.size_ = other.capacity_ = 0;
  return *this;
}

void ProtoBuffer::Grow(size_t n) {
  size_t capacity = capacity_ < 256 ? 256 : capacity_ * 2;
  if (capacity - size_ < n) capacity = size_ + n;
  auto data = std::make_unique_for_overwrite<char[]>(capacity);
  if (size_ != 0) std::memcpy(data.get(), data_.get(), size_);
  data_ = std::move(data);
  capacity_ = capacity;
}

void ProtoBuffer::Insert(size_t at, size_t n) {
  Room(n);
  std::memmove(data_.get() + at + n, data_.get() + at, size_ - at);
  size_ += n;
}

std::string ValidUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t n = Utf8SequenceLength(text.substr(i));
    if (n == 0) {
      out.append("\xef\xbf\xbd");
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

void ProtoWriter::String(uint32_t field, std::string_view value) {
  // Kernel names and most messages are ASCII: check before copying.
  if (IsValidUtf8(value)) {
    Bytes(field, value);
  } else {
    Bytes(field, ValidUtf8(value));
  }
}

bool ProtoWriter::EndNested(size_t token) {
  const size_t size = out_->size() - token - kNestedSizeBytes;
  if (size > kMaxNestedSize) return false;
  for (size_t i = 0; i < kNestedSizeBytes; ++i) {
    const auto byte = static_cast<unsigned char>((size >> (7 * i)) & 0x7f);
    (*out_)[token + i] = static_cast<char>(i + 1 < kNestedSizeBytes ? byte | 0x80 : byte);
  }
  return true;
}

}  // namespace hvtrace
