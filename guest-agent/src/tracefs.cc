#include "tracefs.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace hvtrace::agent {

std::string Tracefs::Read(const std::string& rel) const {
  const int fd = open((root_ + "/" + rel).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0 || out.size() > (1u << 20)) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

bool Tracefs::Write(const std::string& rel, const std::string& value) const {
  const int fd = open((root_ + "/" + rel).c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = write(fd, value.data(), value.size()) == static_cast<ssize_t>(value.size());
  close(fd);
  return ok;
}

bool Tracefs::Exists(const std::string& rel) const {
  return access((root_ + "/" + rel).c_str(), F_OK) == 0;
}

std::vector<std::string> Tracefs::Resolve(const std::string& spec) const {
  std::vector<std::string> out;
  const size_t colon = spec.find(':');
  const std::string sys = spec.substr(0, colon);
  const std::string name = colon == std::string::npos ? "*" : spec.substr(colon + 1);
  if (sys.empty() || sys.find('/') != std::string::npos || sys.find("..") != std::string::npos ||
      name.find('/') != std::string::npos || name.find("..") != std::string::npos) {
    return out;
  }
  if (name != "*") {
    if (Exists("events/" + sys + "/" + name + "/format")) out.push_back(sys + "/" + name);
    return out;
  }
  DIR* dir = opendir((root_ + "/events/" + sys).c_str());
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir)) {
    const std::string n = e->d_name;
    if (n[0] != '.' && Exists("events/" + sys + "/" + n + "/format")) out.push_back(sys + "/" + n);
  }
  closedir(dir);
  std::sort(out.begin(), out.end());
  return out;
}

std::string Tracefs::CurrentClock() const {
  const std::string text = Read("trace_clock");
  const size_t open_bracket = text.find('[');
  const size_t close_bracket = text.find(']', open_bracket);
  if (open_bracket == std::string::npos || close_bracket == std::string::npos) return {};
  return text.substr(open_bracket + 1, close_bracket - open_bracket - 1);
}

namespace {

// "NAME: N" at the start of a line of |text|, or 0.
uint64_t StatsField(const std::string& text, const std::string& name) {
  const std::string key = name + ":";
  for (size_t at = 0; (at = text.find(key, at)) != std::string::npos; at += key.size()) {
    if (at == 0 || text[at - 1] == '\n')
      return std::strtoull(text.c_str() + at + key.size(), nullptr, 10);
  }
  return 0;
}

}  // namespace

uint64_t Tracefs::Overrun(unsigned cpu) const {
  return StatsField(Read("per_cpu/cpu" + std::to_string(cpu) + "/stats"), "overrun");
}

uint64_t Tracefs::Entries(unsigned cpu) const {
  return StatsField(Read("per_cpu/cpu" + std::to_string(cpu) + "/stats"), "entries");
}

}  // namespace hvtrace::agent
