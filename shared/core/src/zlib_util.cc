#include "zlib_util.h"

#include <zlib.h>

namespace hvtrace::zlib_util {

uint32_t Crc32(std::string_view bytes) {
  return static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
}

std::vector<std::byte> Deflate(std::string_view raw, int level) {
  uLongf size = compressBound(static_cast<uLong>(raw.size()));
  std::vector<std::byte> out(size);
  if (compress2(reinterpret_cast<Bytef*>(out.data()), &size,
                reinterpret_cast<const Bytef*>(raw.data()), static_cast<uLong>(raw.size()),
                level) != Z_OK) {
    size = 0;
  }
  out.resize(size);
  return out;
}

Result<std::string> InflateExact(std::span<const std::byte> stored, uint32_t raw_size) {
  std::string text(raw_size, '\0');
  z_stream z{};
  if (inflateInit(&z) != Z_OK) return Error{"zlib: cannot initialize"};
  z.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(stored.data()));
  z.avail_in = static_cast<uInt>(stored.size());
  z.next_out = reinterpret_cast<Bytef*>(text.data());
  z.avail_out = static_cast<uInt>(text.size());
  // One call: the output buffer is exactly the stated size, so a stream that
  // inflates to more stops there (Z_OK / Z_BUF_ERROR, not Z_STREAM_END).
  const int rc = inflate(&z, Z_FINISH);
  const uint64_t produced = z.total_out;
  const uint64_t consumed = z.total_in;
  inflateEnd(&z);
  if (rc != Z_STREAM_END) {
    return Error{rc == Z_DATA_ERROR ? std::string("compressed bytes are not a zlib stream")
                 : produced == raw_size
                     ? "inflates to more than the stated " + std::to_string(raw_size) + " bytes"
                     : "zlib stream ends early (" + std::to_string(produced) + " of " +
                           std::to_string(raw_size) + " bytes)"};
  }
  if (produced != raw_size) {
    return Error{"inflates to " + std::to_string(produced) + " bytes, states " +
                 std::to_string(raw_size)};
  }
  if (consumed != stored.size()) {
    return Error{"zlib stream ends " + std::to_string(stored.size() - consumed) +
                 " bytes before the stated compressed size"};
  }
  return text;
}

}  // namespace hvtrace::zlib_util
