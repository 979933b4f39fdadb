// FindDomainQemu (libvirt_domain.h): a domain's QEMU as libvirt recorded it.
// A local user can start any process with `-name guest=NAME` in its command
// line (and a mem-path of their choosing: a FIFO, another file); scanning
// /proc for that would hand such a process the daemon's trust. libvirtd's
// pid file is written by root into libvirt's directory, so it is the anchor.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <optional>

#include "libvirt_domain.h"
#include "unique_fd.h"
#include "vm_process.h"

namespace hvtrace::hostd {
namespace {

namespace fs = std::filesystem;

std::string Errno() { return std::strerror(errno); }

std::vector<std::string> ReadCmdline(pid_t pid) {
  std::string all;
  UniqueFd fd(::open(("/proc/" + std::to_string(pid) + "/cmdline").c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() >= 0) {
    char buf[4096];
    ssize_t n;
    // QEMU command lines are long but bounded; cap what we hold anyway.
    while (all.size() < (1u << 20) && (n = ::read(fd.get(), buf, sizeof buf)) > 0) {
      all.append(buf, static_cast<size_t>(n));
    }
  }
  std::vector<std::string> args;
  size_t start = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i] == '\0') {
      args.push_back(all.substr(start, i - start));
      start = i + 1;
    }
  }
  return args;
}

// QEMU started by libvirt for domain |name|: "-name guest=NAME,...".
bool IsDomainQemu(const std::vector<std::string>& args, const std::string& name) {
  const std::string guest_arg = "guest=" + name;
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "-name" &&
        (args[i + 1] == guest_arg || args[i + 1].rfind(guest_arg + ",", 0) == 0)) {
      return true;
    }
  }
  return false;
}

// The peer of libvirtd's socket: pid and uid (SO_PEERCRED).
Result<ucred> LibvirtdPeer(const fs::path& socket_path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.native().size() >= sizeof addr.sun_path)
    return Error{"libvirt socket path " + socket_path.string() + " is too long"};
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.native().size());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return Error{"socket: " + Errno()};
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0)
    return Error{"cannot connect to libvirtd at " + socket_path.string() + ": " + Errno()};
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return Error{"SO_PEERCRED on " + socket_path.string() + ": " + Errno()};
  return cred;
}

struct Opened {
  UniqueFd fd;
  uid_t owner = 0;
};

// Opens |name| in |dir| without following a symlink and checks it is root's
// (|user_ok|: or another user's) and not writable by others (a root-owned
// sticky directory is fine).
Result<Opened> OpenOwned(int dir, const std::string& name, int flags, const std::string& shown,
                         bool user_ok = false) {
  UniqueFd fd(::openat(dir, name.c_str(), flags | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) return Error{"cannot open " + shown + ": " + Errno()};
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Error{"cannot stat " + shown + ": " + Errno()};
  const bool others_write = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
  const bool root_sticky_dir = S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX) && st.st_uid == 0;
  if ((st.st_uid != 0 && !user_ok) || (others_write && !root_sticky_dir)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Error{shown + " is not libvirt's (owner uid " + std::to_string(st.st_uid) + ", mode " +
                 mode + "): refusing to trust it"};
  }
  return Opened{std::move(fd), st.st_uid};
}

double Seconds(const timespec& t) { return static_cast<double>(t.tv_sec) + t.tv_nsec * 1e-9; }

// How many seconds after |pid| started the file time |written| (realtime)
// is; negative when the file is older than the process. Both are put on
// the boot-time clock the kernel keeps process start times on.
std::optional<double> WrittenAfterStart(pid_t pid, const timespec& written) {
  const std::optional<uint64_t> ticks = ProcessStartTime(pid);
  const long hz = ::sysconf(_SC_CLK_TCK);
  timespec boot{}, real{};
  if (!ticks || hz <= 0 || ::clock_gettime(CLOCK_BOOTTIME, &boot) != 0 ||
      ::clock_gettime(CLOCK_REALTIME, &real) != 0) {
    return std::nullopt;
  }
  const double written_boottime = Seconds(boot) - (Seconds(real) - Seconds(written));
  return written_boottime - static_cast<double>(*ticks) / static_cast<double>(hz);
}

}  // namespace

Result<fs::path> LibvirtSocketOfUri(const std::string& uri) {
  const size_t scheme_end = uri.find("://");
  const std::string scheme = uri.substr(0, scheme_end);
  if (scheme_end == std::string::npos || (scheme != "qemu" && scheme != "qemu+unix")) {
    return Error{"libvirt URI '" + uri + "' is not a local qemu:///system URI"};
  }
  const std::string rest = uri.substr(scheme_end + 3);
  const size_t query = rest.find('?');
  if (rest.substr(0, query) != "/system") {
    return Error{"libvirt URI '" + uri +
                 "' does not name the local system daemon (qemu:///system): hvtraced runs "
                 "next to the domains it serves"};
  }
  fs::path socket = "/run/libvirt/libvirt-sock";
  if (query != std::string::npos) {
    std::string params = rest.substr(query + 1);
    size_t pos = 0;
    while (pos <= params.size()) {
      size_t amp = params.find('&', pos);
      if (amp == std::string::npos) amp = params.size();
      const std::string param = params.substr(pos, amp - pos);
      if (param.rfind("socket=", 0) == 0) socket = param.substr(7);
      pos = amp + 1;
    }
  }
  if (!socket.is_absolute()) return Error{"libvirt URI '" + uri + "': socket is not absolute"};
  return socket;
}

