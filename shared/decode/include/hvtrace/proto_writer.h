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
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

namespace hvtrace {

// The bytes a ProtoWriter appends to: a growable buffer written through a
// raw pointer. Appending to a std::string cost a library call per field,
// which was most of an export's time.
class ProtoBuffer {
 public:
  ProtoBuffer() = default;
  ProtoBuffer(ProtoBuffer&& other) noexcept
      : data_(std::move(other.data_)), size_(other.size_), capacity_(other.capacity_) {
    other.size_ = other.capacity_ = 0;
  }
  ProtoBuffer& operator=(ProtoBuffer&& other) noexcept;

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::string_view view() const { return {data_.get(), size_}; }
  void clear() { size_ = 0; }
  char& operator[](size_t i) { return data_[i]; }

  // Room for |n| more bytes at the end: write them there, then Commit()
  // where they end.
  char* Room(size_t n) {
    if (capacity_ - size_ < n) Grow(n);
    return data_.get() + size_;
  }
  void Commit(const char* end) { size_ = static_cast<size_t>(end - data_.get()); }
  void Append(std::string_view bytes) {
    char* p = Room(bytes.size());
    if (!bytes.empty()) std::memcpy(p, bytes.data(), bytes.size());
    size_ += bytes.size();
  }
  // Opens |n| bytes (left unset) at |at|, moving what follows.
  void Insert(size_t at, size_t n);

 private:
  void Grow(size_t n);
  std::unique_ptr<char[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

class ProtoWriter {
 public:
  static constexpr size_t kNestedSizeBytes = 4;
  static constexpr size_t kMaxNestedSize = (size_t{1} << (7 * kNestedSizeBytes)) - 1;
  static constexpr size_t kMaxVarintBytes = 10;

  // Appends to |out|, which the caller owns and may clear between messages.
  explicit ProtoWriter(ProtoBuffer* out) : out_(out) {}

  void Varint(uint32_t field, uint64_t value) {
    char* p = out_->Room(2 * kMaxVarintBytes);
    p = PutVarint(p, Key(field, 0));
    out_->Commit(PutVarint(p, value));
  }
  // int32/int64 fields: negative values as their 64-bit two's complement.
  void Signed(uint32_t field, int64_t value) { Varint(field, static_cast<uint64_t>(value)); }
  void Bool(uint32_t field, bool value) { Varint(field, value ? 1 : 0); }
  void Bytes(uint32_t field, std::string_view value) {
    char* p = out_->Room(2 * kMaxVarintBytes + value.size());
    p = PutVarint(p, Key(field, 2));
    p = PutVarint(p, value.size());
    if (!value.empty()) std::memcpy(p, value.data(), value.size());
    out_->Commit(p + value.size());
  }
  // A string field: protobuf strings must be UTF-8, so bytes that are not
  // valid UTF-8 (guest data) are each replaced by U+FFFD.
  void String(uint32_t field, std::string_view value);

  // Starts a nested message; returns the token EndNested() takes.
  size_t BeginNested(uint32_t field) {
    char* p = PutVarint(out_->Room(kMaxVarintBytes + kNestedSizeBytes), Key(field, 2));
    std::memset(p, 0, kNestedSizeBytes);
    out_->Commit(p + kNestedSizeBytes);
    return out_->size() - kNestedSizeBytes;
  }
  // Ends the message BeginNested() started at |token|. False when it is
  // larger than kMaxNestedSize (its length is then wrong: the caller must
  // drop what it wrote).
  bool EndNested(size_t token);

  // Like BeginNested()/EndNested(), the length written in the fewest bytes:
  // for messages that are usually under 128 bytes (no size limit).
  size_t BeginCompact(uint32_t field) {
    char* p = PutVarint(out_->Room(kMaxVarintBytes + 1), Key(field, 2));
    *p = 0;
    out_->Commit(p + 1);
    return out_->size() - 1;
  }
  void EndCompact(size_t token) {
    const size_t size = out_->size() - token - 1;
    if (size < 0x80) {
      (*out_)[token] = static_cast<char>(size);
      return;
    }
    char buf[kMaxVarintBytes];
    const size_t n = static_cast<size_t>(PutVarint(buf, size) - buf);
    out_->Insert(token + 1, n - 1);
    std::memcpy(&(*out_)[token], buf, n);
  }

  // The key and length of a LEN field whose |size| bytes the caller appends
  // next (a message assembled from parts whose sizes are known).
  void LengthDelimited(uint32_t field, size_t size) {
    char* p = PutVarint(out_->Room(2 * kMaxVarintBytes), Key(field, 2));
    out_->Commit(PutVarint(p, size));
  }

  // Bytes that are already encoded fields (a key and its value).
  void Raw(std::string_view encoded) { out_->Append(encoded); }

  void RawVarint(uint64_t v) { out_->Commit(PutVarint(out_->Room(kMaxVarintBytes), v)); }

  // Writes |v| as a varint at |p| (room for kMaxVarintBytes); where it ends.
  static char* PutVarint(char* p, uint64_t v) {
    while (v >= 0x80) {
      *p++ = static_cast<char>((v & 0x7f) | 0x80);
      v >>= 7;
    }
    *p++ = static_cast<char>(v);
    return p;
  }

 private:
  static uint64_t Key(uint32_t field, uint32_t wire_type) {
    return (static_cast<uint64_t>(field) << 3) | wire_type;
  }
  ProtoBuffer* out_;
};

// True when |text| is valid UTF-8 (as ValidUtf8 judges it).
bool IsValidUtf8(std::string_view text);

// |text| with every byte that is not part of a valid UTF-8 sequence
// replaced by U+FFFD (overlong forms, surrogates and code points above
// U+10FFFF are invalid too).
std::string ValidUtf8(std::string_view text);

}  // namespace hvtrace

#endif  // HVTRACE_PROTO_WRITER_H_
