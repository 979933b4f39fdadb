// A minimal ustar writer: the boot archive the agent sends over the metadata
// channel (hvtrace/meta_channel.h kBoot). The agent is a static binary with
// no tar library, and all it writes is a handful of regular files.
#ifndef HVTRACE_AGENT_USTAR_H_
#define HVTRACE_AGENT_USTAR_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hvtrace::agent {

struct TarFile {
  std::string name;  // 1..99 characters, no directories created for it.
  std::string data;
};

// POSIX ustar: per file a 512-byte header (mode 0644, uid/gid 0, mtime 0, so
// the same files give the same bytes) and the data padded to 512 bytes; two
// zero blocks at the end. Names longer than 99 characters are cut (the
// agent's are fixed and short).
std::string WriteUstar(const std::vector<TarFile>& files);

}  // namespace hvtrace::agent

#endif  // HVTRACE_AGENT_USTAR_H_
