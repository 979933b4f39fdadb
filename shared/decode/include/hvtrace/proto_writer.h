// A small protobuf wire-format writer (https://protobuf.dev/programming-guides/encoding/):
//
//   field key = (field_number << 3) | wire_type, as a varint
//   wire type 0 (VARINT): an unsigned LEB128 varint; a negative int32/int64
//                         is sign-extended to 64 bits, so it takes 10 bytes
//   wire type 2 (LEN):    a varint length, then that many bytes: strings,
//                         bytes and nested messages
//
// Nested messages are written in place: BeginNested() writes the key and
// reserves kNestedSizeBytes for the length, EndNested() patches it as a
// redundant (zero-padded) varint, the way Perfetto's protozero does, so a
// message is never copied to learn its size. Every protobuf parser accepts
// a padded varint; the reserved width caps a nested message at 256 MiB,
// which callers stay far below (they write small, bounded messages).
// BeginCompact()/EndCompact() are for the many small messages of a trace
// (one per event and per field): one byte is reserved and the body is moved
// only when it passes 127 bytes, so the length takes the fewest bytes (the
// padding was a fifth of an exported trace).
#ifndef HVTRACE_PROTO_WRITER_H_
#define HVTRACE_PROTO_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace hvtrace {

class ProtoWriter {
 public:
  static constexpr size_t kNestedSizeBytes = 4;
  static constexpr size_t kMaxNestedSize = (size_t{1} << (7 * kNestedSizeBytes)) - 1;

  // Appends to |out|, which the caller owns and may clear between messages.
  explicit ProtoWriter(std::string* out) : out_(out) {}

  void Varint(uint32_t field, uint64_t value) {
    Key(field, 0);
    RawVarint(value);
  }
  // int32/int64 fields: negative values as their 64-bit two's complement.
  void Signed(uint32_t field, int64_t value) { Varint(field, static_cast<uint64_t>(value)); }
  void Bool(uint32_t field, bool value) { Varint(field, value ? 1 : 0); }
  void Bytes(uint32_t field, std::string_view value) {
    Key(field, 2);
    RawVarint(value.size());
    out_->append(value);
  }
  // A string field: protobuf strings must be UTF-8, so bytes that are not
  // valid UTF-8 (guest data) are each replaced by U+FFFD.
  void String(uint32_t field, std::string_view value);

  // Starts a nested message; returns the token EndNested() takes.
  size_t BeginNested(uint32_t field) {
    Key(field, 2);
    const size_t at = out_->size();
    out_->append(kNestedSizeBytes, '\0');
    return at;
  }
  // Ends the message BeginNested() started at |token|. False when it is
  // larger than kMaxNestedSize (its length is then wrong: the caller must
  // drop what it wrote).
  bool EndNested(size_t token);

  // Like BeginNested()/EndNested(), the length written in the fewest bytes:
  // for messages that are usually under 128 bytes (no size limit).
  size_t BeginCompact(uint32_t field) {
    Key(field, 2);
    out_->push_back('\0');
    return out_->size() - 1;
  }
  void EndCompact(size_t token) {
    const size_t size = out_->size() - token - 1;
    if (size < 0x80) {
      (*out_)[token] = static_cast<char>(size);
      return;
    }
    char buf[10];
    const size_t n = EncodeVarint(size, buf);
    out_->insert(token + 1, n - 1, '\0');
    out_->replace(token, n, buf, n);
  }

  // The key and length of a LEN field whose |size| bytes the caller appends
  // next (a message assembled from parts whose sizes are known).
  void LengthDelimited(uint32_t field, size_t size) {
    Key(field, 2);
    RawVarint(size);
  }

  // Bytes that are already encoded fields (a key and its value).
  void Raw(std::string_view encoded) { out_->append(encoded); }

  void RawVarint(uint64_t v) {
    if (v < 0x80) {
      out_->push_back(static_cast<char>(v));
      return;
    }
    // One append, not a push_back per byte: this is most of the export.
    char buf[10];
    out_->append(buf, EncodeVarint(v, buf));
  }

  // Writes |v| as a varint to |buf| (room for 10 bytes); its length.
  static size_t EncodeVarint(uint64_t v, char* buf) {
    size_t n = 0;
    while (v >= 0x80) {
      buf[n++] = static_cast<char>((v & 0x7f) | 0x80);
      v >>= 7;
    }
    buf[n++] = static_cast<char>(v);
    return n;
  }

 private:
  void Key(uint32_t field, uint32_t wire_type) {
    RawVarint((static_cast<uint64_t>(field) << 3) | wire_type);
  }
  std::string* out_;
};

// |text| with every byte that is not part of a valid UTF-8 sequence
// replaced by U+FFFD (overlong forms, surrogates and code points above
// U+10FFFF are invalid too).
std::string ValidUtf8(std::string_view text);

}  // namespace hvtrace

#endif  // HVTRACE_PROTO_WRITER_H_
