#include "boot_buffer.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "hvtrace/handshake_kprobes.h"

namespace hvtrace::agent {
namespace {

namespace fs = std::filesystem;

// The host's constants (hostd/base/gpa_layout.h).
constexpr uint64_t kPage = 4096;
constexpr uint64_t kHeadroom = 48ull << 20;
constexpr size_t kSratHeaderBytes = 48;  // ACPI header (36) + reserved (12).
constexpr char kSyslinuxMarker[] = "# hvtrace-agent boot-buffer added to the APPEND lines: ";
constexpr char kGrubDropIn[] = "etc/default/grub.d/hvtrace.cfg";

uint32_t Le32(std::span<const std::byte> b, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | std::to_integer<uint32_t>(b[at + i]);
  return v;
}

std::string Hex(uint64_t v) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(v));
  return text;
}

// As the host writes sizes on the kernel command line (hostd KernelSize).
std::string KernelSize(uint64_t bytes) {
  if (bytes != 0 && bytes % (1ull << 20) == 0) return std::to_string(bytes >> 20) + "M";
  if (bytes != 0 && bytes % 1024 == 0) return std::to_string(bytes / 1024) + "K";
  return std::to_string(bytes);
}

}  // namespace

Result<std::string> ReadSmallFile(const fs::path& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error{"cannot read " + path.string() + ": " + std::strerror(errno)};
  std::string data(limit + 1, '\0');
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  data.resize(static_cast<size_t>(in.gcount()));
  if (data.size() > limit) return Error{path.string() + " is larger than " + std::to_string(limit)};
  return data;
}

namespace {

bool IsAppendLine(std::string_view line) {
  const size_t b = line.find_first_not_of(" \t");
  if (b == std::string_view::npos || line.size() - b < 6) return false;
  std::string word(line.substr(b, 6));
  for (char& c : word) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return word == "APPEND" && (line.size() == b + 6 || line[b + 6] == ' ' || line[b + 6] == '\t');
}

std::vector<std::string> SplitLines(std::string_view text) {
  std::vector<std::string> lines;
  std::istringstream in{std::string(text)};
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string JoinLines(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

}  // namespace

Result<std::vector<SratMemory>> ParseSrat(std::span<const std::byte> table) {
  if (table.size() < kSratHeaderBytes) {
    return Error{"SRAT of " + std::to_string(table.size()) + " bytes is shorter than its header"};
  }
  if (std::memcmp(table.data(), "SRAT", 4) != 0) return Error{"table is not an SRAT"};
  const uint32_t length = Le32(table, 4);
  if (length < kSratHeaderBytes || length > table.size()) {
    return Error{"SRAT says " + std::to_string(length) + " bytes but " +
                 std::to_string(table.size()) + " were read (truncated)"};
  }
  std::vector<SratMemory> out;
  for (size_t at = kSratHeaderBytes; at < length;) {
    if (length - at < 2) return Error{"SRAT structure at offset " + std::to_string(at) + " is cut"};
    const auto type = std::to_integer<uint8_t>(table[at]);
    const auto size = std::to_integer<uint8_t>(table[at + 1]);
    if (size < 2 || size > length - at) {
      return Error{"SRAT structure at offset " + std::to_string(at) + " has length " +
                   std::to_string(size) + " (table ends at " + std::to_string(length) + ")"};
    }
    if (type == 1) {  // Memory Affinity.
      if (size < 40) {
        return Error{"SRAT memory affinity at offset " + std::to_string(at) + " is " +
                     std::to_string(size) + " bytes, not 40"};
      }
      const uint32_t flags = Le32(table, at + 28);
      SratMemory m;
      m.proximity = Le32(table, at + 2);
      m.base = (uint64_t{Le32(table, at + 12)} << 32) | Le32(table, at + 8);
      m.length = (uint64_t{Le32(table, at + 20)} << 32) | Le32(table, at + 16);
      m.hotpluggable = (flags & 2) != 0;
      if ((flags & 1) != 0 && m.length != 0) out.push_back(m);
    }
    at += size;
  }
  return out;
}

Result<NodeRange> NodeRangeFromSrat(std::span<const std::byte> table, uint32_t node) {
  Result<std::vector<SratMemory>> entries = ParseSrat(table);
  if (!entries.ok()) return entries.error();
  std::vector<SratMemory> mine;
  for (const SratMemory& m : *entries) {
    if (m.proximity == node && !m.hotpluggable) mine.push_back(m);
  }
  if (mine.empty()) return Error{"the SRAT has no memory for node " + std::to_string(node)};
  std::sort(mine.begin(), mine.end(),
            [](const SratMemory& a, const SratMemory& b) { return a.base < b.base; });
  NodeRange r{mine[0].base, 0, "ACPI SRAT"};
  for (const SratMemory& m : mine) {
    if (m.base != r.start + r.bytes || m.length > UINT64_MAX - m.base) {
      return Error{"node " + std::to_string(node) + "'s memory in the SRAT is not one range (" +
                   Hex(m.base) + " after " + Hex(r.start + r.bytes) + ")"};
    }
    r.bytes += m.length;
  }
  return r;
}

Result<NodeRange> NodeRangeFromSysfs(const fs::path& sys, uint32_t node) {
  Result<std::string> block_text =
      ReadSmallFile(sys / "devices/system/memory/block_size_bytes", 64);
  if (!block_text.ok()) return block_text.error();
  const uint64_t block = std::strtoull(block_text->c_str(), nullptr, 16);
  if (block == 0 || block % kPage != 0) {
    return Error{"memory block size '" + *block_text + "' is not a page multiple"};
  }
  const fs::path dir = sys / "devices/system/node" / ("node" + std::to_string(node));
  uint64_t first = UINT64_MAX, last = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("memory", 0) != 0 || name.size() == 6 ||
        name.find_first_not_of("0123456789", 6) != std::string::npos || name.size() > 16) {
      continue;
    }
    const uint64_t index = std::stoull(name.substr(6));
    first = std::min(first, index);
    last = std::max(last, index);
  }
  if (ec) return Error{"cannot list " + dir.string() + ": " + ec.message()};
  if (first == UINT64_MAX) return Error{dir.string() + " has no memory blocks"};
  if (last >= UINT64_MAX / block - 1) return Error{"memory block index out of range"};
  NodeRange r{first * block, (last + 1 - first) * block, "sysfs memory blocks"};
  // A block is 128 MiB on x86 and node 1 is often smaller: the firmware's
  // RAM map (/sys/firmware/memmap, before memmap= changed it) ends it.
  for (const auto& entry : fs::directory_iterator(sys / "firmware/memmap", ec)) {
    Result<std::string> type = ReadSmallFile(entry.path() / "type", 64);
    Result<std::string> start = ReadSmallFile(entry.path() / "start", 64);
    Result<std::string> end = ReadSmallFile(entry.path() / "end", 64);
    if (!type.ok() || !start.ok() || !end.ok() || type->rfind("System RAM", 0) != 0) continue;
    const uint64_t s = std::strtoull(start->c_str(), nullptr, 16);
    const uint64_t e = std::strtoull(end->c_str(), nullptr, 16);  // Inclusive.
    if (s <= r.start && e >= r.start && e < r.start + r.bytes - 1) {
      r.bytes = e + 1 - r.start;
      r.source = "sysfs memory blocks and the firmware memory map";
    }
  }
  return r;
}

