// SHA-256 (FIPS 180-4), for the format cache's kernel key. Our own small
// implementation so hostd does not take a crypto library dependency for one
// content hash; checked against the NIST test vectors in the unit tests.
#ifndef HVTRACE_HOSTD_FORMATS_SHA256_H_
#define HVTRACE_HOSTD_FORMATS_SHA256_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

class Sha256 {
 public:
  using Digest = std::array<uint8_t, 32>;

  Sha256();
  void Update(std::span<const std::byte> data);
  // Ends the hash; the object must not be updated afterwards.
  Digest Finish();

  // Lowercase hex of |digest|.
  static std::string Hex(const Digest& digest);

 private:
  void Block(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

// Lowercase hex SHA-256 of |data|.
std::string Sha256Hex(std::span<const std::byte> data);

// Lowercase hex SHA-256 of the file at |path|, read in chunks. Errors name the
// file.
Result<std::string> Sha256File(const std::string& path);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_FORMATS_SHA256_H_
