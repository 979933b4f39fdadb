// What `formats-list` and `formats-harvest` answer, from hvtraced's cache or
// from a cache of the CLI's own (`hvtrace formats … --cache DIR`): one JSON
// mapping each (json_message.h), the same text and --json either way.
#ifndef HVTRACE_HOSTD_FORMATS_FORMATS_REPLIES_H_
#define HVTRACE_HOSTD_FORMATS_FORMATS_REPLIES_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats_cache.h"
#include "formats_harvest.h"
#include "json_message.h"

namespace hvtrace::hostd {

// formats-list: one kernel in the cache.
struct FormatsKernelRow : ReplyMessage {
  std::string key;
  std::string release;
  std::string kernel;
  uint64_t events = 0;
  std::string harvested_utc;
  std::string state;  // FormatsService::StateOf: loaded, cached, …
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("key", r.key);
    m.Field("release", r.release);
    m.Field("kernel", r.kernel);
    m.Field("events", r.events);
    m.Field("harvested_utc", r.harvested_utc);
    m.Field("state", r.state);
  }
};

// formats-list: a harvest that has no cache entry (yet).
struct FormatsHarvestRow : ReplyMessage {
  std::string key;
  std::string state;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("key", r.key);
    m.Field("state", r.state);
  }
};

struct FormatsListReply : ReplyMessage {
  static constexpr const char* kCommand = "formats-list";
  std::string cache;  // Empty: the daemon has no cache_dir.
  std::string harvest_initrd;
  std::vector<FormatsKernelRow> kernels;
  std::vector<FormatsHarvestRow> harvests;
  std::vector<std::string> problems;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("cache", r.cache);
    m.Field("harvest_initrd", r.harvest_initrd);
    m.Field("kernels", r.kernels);
    m.Field("harvests", r.harvests);
    m.List("problems", r.problems);
  }
};

// formats-harvest: stream items are ProgressItem, the final line this.
struct FormatsHarvestReply : ReplyMessage {
  static constexpr const char* kCommand = "formats-harvest";
  std::string key;
  std::string path;  // The cache entry.
  bool cache_hit = false;
  double seconds = 0;
  nlohmann::json manifest;  // The entry's manifest (formats/formats_manifest).
  std::string cache;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("key", r.key);
    m.Field("path", r.path);
    m.Field("cache_hit", r.cache_hit);
    m.Field("seconds", r.seconds);
    m.Field("manifest", r.manifest);
    m.Field("cache", r.cache);
  }
};

struct ProgressItem : ReplyMessage {
  static constexpr const char* kCommand = "formats-harvest";
  std::string progress;
  template <class Self, class Map>
  static void Fields(Self& r, Map& m) {
    m.Field("progress", r.progress);
  }
};

// A cache entry as a row; |state| is the daemon's (FormatsService::StateOf).
inline FormatsKernelRow KernelRowOf(const CacheEntrySummary& e, std::string state = "") {
  return FormatsKernelRow{{},       e.key,           e.release,       e.kernel_path,
                          e.events, e.harvested_utc, std::move(state)};
}

// A harvest's result as the reply; |cache| is where the entry lives.
inline FormatsHarvestReply HarvestReplyOf(const HarvestResult& r, std::string cache = "") {
  return FormatsHarvestReply{{},        r.key,      r.entry_dir.string(), r.cache_hit,
                             r.seconds, r.manifest, std::move(cache)};
}

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_FORMATS_FORMATS_REPLIES_H_
