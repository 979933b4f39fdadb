#include "boot_marker.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace hvtrace::agent {

std::string BootMarkerText(long pid) { return "hvtrace-agent: started pid " + std::to_string(pid); }

bool WriteBootMarker(const std::string& tracefs, const std::string& instance,
                     const std::string& text) {
  if (instance.empty() || instance == "." || instance == ".." ||
      instance.find('/') != std::string::npos) {
    return false;
  }
  const std::string dir = tracefs + "/instances/" + instance;
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
  // O_WRONLY without O_CREAT: a missing trace_marker is not made up.
  const int fd = open((dir + "/trace_marker").c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const std::string line = text + "\n";
  const bool ok = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  close(fd);
  return ok;
}

}  // namespace hvtrace::agent
