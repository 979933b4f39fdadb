// The daemon's state directory:
//
//   <root>/vms/<name>/                        one directory per VM ever seen
//   <root>/vms/<name>/captures/<id>/          one committed capture
//   <root>/vms/<name>/captures/.tmp-<...>/    a capture being written (hidden,
//                                             swept at start)
//
// VM names become path components, so they are validated before any path is
// built from them.
#ifndef HVTRACE_HOSTD_STATE_DIR_H_
#define HVTRACE_HOSTD_STATE_DIR_H_

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

// 1..64 characters from [A-Za-z0-9._-], not starting with '.' or '-'.
Status ValidateVmName(std::string_view name);

class StateDir {
 public:
  explicit StateDir(std::filesystem::path root) : root_(std::move(root)) {}

  // Creates <root> and <root>/vms (mode 0750) when missing.
  Status Prepare() const;

  const std::filesystem::path& root() const { return root_; }
  // Callers validate |name| first (ValidateVmName).
  std::filesystem::path VmDir(std::string_view name) const;
  std::filesystem::path CapturesDir(std::string_view name) const;

  // Names of the VM directories that exist, sorted; entries with invalid names
  // are skipped (they are not ours).
  Result<std::vector<std::string>> ListVmNames() const;

 private:
  std::filesystem::path root_;
};

// mkdir -p with |mode| for each created level; errors name the path.
Status MakeDirs(const std::filesystem::path& path, unsigned mode);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_STATE_DIR_H_
