// The event id table across boots: for each event of a boot's formats,
// compared by fingerprint (hvtrace/fingerprint.h) with the boot before it.
//
// Event ids are handed out at boot (link order, module load order), so a
// kexec into another build, or modules loaded in another order, can move an
// event to another id or change its layout. Per boot after the first:
//   kept     same name, same id, same fingerprint (counted only);
//   moved    same fingerprint, another id (listed: from, to);
//   changed  same name, another fingerprint (listed: ids before and after);
//   vanished in the boot before, not in this one (listed);
//   new      in this boot, not in the boot before (listed).
// Events are named "system/name". Formats that do not parse have no
// fingerprint and are counted as "unparsed".
#ifndef HVTRACE_HOSTD_EVENT_ID_TABLE_H_
#define HVTRACE_HOSTD_EVENT_ID_TABLE_H_

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>

#include "formats_cache.h"
#include "hvtrace/region_reader.h"

namespace hvtrace::hostd {

struct EventIdentity {
  uint32_t id = 0;
  uint64_t fingerprint = 0;
};
// "system/name" -> identity, for one boot.
using EventIdentities = std::map<std::string, EventIdentity>;

// The identities of |formats|' parsed events; |unparsed| (may be null)
// counts the others.
EventIdentities IdentitiesOf(const KernelFormats& formats, uint64_t* unparsed = nullptr);

// One boot against the boot before: {"kept": n, "moved": [...], "changed":
// [...], "vanished": [...], "new": [...], "counts": {...}}; lists are capped
// at |max_listed| entries each (counts stay exact).
nlohmann::json CompareEventIds(const EventIdentities& before, const EventIdentities& after,
                               size_t max_listed = 200);

// The table over every boot: {"boots": [{"boot": n, "compared_with": n-1,
// ...CompareEventIds...}]}; boots with the very same formats as the boot
// before say so ("same formats": true) and count everything kept. Null
// entries (no formats) are skipped with a note.
nlohmann::json EventsAcrossBoots(std::span<const KernelFormats* const> per_boot);

// The same over already computed identities (attach-mode generations).
nlohmann::json EventsAcrossBoots(std::span<const EventIdentities> per_boot,
                                 std::span<const uint64_t> boot_numbers);

// Attach mode: the region's format table per boot generation (entries the
// reader checked against their text and fingerprint), compared the same way:
// {"generations": [{"generation": g, "compared_with": g', ...}]}.
nlohmann::json EventsAcrossGenerations(const RegionSnapshot& snapshot);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_EVENT_ID_TABLE_H_
