// What the fleet upload reports (`hvtrace ping`, the reply's "upload"):
// one JSON mapping for the daemon that writes it and the CLI that prints it
// (json_message.h). Every field is written, an unset optional left out.
#ifndef HVTRACE_HOSTD_FLEET_UPLOAD_STATS_H_
#define HVTRACE_HOSTD_FLEET_UPLOAD_STATS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "json_message.h"

namespace hvtrace::hostd {

// One queued or recently uploaded capture.
struct UploadCaptureState {
  static constexpr bool kWritesDefaults = true;
  std::string vm;
  std::string id;
  std::string state;  // pending | error | uploaded | lost | given-up
  uint64_t attempts = 0;
  std::string last_error;
  std::optional<uint64_t> objects_done;  // While its objects go up.
  std::optional<uint64_t> objects;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("vm", r.vm);
    m.Field("id", r.id);
    m.Field("state", r.state);
    m.Field("attempts", r.attempts);
    m.Field("last_error", r.last_error);
    m.Field("objects_done", r.objects_done);
    m.Field("objects", r.objects);
  }
};

struct UploadStats {
  static constexpr bool kWritesDefaults = true;
  static constexpr const char* kCommand = "ping";  // Where it is shown.
  bool enabled = false;                            // No store configured: the rest stays empty.
  std::string endpoint;
  std::string bucket;
  std::string prefix;
  std::string host;
  uint64_t pending = 0;
  uint64_t uploaded = 0;
  uint64_t failed_attempts = 0;
  uint64_t lost = 0;
  uint64_t given_up = 0;
  std::string last_error;
  std::string last_error_at;
  std::string last_uploaded;
  std::vector<UploadCaptureState> captures;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("enabled", r.enabled);
    m.Field("endpoint", r.endpoint);
    m.Field("bucket", r.bucket);
    m.Field("prefix", r.prefix);
    m.Field("host", r.host);
    m.Field("pending", r.pending);
    m.Field("uploaded", r.uploaded);
    m.Field("failed_attempts", r.failed_attempts);
    m.Field("lost", r.lost);
    m.Field("given_up", r.given_up);
    m.Field("last_error", r.last_error);
    m.Field("last_error_at", r.last_error_at);
    m.Field("last_uploaded", r.last_uploaded);
    m.Field("captures", r.captures);
  }
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_FLEET_UPLOAD_STATS_H_
