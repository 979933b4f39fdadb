#include "ustar.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace hvtrace::agent {
namespace {

constexpr size_t kBlock = 512;

// |value| as zero-padded octal in |len| - 1 digits and a NUL.
void PutOctal(char* field, size_t len, unsigned long long value) {
  std::snprintf(field, len, "%0*llo", static_cast<int>(len - 1), value);
}

}  // namespace

std::string WriteUstar(const std::vector<TarFile>& files) {
  std::string out;
  for (const TarFile& f : files) {
    char h[kBlock];
    std::memset(h, 0, sizeof h);
    std::memcpy(h, f.name.data(), std::min<size_t>(f.name.size(), 99));
    PutOctal(h + 100, 8, 0644);  // mode
    PutOctal(h + 108, 8, 0);     // uid
    PutOctal(h + 116, 8, 0);     // gid
    PutOctal(h + 124, 12, f.data.size());
    PutOctal(h + 136, 12, 0);          // mtime
    h[156] = '0';                      // Regular file.
    std::memcpy(h + 257, "ustar", 6);  // Magic with its NUL ...
    std::memcpy(h + 263, "00", 2);     // ... and the version.
    // The checksum counts its own field as eight blanks.
    std::memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (char c : h) sum += static_cast<unsigned char>(c);
    std::snprintf(h + 148, 8, "%06o", sum);  // Six digits, NUL, and the blank kept.
    out.append(h, kBlock);
    out.append(f.data);
    out.append((kBlock - f.data.size() % kBlock) % kBlock, '\0');
  }
  out.append(2 * kBlock, '\0');
  return out;
}

}  // namespace hvtrace::agent
