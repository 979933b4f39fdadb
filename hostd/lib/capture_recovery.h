// Finishing captures a daemon died in the middle of.
//
// A boot-range capture is durable once its region.bin and recovery record
// are (capture_store.h); decoding and the manifest come after. When hvtraced
// dies in between (a crash, kill -9, OOM), the next run finds the hidden
// capture directory at start-up and finishes it: decodes region.bin with the
// kernel's cached formats (or counts it when they are missing), writes the
// manifest with `recovered` {at, note} and commits it under its original
// trigger and time. A directory without a record held no durable copy and is
// removed. Nothing here trusts the files: the record is parsed and checked,
// region.bin must be a regular file of the size the record's region names,
// and the decode treats it as hostile input like any region copy.
#ifndef HVTRACE_HOSTD_CAPTURE_RECOVERY_H_
#define HVTRACE_HOSTD_CAPTURE_RECOVERY_H_

#include <functional>
#include <string>
#include <vector>

#include "capture_store.h"
#include "formats_service.h"
#include "hvtrace/result.h"

namespace hvtrace::hostd {

struct RecoveryReport {
  std::vector<CaptureEntry> recovered;  // Committed now.
  std::vector<std::string> removed;     // Why each other directory went.
};

// Recovers or removes every incomplete capture of |store|. |formats| may be
// null (counts only). Fails only when the captures directory cannot be
// listed; a capture that cannot be finished is removed and says why.
Result<RecoveryReport> RecoverIncompleteCaptures(const CaptureStore& store, FormatsService* formats);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CAPTURE_RECOVERY_H_
