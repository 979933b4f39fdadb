#include "qemu_user.h"

#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

namespace hvtrace::hostd {
namespace {

// getpwnam_r: the daemon's threads look users up concurrently. nullopt when
// there is no such user; an error when the lookup itself failed.
Result<std::optional<passwd>> LookUpUser(const std::string& name, std::vector<char>& buffer) {
  passwd pw{};
  passwd* found = nullptr;
  buffer.assign(16384, '\0');
  const int err = ::getpwnam_r(name.c_str(), &pw, buffer.data(), buffer.size(), &found);
  if (err != 0 && err != ENOENT && err != ESRCH) {
    return Error{"cannot look up user '" + name + "': " + std::strerror(err)};
  }
  if (found == nullptr) return std::optional<passwd>();
  return std::optional<passwd>(pw);
}

}  // namespace

Result<QemuUser> ResolveQemuUser(const std::string& configured, const std::string& vm) {
  const std::string which = "VM '" + vm + "': ";
  QemuUser out;
  if (configured == "root") {
    out.warning = which +
                  "QEMU runs as root (qemu_user = root): a device-emulation escape is "
                  "host root";
    return out;
  }
  const std::string name = configured.empty() ? std::string(kDefaultQemuUser) : configured;
  std::vector<char> buffer;
  Result<std::optional<passwd>> pw = LookUpUser(name, buffer);
  if (!pw.ok()) return Error{which + pw.error().message};
  if (!pw->has_value()) {
    if (!configured.empty()) {
      return Error{which + "qemu_user '" + configured +
                   "' does not exist (create it, or set qemu_user = root to run QEMU as root)"};
    }
    out.warning = which + "QEMU runs as root: there is no user '" + name +
                  "' (the hvtrace package creates it: systemd-sysusers hvtrace.conf); set "
                  "qemu_user = root to say root is meant";
    return out;
  }
  if ((*pw)->pw_uid == 0) {
    out.warning = which + "QEMU runs as root (qemu_user '" + name + "' has uid 0)";
    return out;
  }
  out.run_as = name;
  out.uid = (*pw)->pw_uid;
  out.gid = (*pw)->pw_gid;
  return out;
}

std::optional<ProcessCredentials> ReadProcessCredentials(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  std::optional<uid_t> uid;
  std::optional<gid_t> gid;
  // "Uid:\treal\teffective\tsaved\tfs": the effective id decides access.
  while (std::getline(status, line)) {
    std::istringstream fields(line);
    std::string key;
    unsigned long real = 0, effective = 0;
    if (!(fields >> key >> real >> effective)) continue;
    if (key == "Uid:") uid = static_cast<uid_t>(effective);
    if (key == "Gid:") gid = static_cast<gid_t>(effective);
  }
  if (!uid || !gid) return std::nullopt;
  return ProcessCredentials{*uid, *gid};
}

}  // namespace hvtrace::hostd
