#include "s3_credentials.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "private_path.h"
#include "unique_fd.h"

namespace hvtrace::hostd {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

}  // namespace

Result<S3Credentials> ParseS3Credentials(std::string_view text, std::string_view origin) {
  S3Credentials out;
  std::set<std::string, std::less<>> seen;
  size_t line_no = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = Trim(text.substr(0, nl));
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++line_no;
    const std::string where = std::string(origin) + ":" + std::to_string(line_no) + ": ";
    if (line.empty() || line.front() == '#') continue;
    size_t eq = line.find('=');
    if (eq == std::string_view::npos) return Error{where + "expected 'key = value'"};
    std::string_view key = Trim(line.substr(0, eq));
    std::string_view value = Trim(line.substr(eq + 1));
    if (!seen.insert(std::string(key)).second) {
      return Error{where + "'" + std::string(key) + "' is set twice"};
    }
    if (key == "access_key") {
      out.access_key = std::string(value);
    } else if (key == "secret_key") {
      out.secret_key = std::string(value);
    } else {
      // Never echo a value: it may be a secret put on the wrong line.
      return Error{where + "unknown key '" + std::string(key.substr(0, 64)) + "'"};
    }
  }
  if (out.access_key.empty() || out.secret_key.empty()) {
    return Error{std::string(origin) + ": needs both access_key and secret_key"};
  }
  return out;
}

Result<S3Credentials> LoadS3Credentials(const std::filesystem::path& path, bool private_only) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (fd.get() < 0)
    return Error{"cannot open credentials " + path.string() + ": " + std::strerror(errno)};
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return Error{"credentials " + path.string() + " is not a regular file"};
  }
  if (private_only) {
    if (st.st_uid != 0 && st.st_uid != ::geteuid()) {
      return Error{"credentials " + path.string() + " (" + DescribeOwnerAndMode(path) +
                   ") must be owned by root or uid " + std::to_string(::geteuid()) +
                   ": another user could change which store captures go to"};
    }
    if ((st.st_mode & 077) != 0) {
      return Error{"credentials " + path.string() + " (" + DescribeOwnerAndMode(path) +
                   ") must not be readable or writable by group or others: it holds the "
                   "bucket's secret key (chmod 600)"};
    }
  }
  if (st.st_size > 65536) return Error{"credentials " + path.string() + " is larger than 64 KiB"};
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::read(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  text.resize(done);
  return ParseS3Credentials(text, path.string());
}

}  // namespace hvtrace::hostd
