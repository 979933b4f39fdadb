// What every boot timeline e2e test checks of a capture, whatever kind of VM
// it came from (a VM hvtraced booted with --trace-boot, an adopted libvirt
// domain): `hvtrace show --timeline` parsed, trace-cmd's merge of host.dat
// and boot-0.host-clock.dat, and the assertions both kinds share.
#ifndef HVTRACE_TESTS_E2E_TIMELINE_CHECK_H_
#define HVTRACE_TESTS_E2E_TIMELINE_CHECK_H_

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_support.h"

namespace hvtrace::e2e {

struct TimelineLine {
  std::string side;   // "host" or "guest"
  std::string event;  // "virtio_set_status", "hvt_virtio_status", ...
  std::string text;
};

// The event lines of `hvtrace show --timeline` ('#' lines skipped).
std::vector<TimelineLine> ParseTimeline(const std::string& out);

// trace-cmd's merged report, as the unit tests read it too.
using test_support::TraceCmdOrder;

// The value after |key| in |text| ("val=3" -> "3").
std::string ValueOf(const std::string& text, const std::string& key);

// Runs `hvtrace show DIR --timeline`; its status must be 0 (a gtest failure
// otherwise) and its output is returned.
std::string ShowTimeline(const std::filesystem::path& dir);

// Checks of a capture |dir| with manifest extra.timeline |t| that hold for
// every kind of VM (gtest assertions): the newest boot placed on the host
// clock with at least |min_pairs| pairs and an error bound under 1 ms,
// host.dat and its boot-<n>.host-clock.dat present, every guest status write
// followed by QEMU's handling of that value, and trace-cmd's merge of
// host.dat and every placed boot in the order of |lines|. Prints the fit.
void ExpectPlacedTimeline(const std::filesystem::path& dir, const nlohmann::json& t,
                          const std::vector<TimelineLine>& lines, uint64_t min_pairs);

// The timeline side of boot |boot| in |t|'s capture as `show --timeline`
// names it: "guest" when one boot is placed, else "guest<boot>".
std::string GuestSide(const nlohmann::json& t, uint64_t boot);

// The guest's status writes to virtio device |index| (virtioN) on |side| in
// timeline order: "3", "11", "15", ...
std::vector<std::string> GuestStatusWrites(const std::vector<TimelineLine>& lines, int index,
                                           const std::string& side = "guest");

}  // namespace hvtrace::e2e

#endif  // HVTRACE_TESTS_E2E_TIMELINE_CHECK_H_
