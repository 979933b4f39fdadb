#include "zstd_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "unique_fd.h"

namespace hvtrace::hostd {
namespace {

struct CctxFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DctxFree {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

Status WriteAll(int fd, const void* data, size_t size, const std::filesystem::path& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Error{"cannot write " + path.string() + ": " + std::strerror(errno)};
    p += n;
    size -= static_cast<size_t>(n);
  }
  return {};
}

Result<UniqueFd> OpenPair(const std::filesystem::path& in, const std::filesystem::path& out,
                          UniqueFd& out_fd) {
  UniqueFd in_fd(::open(in.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (in_fd.get() < 0) return Error{"cannot open " + in.string() + ": " + std::strerror(errno)};
  out_fd =
      UniqueFd(::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (out_fd.get() < 0) return Error{"cannot create " + out.string() + ": " + std::strerror(errno)};
  return in_fd;
}

}  // namespace

Status CompressFile(const std::filesystem::path& in, const std::filesystem::path& out) {
  UniqueFd out_fd;
  auto in_fd = OpenPair(in, out, out_fd);
  if (!in_fd.ok()) return in_fd.error();
  std::unique_ptr<ZSTD_CCtx, CctxFree> cctx(ZSTD_createCCtx());
  ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, 3);
  ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_checksumFlag, 1);
  std::error_code ec;
  const auto size = std::filesystem::file_size(in, ec);
  if (!ec) ZSTD_CCtx_setPledgedSrcSize(cctx.get(), size);
  std::vector<char> ibuf(ZSTD_CStreamInSize()), obuf(ZSTD_CStreamOutSize());
  for (;;) {
    ssize_t n = ::read(in_fd->get(), ibuf.data(), ibuf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error{"cannot read " + in.string() + ": " + std::strerror(errno)};
    const bool last = n == 0;
    ZSTD_inBuffer input{ibuf.data(), static_cast<size_t>(n), 0};
    for (;;) {
      ZSTD_outBuffer output{obuf.data(), obuf.size(), 0};
      size_t rest =
          ZSTD_compressStream2(cctx.get(), &output, &input, last ? ZSTD_e_end : ZSTD_e_continue);
      if (ZSTD_isError(rest)) return Error{"zstd " + in.string() + ": " + ZSTD_getErrorName(rest)};
      if (Status s = WriteAll(out_fd.get(), obuf.data(), output.pos, out); !s.ok()) return s;
      if (last ? rest == 0 : input.pos == input.size) break;
    }
    if (last) break;
  }
  if (::fsync(out_fd.get()) != 0)
    return Error{"fsync " + out.string() + ": " + std::strerror(errno)};
  return {};
}

Status DecompressFile(const std::filesystem::path& in, const std::filesystem::path& out,
                      uint64_t max_bytes) {
  UniqueFd out_fd;
  auto in_fd = OpenPair(in, out, out_fd);
  if (!in_fd.ok()) return in_fd.error();
  std::unique_ptr<ZSTD_DCtx, DctxFree> dctx(ZSTD_createDCtx());
  std::vector<char> ibuf(ZSTD_DStreamInSize()), obuf(ZSTD_DStreamOutSize());
  uint64_t total = 0;
  size_t rest = 0;
  bool any = false;
  for (;;) {
    ssize_t n = ::read(in_fd->get(), ibuf.data(), ibuf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error{"cannot read " + in.string() + ": " + std::strerror(errno)};
    if (n == 0) break;
    any = true;
    ZSTD_inBuffer input{ibuf.data(), static_cast<size_t>(n), 0};
    // A full output buffer may leave bytes inside the context: call again,
    // until the frame is done (0); a call after that would start a new frame.
    ZSTD_outBuffer output{obuf.data(), obuf.size(), 0};
    do {
      output = {obuf.data(), obuf.size(), 0};
      rest = ZSTD_decompressStream(dctx.get(), &output, &input);
      if (ZSTD_isError(rest)) return Error{"zstd " + in.string() + ": " + ZSTD_getErrorName(rest)};
      total += output.pos;
      if (total > max_bytes) {
        return Error{in.string() + " decompresses to more than " + std::to_string(max_bytes) +
                     " bytes"};
      }
      if (Status s = WriteAll(out_fd.get(), obuf.data(), output.pos, out); !s.ok()) return s;
    } while (input.pos < input.size || (output.pos == output.size && rest != 0));
  }
  if (!any || rest != 0) return Error{in.string() + ": truncated zstd frame"};
  return {};
}

}  // namespace hvtrace::hostd
