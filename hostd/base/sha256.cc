#include "sha256.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "unique_fd.h"

namespace hvtrace::hostd {

Sha256::Sha256() { sha256_init(&ctx_); }

void Sha256::Update(std::span<const std::byte> data) {
  sha256_update(&ctx_, data.size(), reinterpret_cast<const uint8_t*>(data.data()));
}

Sha256::Digest Sha256::Finish() {
  Digest digest;
  sha256_digest(&ctx_, digest.size(), digest.data());
  return digest;
}

std::string Sha256::Hex(const Digest& digest) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (uint8_t b : digest) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

std::string Sha256Hex(std::span<const std::byte> data) {
  Sha256 h;
  h.Update(data);
  return Sha256::Hex(h.Finish());
}

Result<std::string> Sha256File(const std::string& path) {
  UniqueFd file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  const int fd = file.get();
  if (fd < 0) return Error{"cannot open " + path + ": " + std::strerror(errno)};
  Sha256 h;
  std::vector<std::byte> buf(1 << 20);
  uint64_t offset = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      return Error{"reading " + path + " at offset " + std::to_string(offset) + ": " +
                   std::strerror(err)};
    }
    if (n == 0) break;
    h.Update(std::span<const std::byte>(buf.data(), static_cast<size_t>(n)));
    offset += static_cast<uint64_t>(n);
  }
  return Sha256::Hex(h.Finish());
}

}  // namespace hvtrace::hostd
