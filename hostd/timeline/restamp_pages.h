// Rewriting a sub-buffer page's time stamps onto another clock: the records
// of a validated page copy, each at its new time, re-encoded with the page
// codec's PageWriter into clean pages. Used for direct-write rings stamped
// with the TSC (region_capture) and for a guest's boot put on the host
// clock (boot_timeline).
#ifndef HVTRACE_HOSTD_CAPTURE_RESTAMP_PAGES_H_
#define HVTRACE_HOSTD_CAPTURE_RESTAMP_PAGES_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "hvtrace/page.h"

namespace hvtrace::hostd {

// Maps a record's time stamp to the new clock; nullopt: it cannot be placed.
using RestampFn = std::function<std::optional<uint64_t>(uint64_t)>;

// |page| with every record's time stamp mapped by |to_time| (which must not
// decrease), as one or more clean pages appended to |out| (a mapped delta
// may need a TIME_EXTEND the original did not, so the records may not fit
// one page), their bytes owned by |storage|. Only the good records are
// copied (the walk stops at a bad one); those |to_time| cannot place are
// counted in |*unplaced|. The page's missed-events mark goes to the first
// page written.
void RestampPage(std::span<const std::byte> page, const PageLayout& layout,
                 const RestampFn& to_time, std::deque<std::vector<std::byte>>* storage,
                 std::vector<std::span<const std::byte>>* out, uint64_t* unplaced);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CAPTURE_RESTAMP_PAGES_H_
