// What changed between two boot bundles a VM's agent sent for the same boot
// (the agent sends a new one when the set of trace events changes: a module
// with events loaded or unloaded, meta_sender.h). Both are lists of
// "<system>/<event> <id> <fingerprint>" lines (the bundle's fingerprints
// member, already checked against its formats by ValidateMetaBoot).
//
// The boot's newest bundle decodes all of the boot's events. That is right
// for every event the boot range can hold: events of a module that was
// unloaded are gone from every buffer (the kernel resets them all when a
// module that registered events goes, because its ids may be given to
// another's), and ids of events that stayed never move within a boot. The
// diff is kept for the manifest, so a reader sees which events came later.
#ifndef HVTRACE_HOSTD_META_BUNDLE_DIFF_H_
#define HVTRACE_HOSTD_META_BUNDLE_DIFF_H_

#include <nlohmann/json.hpp>
#include <string_view>

namespace hvtrace::hostd {

// {"added": [names], "removed": [names], "moved": [{"event", "from", "to"}],
//  "changed": [{"event", "id"}], "kept": n}; each list holds at most
// |max_listed| entries, and "<key>_count" gives the full count. Malformed
// lines are skipped (the bundle was checked before it was stored).
nlohmann::json DiffBundleFingerprints(std::string_view before, std::string_view after,
                                      size_t max_listed = 64);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_META_BUNDLE_DIFF_H_
