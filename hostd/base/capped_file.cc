#include "capped_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

namespace hvtrace::hostd {
namespace {

template <class Buffer>
Result<Buffer> ReadCapped(const std::filesystem::path& path, size_t cap, bool missing_ok) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (missing_ok && errno == ENOENT) return Buffer();
    return Error{"cannot open " + path.string() + ": " + std::strerror(errno)};
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Error{path.string() + " is not a regular file"};
  }
  if (static_cast<uint64_t>(st.st_size) > cap) {
    ::close(fd);
    return Error{path.string() + " is " + std::to_string(st.st_size) + " bytes, more than the " +
                 std::to_string(cap) + "-byte limit"};
  }
  // Sized from fstat, so a file that grows while read is cut at that size.
  Buffer data(static_cast<size_t>(st.st_size), typename Buffer::value_type{});
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::read(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? std::strerror(errno) : "file shrank while read";
      ::close(fd);
      return Error{"reading " + path.string() + " at offset " + std::to_string(done) + ": " + why};
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return data;
}

}  // namespace

Result<std::string> ReadCappedFile(const std::filesystem::path& path, size_t cap, bool missing_ok) {
  return ReadCapped<std::string>(path, cap, missing_ok);
}

Result<std::vector<std::byte>> ReadCappedFileBytes(const std::filesystem::path& path, size_t cap) {
  return ReadCapped<std::vector<std::byte>>(path, cap, false);
}

bool SameContents(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::error_code ec_a, ec_b;
  if (std::filesystem::file_size(a, ec_a) != std::filesystem::file_size(b, ec_b) || ec_a || ec_b)
    return false;
  std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
  std::vector<char> ba(1 << 20), bb(1 << 20);
  while (fa && fb) {
    fa.read(ba.data(), static_cast<std::streamsize>(ba.size()));
    fb.read(bb.data(), static_cast<std::streamsize>(bb.size()));
    if (fa.gcount() != fb.gcount() ||
        std::memcmp(ba.data(), bb.data(), static_cast<size_t>(fa.gcount())) != 0) {
      return false;
    }
  }
  return fa.eof() && fb.eof();
}

std::string ReadFileTail(const std::string& path, size_t max_bytes) {
  std::string out;
  if (path.empty()) return out;
  // O_NONBLOCK: a FIFO at |path| must not hang an error message.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return out;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    const off_t size = st.st_size;
    const off_t from =
        size > static_cast<off_t>(max_bytes) ? size - static_cast<off_t>(max_bytes) : 0;
    out.resize(static_cast<size_t>(size - from));
    const ssize_t n = ::pread(fd, out.data(), out.size(), from);
    out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  }
  ::close(fd);
  return out;
}

}  // namespace hvtrace::hostd
