// FormatsService: hvtraced's access to the kernel formats cache
// (formats_cache.h), shared by every VM.
//
// A capture decodes with formats loaded once per kernel and kept in memory:
// a distribution kernel's ~1500 formats and its kallsyms are ~20 MB and take
// a few hundred milliseconds to load and parse, which a panic capture must
// not wait for. Backends warm the entry up when they start (Prepare).
//
// When a VM boots with a kernel the cache lacks, Prepare harvests its formats
// in the background (formats_harvest.h: a throwaway TCG guest, 10-60 s) so the
// first panic already decodes. Harvests run on |pool| one at a time (a
// queue); hvtraced gives the service its own thread, so a harvest never holds
// one a capture needs. A kernel is harvested at most once per daemon run, and a failed
// harvest is reported (StateOf, the capture manifest) and not retried.
//
// A harvest trusts what the booted guest reports, and its entry serves every
// VM with that kernel: so it boots the kernel only with the project's own
// initramfs (|harvest_initrd|), never with the initrd of the VM that asked,
// which a user or a guest image may have crafted to report false formats.
#ifndef HVTRACE_HOSTD_FORMATS_SERVICE_H_
#define HVTRACE_HOSTD_FORMATS_SERVICE_H_

#include <array>
#include <boost/asio/any_io_executor.hpp>
#include <chrono>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "daemon_log.h"
#include "formats_cache.h"
#include "formats_harvest.h"
#include "hvtrace/result.h"

namespace hvtrace::hostd {

class FormatsService : public std::enable_shared_from_this<FormatsService> {
 public:
  using LogFn = std::function<void(LogLevel, const std::string&)>;

  // |root| is the cache root (ResolveCacheRoot); empty when none could be
  // resolved, then every kernel is "missing" and nothing is harvested.
  // |harvest_initrd| is the initramfs harvests boot (ResolveHarvestInitrd);
  // empty: nothing is harvested.
  FormatsService(std::filesystem::path root, boost::asio::any_io_executor pool, LogFn log,
                 std::filesystem::path harvest_initrd = {});

  const std::filesystem::path& root() const { return root_; }
  const std::filesystem::path& harvest_initrd() const { return harvest_initrd_; }

  // |key|'s formats, from memory or loaded from the cache. Null when the
  // cache has no entry; an error when the entry is unreadable. Thread-safe.
  Result<std::shared_ptr<const KernelFormats>> Get(const std::string& key);

  // Loads |key| in the background; when it is not cached and |kernel| is
  // known, harvests it with the harvest initramfs (queued, one at a time).
  void Prepare(const std::string& key, const std::string& kernel);

  // A harvest a client asked for (`hvtrace formats harvest` through the
  // daemon's `formats-harvest`): |kernel| is the daemon's private copy of
  // the client's file (hashed to |key| by the caller), |label| what the
  // entry's manifest records as the kernel's path (the client's). Queued
  // behind any other harvest, with the harvest initramfs as always; unlike
  // Prepare, a kernel whose earlier harvest failed is tried again. |progress|
  // gets the harvest's step lines; |done| runs on the pool with the entry
  // (a cache hit included) or the reason.
  struct HarvestRequest {
    std::string key;
    std::string kernel;
    std::string label;
    std::chrono::milliseconds boot_timeout{std::chrono::seconds(180)};
    std::function<void(std::string_view)> progress;
    std::function<void(Result<HarvestResult>)> done;
  };
  void Harvest(HarvestRequest request);

  // For manifests: "loaded", "cached", "harvesting", "queued", "missing" or
  // "harvest failed: <why>".
  std::string StateOf(const std::string& key);

  // The harvests queued, running or failed in this daemon run: key → state.
  std::map<std::string, std::string> HarvestStates();

  // The cache's entries (FormatCache::List, with its |problems|), listed
  // again only when the formats directory changed since the last call
  // (entries are published and removed by renames in it): a panic's
  // decode looks up its kernel's banner here instead of reading every
  // entry's manifest twice.
  Result<std::vector<CacheEntrySummary>> Entries(std::vector<std::string>* problems);

 private:
  // A background harvest (Prepare) has no |done|.
  struct HarvestJob {
    std::string key, kernel, label;
    std::chrono::milliseconds boot_timeout{std::chrono::seconds(180)};
    std::function<void(std::string_view)> progress;
    std::function<void(Result<HarvestResult>)> done;
  };
  // Queues |job| and starts the queue when it is idle; the caller holds mu_.
  void EnqueueLocked(HarvestJob job);
  // Runs one harvest with the harvest initramfs (checked first).
  Result<HarvestResult> RunHarvest(const HarvestJob& job);
  void RunNextHarvest();

  const std::filesystem::path root_;
  boost::asio::any_io_executor pool_;
  LogFn log_;
  const std::filesystem::path harvest_initrd_;

  std::mutex load_mu_;  // Serializes loads from disk (one copy per kernel).
  std::mutex mu_;       // Guards the fields below.
  std::map<std::string, std::shared_ptr<const KernelFormats>> loaded_;
  std::map<std::string, std::string> harvest_state_;  // key → queued/harvesting/failed: …
  std::deque<HarvestJob> harvest_queue_;
  bool harvest_running_ = false;
  // Entries(): the last listing and the formats directory's change time,
  // inode and mtime when it was taken.
  struct Listing {
    std::array<int64_t, 5> stamp{};
    std::vector<CacheEntrySummary> entries;
    std::vector<std::string> problems;
  };
  std::optional<Listing> listing_;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_FORMATS_SERVICE_H_