Result<BootBufferParams> BootBufferKernelParams(const NodeRange& node, std::string_view instance,
                                                std::string_view events) {
  if (node.bytes <= kHeadroom) {
    return Error{"node 1 (" + Hex(node.start) + ", " + std::to_string(node.bytes) +
                 " bytes) cannot hold a range and the 48 MiB headroom after it"};
  }
  BootBufferParams p;
  p.gpa = node.start;
  p.bytes = (node.bytes - kHeadroom) / kPage * kPage;
  const std::string where = Hex(p.gpa), size = KernelSize(p.bytes);
  p.kernel_params = "memmap=" + size + "$" + where + " trace_instance=" + std::string(instance) +
                    "@" + where + ":" + size + (events.empty() ? "" : "," + std::string(events));
  p.loader_params = p.kernel_params + " " + kHandshakeKprobeParam + " " + kKeepLocalTraceClock;
  return p;
}

std::string SyslinuxEnable(std::string_view config, std::string_view params) {
  Result<std::string> clean = SyslinuxDisable(config);
  std::vector<std::string> lines = SplitLines(clean.ok() ? *clean : std::string(config));
  for (std::string& line : lines) {
    if (IsAppendLine(line)) line += " " + std::string(params);
  }
  return std::string(kSyslinuxMarker) + std::string(params) + "\n" + JoinLines(lines);
}

Result<std::string> SyslinuxDisable(std::string_view config) {
  std::vector<std::string> lines = SplitLines(config);
  auto marker = std::find_if(lines.begin(), lines.end(),
                             [](const std::string& l) { return l.rfind(kSyslinuxMarker, 0) == 0; });
  if (marker == lines.end()) return Error{"no boot-buffer parameters (no hvtrace-agent marker)"};
  const std::string added = " " + marker->substr(std::strlen(kSyslinuxMarker));
  lines.erase(marker);
  for (std::string& line : lines) {
    if (!IsAppendLine(line)) continue;
    const size_t at = line.rfind(added);
    if (at != std::string::npos) line.erase(at, added.size());
  }
  return JoinLines(lines);
}

std::string GrubDropIn(std::string_view params) {
  // Inside the shell's double quotes: \\ → \ and \$ → $, so grub.cfg gets
  // \$, which GRUB passes to Linux as $.
  std::string escaped;
  for (char c : params) {
    if (c == '$') {
      escaped += "\\\\\\$";
    } else if (c == '"' || c == '\\' || c == '`' || c == ';' || c == '<' || c == '>' || c == '|' ||
               c == '&') {
      escaped += '\\';
      escaped += c;
    } else {
      escaped += c;
    }
  }
  return "# Written by `hvtrace-agent boot-buffer enable`; `hvtrace-agent boot-buffer disable`\n"
         "# removes this file. The host-backed boot trace range (NUMA node 1).\n"
         "GRUB_CMDLINE_LINUX_DEFAULT=\"$GRUB_CMDLINE_LINUX_DEFAULT " +
         escaped + "\"\n";
}

}  // namespace hvtrace::agent
