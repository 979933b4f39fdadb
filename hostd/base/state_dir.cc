#include "state_dir.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

namespace hvtrace::hostd {

Status ValidateVmName(std::string_view name) {
  if (name.empty() || name.size() > 64) {
    return Error{"invalid VM name '" + std::string(name.substr(0, 80)) +
                 "': must be 1..64 characters"};
  }
  if (name.front() == '.' || name.front() == '-') {
    return Error{"invalid VM name '" + std::string(name) + "': must not start with '.' or '-'"};
  }
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) {
      return Error{"invalid VM name '" + std::string(name) +
                   "': only letters, digits, '.', '_' and '-' are allowed"};
    }
  }
  return {};
}

Status MakeDirs(const std::filesystem::path& path, unsigned mode) {
  std::filesystem::path partial;
  for (const auto& part : path) {
    partial /= part;
    if (partial == partial.root_path()) continue;
    if (::mkdir(partial.c_str(), mode) == 0) continue;
    int err = errno;
    if (err == EEXIST) {
      struct stat st;
      if (::stat(partial.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;
      return Error{"cannot create directory " + partial.string() +
                   ": exists and is not a directory"};
    }
    return Error{"cannot create directory " + partial.string() + ": " + std::strerror(err)};
  }
  return {};
}

Status StateDir::Prepare() const { return MakeDirs(root_ / "vms", 0750); }

std::filesystem::path StateDir::VmDir(std::string_view name) const {
  return root_ / "vms" / std::string(name);
}

std::filesystem::path StateDir::CapturesDir(std::string_view name) const {
  return VmDir(name) / "captures";
}

Result<std::vector<std::string>> StateDir::ListVmNames() const {
  std::vector<std::string> names;
  std::error_code ec;
  std::filesystem::directory_iterator it(root_ / "vms", ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) return names;
    return Error{"cannot list " + (root_ / "vms").string() + ": " + ec.message()};
  }
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    std::string name = it->path().filename().string();
    std::error_code type_ec;
    if (it->is_directory(type_ec) && ValidateVmName(name).ok()) names.push_back(std::move(name));
  }
  if (ec) return Error{"cannot list " + (root_ / "vms").string() + ": " + ec.message()};
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace hvtrace::hostd
