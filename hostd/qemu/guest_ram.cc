#include "guest_ram.h"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <string>

#include "units.h"

namespace hvtrace::hostd {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

bool ParseHex(std::string_view s, uint64_t& out) {
  if (s.starts_with("0x")) s.remove_prefix(2);
  if (s.empty()) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out, 16);
  return ec == std::errc() && end == s.data() + s.size();
}

// One line of a flat view: "START-LAST (prio P, TYPE): NAME[ @OFFSET]…",
// START and LAST inclusive, in hex. False for any other line.
bool ParseFlatRange(std::string_view line, GuestRamRange& range, std::string_view& type) {
  const size_t dash = line.find('-');
  const size_t open = line.find(" (prio ");
  const size_t comma = line.find(", ", open == std::string_view::npos ? 0 : open);
  const size_t close = line.find("):", comma == std::string_view::npos ? 0 : comma);
  if (dash == std::string_view::npos || open == std::string_view::npos ||
      comma == std::string_view::npos || close == std::string_view::npos || dash > open) {
    return false;
  }
  uint64_t first = 0, last = 0;
  if (!ParseHex(line.substr(0, dash), first) ||
      !ParseHex(line.substr(dash + 1, open - dash - 1), last) || last < first) {
    return false;
  }
  range.gpa = first;
  range.bytes = last - first + 1;
  type = line.substr(comma + 2, close - comma - 2);
  return true;
}

}  // namespace

Result<std::vector<GuestRamRange>> ParseRamFlatView(std::string_view text, uint64_t min_bytes) {
  // The view opens with "FlatView #N", then one ` AS "name", root: …` line per
  // address space that shares it; the guest's RAM is the "memory" one's.
  std::vector<GuestRamRange> out;
  bool in_memory_view = false, found_view = false;
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    const std::string_view line = Trim(text.substr(0, eol));
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    if (line.starts_with("FlatView #")) {
      if (found_view) break;
      in_memory_view = false;
      continue;
    }
    if (line.starts_with("AS \"memory\",")) {
      in_memory_view = found_view = true;
      continue;
    }
    if (!in_memory_view) continue;
    GuestRamRange range;
    std::string_view type;
    // "ram" only: not "rom", "romd", "i/o", nor a "nv-ram".
    if (ParseFlatRange(line, range, type) && type == "ram" && range.bytes >= min_bytes) {
      out.push_back(range);
    }
  }
  if (!found_view) return Error{"`info mtree -f` shows no flat view of the \"memory\" space"};
  if (out.empty()) return Error{"`info mtree -f` shows no RAM range of at least 1 MiB"};
  std::sort(out.begin(), out.end(),
            [](const GuestRamRange& a, const GuestRamRange& b) { return a.gpa < b.gpa; });
  return out;
}

Result<uint64_t> ParseGpa2Hva(std::string_view text) {
  const std::string_view t = Trim(text.substr(0, text.find('\n')));
  const size_t is = t.rfind(" is ");
  uint64_t hva = 0;
  if (!t.starts_with("Host virtual address for ") || is == std::string_view::npos ||
      !ParseHex(t.substr(is + 4), hva) || hva == 0) {
    return Error{"gpa2hva answered \"" + std::string(t.substr(0, 160)) + "\""};
  }
  return hva;
}

GuestRam::GuestRam(pid_t pid, std::vector<GuestRamRange> ranges)
    : pid_(pid), ranges_(std::move(ranges)) {}

const GuestRamRange* GuestRam::Find(uint64_t gpa, uint64_t bytes) const {
  for (const GuestRamRange& r : ranges_) {
    if (gpa >= r.gpa && gpa - r.gpa <= r.bytes && bytes <= r.bytes - (gpa - r.gpa)) return &r;
  }
  return nullptr;
}

Status GuestRam::Read(uint64_t gpa, std::span<std::byte> out) const {
  const GuestRamRange* r = Find(gpa, out.size());
  if (r == nullptr) {
    return Error{"guest-physical " + HexText(gpa) + " + " + std::to_string(out.size()) +
                 " bytes is in no RAM range of QEMU pid " + std::to_string(pid_)};
  }
  const iovec local{out.data(), out.size()};
  const iovec remote{reinterpret_cast<void*>(r->hva + (gpa - r->gpa)), out.size()};
  const ssize_t n = ::process_vm_readv(pid_, &local, 1, &remote, 1, 0);
  if (n != static_cast<ssize_t>(out.size())) {
    return Error{"reading guest-physical " + HexText(gpa) + " (" + std::to_string(out.size()) +
                 " bytes) from QEMU pid " + std::to_string(pid_) + ": " +
                 (n < 0 ? std::strerror(errno) : "short read")};
  }
  return {};
}

size_t GuestRam::ReadEach(std::span<const uint64_t> gpas, size_t each,
                          std::span<std::byte> out) const {
  if (each == 0 || out.size() < each * gpas.size()) return 0;
  // One iovec pair per read, IOV_MAX of them per call; the kernel stops at
  // the first remote span it cannot read, so a short count ends the batch.
  constexpr size_t kBatch = IOV_MAX;
  std::vector<iovec> local, remote;
  local.reserve(std::min(gpas.size(), kBatch));
  remote.reserve(std::min(gpas.size(), kBatch));
  size_t done = 0;
  while (done < gpas.size()) {
    local.clear();
    remote.clear();
    for (size_t i = done; i < gpas.size() && local.size() < kBatch; ++i) {
      const GuestRamRange* r = Find(gpas[i], each);
      if (r == nullptr) break;
      local.push_back({out.data() + i * each, each});
      remote.push_back({reinterpret_cast<void*>(r->hva + (gpas[i] - r->gpa)), each});
    }
    if (local.empty()) break;
    const ssize_t n =
        ::process_vm_readv(pid_, local.data(), local.size(), remote.data(), remote.size(), 0);
    if (n < 0) break;
    const size_t whole = static_cast<size_t>(n) / each;
    done += whole;
    if (whole < local.size()) break;
  }
  return done;
}

}  // namespace hvtrace::hostd
