// The credentials file of the fleet upload and of `hvtrace fleet`:
//
//   # comment
//   access_key = AKIA…
//   secret_key = …
//
// The daemon's file (upload_credentials) must be a regular file owned by root
// or by the daemon's user and not readable by group or others: it holds a
// secret that writes to the fleet's bucket.
#ifndef HVTRACE_HOSTD_FLEET_S3_CREDENTIALS_H_
#define HVTRACE_HOSTD_FLEET_S3_CREDENTIALS_H_

#include <filesystem>
#include <string>
#include <string_view>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

struct S3Credentials {
  std::string access_key;
  std::string secret_key;
};

// Parses the text of a credentials file; |origin| names it in errors.
Result<S3Credentials> ParseS3Credentials(std::string_view text, std::string_view origin);

// Reads |path| (at most 64 KiB). |private_only|: refuse a file that is not
// owned by root or this process's user, or that group or others may read,
// with an error saying which file, its owner and mode, and why.
Result<S3Credentials> LoadS3Credentials(const std::filesystem::path& path, bool private_only);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_FLEET_S3_CREDENTIALS_H_
