#include "daemon_log.h"

#include <unistd.h>

namespace hvtrace::hostd {

void Log(const std::string& message) {
  std::string line = "hvtraced: " + message + "\n";
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace hvtrace::hostd
