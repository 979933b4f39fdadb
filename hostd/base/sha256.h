// SHA-256 for content keys (the formats cache's kernel key, initrd hashes),
// computed by nettle (already on every host through libvirt's GnuTLS).
#ifndef HVTRACE_HOSTD_SHA256_H_
#define HVTRACE_HOSTD_SHA256_H_

#include <nettle/sha2.h>

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
  sha256_ctx ctx_;
};

// Lowercase hex SHA-256 of |data|.
std::string Sha256Hex(std::span<const std::byte> data);

// Lowercase hex SHA-256 of the file at |path|, read in chunks. Errors name the
// file.
Result<std::string> Sha256File(const std::string& path);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_SHA256_H_
