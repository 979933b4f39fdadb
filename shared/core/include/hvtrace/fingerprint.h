// Event fingerprints: a stable 64-bit identity of an event's layout.
//
// Event ids are handed out at boot (module load order, kernel build), so the
// same id can mean different events in two boots. A fingerprint names the
// layout instead: two formats have the same fingerprint only if system, name
// and every field's name, type, offset, size and signedness agree, in order.
// The print format is deliberately left out: it changes how an event is shown,
// not how its bytes are laid out.
//
// Canonical byte string (version 1), hashed with 64-bit FNV-1a
// (offset basis 0xcbf29ce484222325, prime 0x100000001b3):
//
//   "hvtrace-event-fp-v1" 0x00
//   system 0x00
//   name 0x00
//   u32le field_count
//   per field, in format order (common fields included):
//     name 0x00  type 0x00  u32le offset  u32le size  u8 signed (0 or 1)
//
// |type| is FieldFormat::type: the declaration without the field name, blanks
// collapsed to single spaces, array brackets kept ("char[16]",
// "__data_loc char[]", "unsigned long"). Names cannot contain NUL (the parser
// rejects it), so the string is unambiguous. Changing any of this changes
// every fingerprint: bump the version prefix if you must.
#ifndef HVTRACE_FINGERPRINT_H_
#define HVTRACE_FINGERPRINT_H_

#include <cstdint>
#include <string>

#include "hvtrace/format.h"

namespace hvtrace {

// The canonical byte string above (exposed for tests and tooling).
std::string FingerprintBytes(const EventFormat& format);

// FNV-1a 64 of FingerprintBytes(format).
uint64_t EventFingerprint(const EventFormat& format);

}  // namespace hvtrace

#endif  // HVTRACE_FINGERPRINT_H_
