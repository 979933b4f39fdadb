#include "hvtrace/memory_record.h"

#include <zstd.h>

#include <cstring>
#include <memory>
#include <string>

namespace hvtrace {
namespace {

constexpr char kMagic[8] = {'H', 'V', 'M', 'E', 'M', 'R', 'E', 'C'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 16, kBlockHeaderBytes = 16;

void PutLe(std::vector<std::byte>& out, uint64_t v, size_t width) {
  for (size_t i = 0; i < width; ++i) out.push_back(static_cast<std::byte>(v >> (8 * i)));
}

uint64_t GetLe(std::span<const std::byte> in, size_t at, size_t width) {
  uint64_t v = 0;
  for (size_t i = 0; i < width; ++i) v |= uint64_t{static_cast<uint8_t>(in[at + i])} << (8 * i);
  return v;
}

}  // namespace

void MemoryRecord::Add(uint64_t addr, std::span<const std::byte> bytes) {
  blocks_.push_back({addr, std::vector<std::byte>(bytes.begin(), bytes.end())});
  bytes_ += bytes.size();
}

Result<std::vector<std::byte>> MemoryRecord::Read(uint64_t addr, size_t size) const {
  for (const Block& b : blocks_) {
    // addr - b.addr wraps for an address below the block: then it is huge.
    const uint64_t at = addr - b.addr;
    if (at > b.bytes.size() || b.bytes.size() - at < size) continue;
    const auto first = b.bytes.begin() + static_cast<std::ptrdiff_t>(at);
    return std::vector<std::byte>(first, first + static_cast<std::ptrdiff_t>(size));
  }
  return Error{"not recorded: " + std::to_string(size) + " bytes at " + std::to_string(addr)};
}

std::vector<std::byte> MemoryRecord::Serialize() const {
  std::vector<std::byte> out;
  out.reserve(kHeaderBytes + blocks_.size() * kBlockHeaderBytes + bytes_);
  for (char c : kMagic) out.push_back(static_cast<std::byte>(c));
  PutLe(out, kVersion, 4);
  PutLe(out, blocks_.size(), 4);
  for (const Block& b : blocks_) {
    PutLe(out, b.addr, 8);
    PutLe(out, b.bytes.size(), 8);
    out.insert(out.end(), b.bytes.begin(), b.bytes.end());
  }
  return out;
}

Result<MemoryRecord> MemoryRecord::Parse(std::span<const std::byte> data) {
  if (data.size() < kHeaderBytes || std::memcmp(data.data(), kMagic, sizeof kMagic) != 0) {
    return Error{"not a memory record (magic)"};
  }
  if (GetLe(data, 8, 4) != kVersion) return Error{"memory record: unknown version"};
  if (data.size() > kMaxMemoryRecordBytes) return Error{"memory record: too large"};
  const uint64_t blocks = GetLe(data, 12, 4);
  MemoryRecord out;
  size_t at = kHeaderBytes;
  for (uint64_t i = 0; i < blocks; ++i) {
    if (data.size() - at < kBlockHeaderBytes) return Error{"memory record: truncated block header"};
    const uint64_t addr = GetLe(data, at, 8);
    const uint64_t size = GetLe(data, at + 8, 8);
    at += kBlockHeaderBytes;
    if (size > data.size() - at) return Error{"memory record: block larger than the record"};
    out.Add(addr, data.subspan(at, size));
    at += size;
  }
  if (at != data.size()) return Error{"memory record: bytes after the last block"};
  return out;
}

// The output buffer is not zeroed: at a panic zeroing the bound's size for
// the printk ring's record (~0.7 MB) was 0.6 M of the guest-log thread's
// 7.1 M instructions (callgrind of hvtraced, 6.12 guest).
Result<std::vector<std::byte>> MemoryRecord::Compress() const {
  const std::vector<std::byte> raw = Serialize();
  const size_t bound = ZSTD_compressBound(raw.size());
  std::unique_ptr<std::byte[]> packed(new std::byte[bound]);
  const size_t n = ZSTD_compress(packed.get(), bound, raw.data(), raw.size(), 1);
  if (ZSTD_isError(n)) return Error{std::string("zstd: ") + ZSTD_getErrorName(n)};
  return std::vector<std::byte>(packed.get(), packed.get() + n);
}

Result<MemoryRecord> MemoryRecord::Decompress(std::span<const std::byte> data) {
  const unsigned long long size = ZSTD_getFrameContentSize(data.data(), data.size());
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN ||
      size > kMaxMemoryRecordBytes) {
    return Error{"memory record: not a zstd frame of a known, bounded size"};
  }
  std::vector<std::byte> raw(size);
  const size_t n = ZSTD_decompress(raw.data(), raw.size(), data.data(), data.size());
  if (ZSTD_isError(n) || n != size) return Error{"memory record: zstd frame does not decompress"};
  return Parse(raw);
}

}  // namespace hvtrace
