#include "text_areas.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "clock_ns.h"

namespace hvtrace::agent {

std::string ReadWholeFile(const std::string& path, int* error) {
  *error = 0;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = errno;
    return {};
  }
  std::string out;
  // /proc files report size 0: read in large steps until EOF.
  std::string buf(1 << 16, '\0');
  for (;;) {
    const ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) *error = errno;
    if (n <= 0) break;
    out.append(buf.data(), static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

SymbolSource::~SymbolSource() {
  if (worker_.joinable()) worker_.join();
}

void SymbolSource::Start() {
  if (worker_.joinable() || done_.load()) return;
  worker_ = std::thread([this] { Work(); });
}

void SymbolSource::Work() {
  const double t0 = MonotonicMs();
  int error = 0;
  const std::string kallsyms = ReadWholeFile(path_, &error);
  const double t1 = MonotonicMs();
  bool any_address = false;
  const std::string text = TextSymbolsOf(kallsyms, &any_address);
  char note[256];
  if (kallsyms.empty()) {
    result_.state = region::kSymbolsUnreadable;
    std::snprintf(note, sizeof note, "cannot read %s (%s): no symbols published", path_.c_str(),
                  error != 0 ? std::strerror(error) : "empty");
  } else if (!any_address) {
    result_.state = region::kSymbolsRestricted;
    std::snprintf(note, sizeof note,
                  "%s shows only zero addresses (kptr_restrict): no symbols published, the host "
                  "prints addresses",
                  path_.c_str());
  } else {
    result_.text = EncodeText(text);
    const double t2 = MonotonicMs();
    result_.state =
        region::kSymbolsPublished;  // Unless the area is missing or small: the agent decides.
    std::snprintf(
        note, sizeof note,
        "symbols: %llu text symbols, %zu bytes, %zu compressed; read %.0f ms, compress %.0f ms",
        static_cast<unsigned long long>(result_.text.lines), text.size(),
        result_.text.stored.size(), t1 - t0, t2 - t1);
  }
  result_.note = note;
  done_.store(true, std::memory_order_release);
}

}  // namespace hvtrace::agent