Result<pid_t> ParsePidFileText(std::string_view text) {
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  if (text.empty() || text.size() > 10 || text.find_first_not_of("0123456789") != text.npos) {
    return Error{"not a pid: '" + std::string(text.substr(0, 16)) + "'"};
  }
  const long pid = std::stol(std::string(text));
  if (pid <= 1 || pid > (1 << 22)) return Error{"pid " + std::to_string(pid) + " is out of range"};
  return static_cast<pid_t>(pid);
}

Result<DomainQemu> FindDomainQemu(const std::string& uri, const std::string& name) {
  const std::string ctx = "domain '" + name + "': finding its QEMU through libvirt: ";
  if (name.empty() || name.find('/') != std::string::npos || name.front() == '.')
    return Error{ctx + "the name cannot be a file name"};
  Result<fs::path> socket = LibvirtSocketOfUri(uri);
  if (!socket.ok()) return Error{ctx + socket.error().message};
  Result<ucred> libvirtd = LibvirtdPeer(*socket);
  if (!libvirtd.ok()) return Error{ctx + libvirtd.error().message};
  if (libvirtd->uid != 0) {
    return Error{ctx + socket->string() + " is served by uid " + std::to_string(libvirtd->uid) +
                 ", not by a system libvirtd (root)"};
  }
  const std::optional<uint64_t> libvirtd_start = ProcessStartTime(libvirtd->pid);
  // libvirtd's own view of /run: a private libvirtd in its own mount
  // namespace keeps its state elsewhere on this host's file system.
  const std::string root = "/proc/" + std::to_string(libvirtd->pid) + "/root";
  const fs::path pid_path = fs::path(root) / "run/libvirt/qemu" / (name + ".pid");
  UniqueFd dir(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0) return Error{ctx + "cannot open " + root + ": " + Errno()};
  std::string shown = root;
  // Debian 13's libvirt 11.3 (not Debian 12's 9.0) gives its QEMU state
  // directory to the user it runs QEMU as (libvirt-qemu, 0755). Such a
  // directory is trusted as that user's only: the QEMU found must run as
  // its owner (below), and the pid file in it must still be root's, which
  // that user cannot forge (renaming another domain's pid file in is caught
  // by the -name check).
  uid_t state_owner = 0;
  for (const char* part : {"run", "libvirt", "qemu"}) {
    shown += std::string("/") + part;
    Result<Opened> next = OpenOwned(dir.get(), part, O_PATH | O_DIRECTORY, shown,
                                    /*user_ok=*/std::string_view(part) == "qemu");
    if (!next.ok()) return Error{ctx + next.error().message};
    dir = std::move(next->fd);
    state_owner = next->owner;
  }
  Result<Opened> file =
      OpenOwned(dir.get(), name + ".pid", O_RDONLY | O_NONBLOCK, pid_path.string());
  if (!file.ok()) {
    return Error{ctx + file.error().message + " (is the domain running under this libvirtd?)"};
  }
  struct stat st {};
  char buf[32] = {};
  const ssize_t n = ::fstat(file->fd.get(), &st) == 0 && S_ISREG(st.st_mode)
                        ? ::read(file->fd.get(), buf, sizeof buf - 1)
                        : -1;
  if (n <= 0) return Error{ctx + pid_path.string() + " is not a readable regular file"};
  Result<pid_t> pid = ParsePidFileText(std::string_view(buf, static_cast<size_t>(n)));
  if (!pid.ok()) return Error{ctx + pid_path.string() + ": " + pid.error().message};
  // The pid file was read through libvirtd's /proc entry: it must still be
  // that libvirtd (not a pid reused meanwhile by someone else's namespace).
  if (!libvirtd_start || ProcessStartTime(libvirtd->pid) != libvirtd_start)
    return Error{ctx + "libvirtd pid " + std::to_string(libvirtd->pid) + " went away"};

  DomainQemu qemu;
  qemu.pid = *pid;
  qemu.pid_file = pid_path;
  const std::string proc = "/proc/" + std::to_string(*pid);
  struct stat owner {};
  const std::optional<double> after = WrittenAfterStart(*pid, st.st_mtim);
  if (::stat(proc.c_str(), &owner) != 0 || !after) {
    return Error{ctx + "QEMU pid " + std::to_string(*pid) + " from " + pid_path.string() +
                 " is not running"};
  }
  // libvirt writes the pid file after QEMU's process exists: a process that
  // started later only reuses the pid of a QEMU that is gone. (2 s of slack
  // for clock adjustments since.)
  if (*after < -2.0) {
    return Error{ctx + "pid " + std::to_string(*pid) + " started after libvirt wrote " +
                 pid_path.string() + ": it is not the domain's QEMU (the pid was reused)"};
  }
  if (state_owner != 0 && owner.st_uid != state_owner) {
    return Error{ctx + shown + " is uid " + std::to_string(state_owner) +
                 "'s, not root's, and QEMU pid " + std::to_string(*pid) + " runs as uid " +
                 std::to_string(owner.st_uid) +
                 ": a state directory not root's is trusted only as the QEMU user's"};
  }
  qemu.uid = owner.st_uid;
  qemu.gid = owner.st_gid;
  qemu.args = ReadCmdline(*pid);
  if (!IsDomainQemu(qemu.args, name)) {
    return Error{ctx + "pid " + std::to_string(*pid) + " from " + pid_path.string() +
                 " is not a QEMU for this domain (no -name guest=" + name + ")"};
  }
  return qemu;
}

}  // namespace hvtrace::hostd
