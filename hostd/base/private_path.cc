#include "private_path.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "state_dir.h"

namespace hvtrace::hostd {
namespace {

std::string ModeText(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

std::string Describe(const struct stat& st) {
  return "owner uid " + std::to_string(st.st_uid) + ", mode " + ModeText(st.st_mode);
}

bool TrustedOwner(uid_t uid) { return uid == 0 || uid == ::geteuid(); }

}  // namespace

std::string DescribeOwnerAndMode(const std::filesystem::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return std::strerror(errno);
  return Describe(st);
}

Status CheckTrustedPath(const std::filesystem::path& path, const std::string& what) {
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  if (ec) return Error{what + " " + path.string() + ": " + ec.message()};
  std::filesystem::path partial;
  for (const auto& part : absolute.lexically_normal()) {
    partial /= part;
    if (part.empty()) continue;  // A trailing "/".
    struct stat st {};
    if (::lstat(partial.c_str(), &st) != 0) {
      return Error{what + " " + absolute.string() + ": cannot stat " + partial.string() + ": " +
                   std::strerror(errno)};
    }
    const std::string where = what + " " + absolute.string() + ": " + partial.string();
    if (S_ISLNK(st.st_mode)) return Error{where + " is a symlink; it is not followed"};
    if (!TrustedOwner(st.st_uid)) {
      return Error{where + " belongs to another user (" + Describe(st) +
                   "), who could replace what it holds"};
    }
    const bool others_write = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
    const bool sticky_root_dir = S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX) && st.st_uid == 0;
    if (others_write && !sticky_root_dir) {
      return Error{where + " is writable by others (" + Describe(st) + ")"};
    }
  }
  return {};
}

Status EnsurePrivateDir(const std::filesystem::path& dir, const std::string& what) {
  if (Status s = MakeDirs(dir, 0700); !s.ok()) return Error{what + ": " + s.error().message};
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    return Error{what + ": cannot stat " + dir.string() + ": " + std::strerror(errno)};
  }
  if (!S_ISDIR(st.st_mode)) return Error{what + ": " + dir.string() + " is not a directory"};
  if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    return Error{what + ": " + dir.string() + " must be this daemon's own (uid " +
                 std::to_string(::geteuid()) + ", mode 0700), not " + Describe(st)};
  }
  return CheckTrustedPath(dir, what);
}

namespace {

// Creates |dir| (0700) if missing and opens it without following a symlink,
// so a chown or chmod through the descriptor acts on what was checked; |st|
// is its fstat.
Result<UniqueFd> MakeAndOpenDir(const std::filesystem::path& dir, const std::string& what,
                                struct stat& st) {
  if (Status s = MakeDirs(dir, 0700); !s.ok()) return Error{what + ": " + s.error().message};
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) {
    return Error{what + ": cannot open " + dir.string() +
                 " (a directory, not a symlink): " + std::strerror(errno)};
  }
  if (::fstat(fd.get(), &st) != 0) {
    return Error{what + ": cannot stat " + dir.string() + ": " + std::strerror(errno)};
  }
  return fd;
}

}  // namespace

Status EnsureGuestMemoryDir(const std::filesystem::path& dir, std::optional<gid_t> qemu_gid,
                            const std::string& what) {
  struct stat st {};
  Result<UniqueFd> opened = MakeAndOpenDir(dir, what, st);
  if (!opened.ok()) return opened.error();
  UniqueFd fd = std::move(*opened);
  // Group search is the one bit beyond 0700 this directory may have.
  if (st.st_uid != ::geteuid() || (st.st_mode & 0067) != 0) {
    return Error{what + ": " + dir.string() + " must be this daemon's own (uid " +
                 std::to_string(::geteuid()) + ", mode 0700 or 0710), not " + Describe(st)};
  }
  if (qemu_gid && (st.st_gid != *qemu_gid || (st.st_mode & 07777) != 0710)) {
    if (::fchown(fd.get(), static_cast<uid_t>(-1), *qemu_gid) != 0 ||
        ::fchmod(fd.get(), 0710) != 0) {
      return Error{what + ": cannot give " + dir.string() + " to QEMU's group (gid " +
                   std::to_string(*qemu_gid) + ", mode 0710): " + std::strerror(errno)};
    }
  }
  return CheckTrustedPath(dir, what);
}

Status TightenPrivateDir(const std::filesystem::path& dir, const std::string& what,
                         bool* tightened) {
  if (tightened != nullptr) *tightened = false;
  struct stat st {};
  Result<UniqueFd> opened = MakeAndOpenDir(dir, what, st);
  if (!opened.ok()) return opened.error();
  UniqueFd fd = std::move(*opened);
  if (st.st_uid != ::geteuid()) {
    return Error{what + ": " + dir.string() + " must be this daemon's own (uid " +
                 std::to_string(::geteuid()) + "), not " + Describe(st)};
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    // Someone else may already have planted entries: tightening now would
    // bless them.
    return Error{what + ": " + dir.string() + " is writable by others (" + Describe(st) +
                 "); what is in it cannot be trusted"};
  }
  if ((st.st_mode & 077) != 0) {
    if (::fchmod(fd.get(), 0700) != 0) {
      return Error{what + ": cannot tighten " + dir.string() + " (" + Describe(st) +
                   ") to 0700: " + std::strerror(errno)};
    }
    if (tightened != nullptr) *tightened = true;
  }
  return CheckTrustedPath(dir, what);
}

Result<UniqueFd> CreateExclusiveFile(const std::filesystem::path& path, mode_t mode,
                                     const std::string& what) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
  if (fd.get() >= 0) {
    // The umask may have cleared bits the caller wants (e.g. 0660 for QEMU's group).
    if (::fchmod(fd.get(), mode) != 0) {
      const int err = errno;
      ::unlink(path.c_str());
      return Error{what + " " + path.string() + ": cannot chmod: " + std::strerror(err)};
    }
    return fd;
  }
  const int err = errno;
  if (err == EEXIST) {
    struct stat st {};
    std::string there = "something";
    if (::lstat(path.c_str(), &st) == 0) {
      there = S_ISLNK(st.st_mode)   ? "a symlink"
              : S_ISDIR(st.st_mode) ? "a directory"
              : S_ISREG(st.st_mode) ? "a file"
                                    : "not a regular file";
      there += " (" + Describe(st) + ")";
    }
    return Error{what + " " + path.string() + " already exists (" + there + ")"};
  }
  return Error{what + ": cannot create " + path.string() + ": " + std::strerror(err)};
}

}  // namespace hvtrace::hostd
