// Fingerprints over the canonical byte string of hvtrace/fingerprint.h.
#include "hvtrace/fingerprint.h"

namespace hvtrace {
namespace {

constexpr char kPrefix[] = "hvtrace-event-fp-v1";

void PutString(std::string* out, const std::string& s) {
  out->append(s);
  out->push_back('\0');
}

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

std::string FingerprintBytes(const EventFormat& format) {
  std::string out;
  out.reserve(64 + format.fields.size() * 48);
  out.append(kPrefix, sizeof(kPrefix));  // Includes the terminating NUL.
  PutString(&out, format.system);
  PutString(&out, format.name);
  PutU32(&out, static_cast<uint32_t>(format.fields.size()));
  for (const FieldFormat& f : format.fields) {
    PutString(&out, f.name);
    PutString(&out, f.type);
    PutU32(&out, f.offset);
    PutU32(&out, f.size);
    out.push_back(f.is_signed ? '\1' : '\0');
  }
  return out;
}

uint64_t EventFingerprint(const EventFormat& format) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : FingerprintBytes(format)) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

}  // namespace hvtrace
