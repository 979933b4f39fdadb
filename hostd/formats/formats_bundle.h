// What a format harvest brings back from the guest, and the strict parsers
// that read it. Everything here is hostile input from a guest we booted but do
// not trust: sizes are capped, tar member names are checked before they become
// paths, and every event format must parse before it is stored.
//
// The guest sends one ustar archive (busybox `tar -c`) with these members:
//
//   formats         `grep -H '' */*/format` run in events/: every line of
//                   every event's format file as "<system>/<event>/format:<line>"
//                   (one process instead of a fork per file: ~2 s, not ~2 min,
//                   under TCG; tracefs files stat as size 0, so tar cannot
//                   read them directly anyway)
//   header_page     events/header_page
//   header_event    events/header_event
//   printk_formats  printk_formats
//   kallsyms        /proc/kallsyms, read with kptr_restrict=0
//   version         /proc/version (the build string)
//   release         uname -r
//   modules         /proc/modules (optional): events of these modules are in
//                   the harvest, events of modules loaded later are not
//
// Sans-I/O: plain functions over bytes, unit-tested with hostile archives.
#ifndef HVTRACE_HOSTD_FORMATS_BUNDLE_H_
#define HVTRACE_HOSTD_FORMATS_BUNDLE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

struct TarMember {
  std::string name;  // Normalised: no leading "./", never absolute, no "..".
  std::string data;
};

struct TarLimits {
  size_t max_members = 64;
  size_t max_member_bytes = 64u << 20;
  size_t max_total_bytes = 128u << 20;  // Sum of member sizes.
};

// Reads a ustar/GNU tar archive of regular files (directories are skipped).
// Rejects, naming the member and its offset: bad header checksums, sizes that
// are not plain octal or exceed |limits|, links, devices, GNU long names and
// pax headers, absolute names, ".." or empty components, names outside
// [A-Za-z0-9._+-/], duplicate names, and an archive that ends before its
// end-of-archive blocks (a truncated transfer).
Result<std::vector<TarMember>> ReadTar(std::span<const std::byte> archive,
                                       const TarLimits& limits = {});

// One event's format file from the harvest.
struct HarvestedEvent {
  std::string system;
  std::string name;
  uint32_t id = 0;   // 0 when the format did not parse.
  std::string text;  // The format file, byte for byte as the guest read it.
  // Why ParseEventFormat refused the text; empty when it parsed. Such
  // formats are still kept (their names are safe and the kernel printed them):
  // every reader parses them again, and a later parser may accept them.
  std::string parse_error;
};

struct HarvestBundle {
  std::string release;       // uname -r
  std::string proc_version;  // /proc/version without the trailing newline
  std::string header_page;
  std::string header_event;
  std::string printk_formats;
  std::string kallsyms;
  std::string modules;                 // /proc/modules; may be empty
  std::vector<HarvestedEvent> events;  // Sorted by system, name.
  size_t unparsed = 0;                 // Events with a parse_error.
  // "<system>/<event>: <why>" for formats that contradict the others: a
  // duplicate id, or a name differing from its directory. Dropped.
  std::vector<std::string> rejected;
  size_t kallsyms_symbols = 0;
  size_t kallsyms_nonzero_addresses = 0;  // 0: kptr_restrict hid them.
};

// Caps for the members of a harvest archive.
inline constexpr size_t kMaxHarvestArchiveBytes = 128u << 20;
inline constexpr size_t kMaxHarvestEvents = 20000;

// Checks and splits a harvest archive. Missing or malformed header_page,
// header_event, release or formats fail the whole harvest; single event
// formats that do not parse are kept with their parse_error.
Result<HarvestBundle> ParseHarvestArchive(std::span<const std::byte> archive);
// The same, also accepting the members named in |extra_allowed| (name → size
// cap), returned in |extras|: the metadata channel's identity.json and
// fingerprints (hvtrace/meta_channel.h) beside the harvest members.
Result<HarvestBundle> ParseHarvestArchive(std::span<const std::byte> archive,
                                          const std::map<std::string, size_t>& extra_allowed,
                                          std::map<std::string, std::string>* extras);

// Splits the "<system>/<event>/format:<line>" listing into per-event texts in
// file order. Fails on a malformed line, an unsafe name, or an event whose
// lines are not contiguous.
Result<std::vector<HarvestedEvent>> SplitFormatListing(std::string_view listing);

// True when |name| can be a path component in the cache: 1..256 printable
// ASCII characters, no '/', '\\' or blanks, not starting with '.'.
bool IsSafeComponent(std::string_view name);

// The address of symbol |name| in /proc/kallsyms text ("addr type name
// [module]" lines), or an error when it is absent or malformed.
Result<uint64_t> FindKallsym(std::string_view kallsyms, std::string_view name);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_FORMATS_BUNDLE_H_
