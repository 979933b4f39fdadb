// The guest memory a reader read (the printk ring's VMCOREINFO, ring
// struct, descriptors and text), kept beside what was made of it: a capture
// stores it (printk-memory.zst) so a reader bug can be fixed and the log read
// again, and the unit tests replay real guests' records through the reader.
//
// Layout (little-endian), then compressed as one zstd frame:
//   char magic[8] = "HVMEMREC"; u32 version = 1; u32 blocks;
//   blocks × { u64 addr; u64 size; u8 bytes[size]; }
// Decoding treats it as hostile input: every size is checked against what
// is left and against kMaxMemoryRecordBytes.
#ifndef HVTRACE_SHARED_DECODE_MEMORY_RECORD_H_
#define HVTRACE_SHARED_DECODE_MEMORY_RECORD_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "hvtrace/result.h"

namespace hvtrace {

// Largest record made or read (uncompressed).
inline constexpr uint64_t kMaxMemoryRecordBytes = uint64_t{256} << 20;

class MemoryRecord {
 public:
  struct Block {
    uint64_t addr = 0;
    std::vector<std::byte> bytes;
  };

  void Add(uint64_t addr, std::span<const std::byte> bytes);
  // The |size| bytes at |addr|, when one recorded block holds all of them.
  Result<std::vector<std::byte>> Read(uint64_t addr, size_t size) const;
  const std::vector<Block>& blocks() const { return blocks_; }
  uint64_t bytes() const { return bytes_; }

  // The layout above, uncompressed, and back.
  std::vector<std::byte> Serialize() const;
  static Result<MemoryRecord> Parse(std::span<const std::byte> data);
  // The same, compressed as one zstd frame (level 1: fast at capture time).
  Result<std::vector<std::byte>> Compress() const;
  static Result<MemoryRecord> Decompress(std::span<const std::byte> data);

 private:
  std::vector<Block> blocks_;
  uint64_t bytes_ = 0;
};

}  // namespace hvtrace

#endif  // HVTRACE_SHARED_DECODE_MEMORY_RECORD_H_
