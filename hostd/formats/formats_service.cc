#include "formats_service.h"

#include <sys/stat.h>

#include <boost/asio/post.hpp>
#include <chrono>
#include <optional>
#include <utility>

#include "format_trials.h"
#include "formats_harvest.h"
#include "parsed_formats.h"
#include "private_path.h"

namespace hvtrace::hostd {

FormatsService::FormatsService(std::filesystem::path root, boost::asio::any_io_executor pool,
                               LogFn log, std::filesystem::path harvest_initrd)
    : root_(std::move(root)),
      pool_(std::move(pool)),
      log_(std::move(log)),
      harvest_initrd_(std::move(harvest_initrd)) {}

Result<std::shared_ptr<const KernelFormats>> FormatsService::Get(const std::string& key) {
  if (!IsValidKernelKey(key)) {
    return Error{"kernel formats key '" + key.substr(0, 80) + "' is not 64 lowercase hex digits"};
  }
  {
    std::lock_guard lock(mu_);
    if (auto it = loaded_.find(key); it != loaded_.end()) return it->second;
  }
  if (root_.empty()) return std::shared_ptr<const KernelFormats>();
  std::lock_guard load(load_mu_);
  {
    // Another thread may have loaded it while this one waited.
    std::lock_guard lock(mu_);
    if (auto it = loaded_.find(key); it != loaded_.end()) return it->second;
  }
  FormatCache cache(root_);
  Result<std::optional<nlohmann::json>> found = cache.Lookup(key);
  if (!found.ok()) return found.error();
  if (!found->has_value()) return std::shared_ptr<const KernelFormats>();
  Result<KernelFormats> formats = cache.Load(key);
  if (!formats.ok()) return formats.error();
  const FormatTrials trials = RunFormatTrials(&*formats);
  // Every format parsed now, so that a panic's steps parse none (9 ms and
  // ~2 MB of heap for a 6.12 kernel's 1,501 formats, measured 2026-12-05).
  const auto parse_start = std::chrono::steady_clock::now();
  const size_t parsed = ParseAllFormats(*formats);
  const double parse_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - parse_start)
          .count();
  log_(LogLevel::kInfo, "formats " + key + " (" + formats->release +
                            "): libtraceevent's trial parse in one child took " +
                            std::to_string(static_cast<int>(trials.ms)) +
                            " ms: " + std::to_string(trials.passed) + " passed, " +
                            std::to_string(trials.not_passed) +
                            " not (their events are printed after a trial of their own); " +
                            std::to_string(parsed) + " parsed for the capture steps in " +
                            std::to_string(static_cast<int>(parse_ms)) + " ms");
  auto shared = std::make_shared<const KernelFormats>(std::move(*formats));
  std::lock_guard lock(mu_);
  loaded_[key] = shared;
  return shared;
}

Result<std::vector<CacheEntrySummary>> FormatsService::Entries(std::vector<std::string>* problems) {
  FormatCache cache(root_);
  // Stat before listing: a change while the list is taken leaves the old
  // stamp, so the next call lists again.
  struct stat st {};
  std::optional<std::array<int64_t, 5>> stamp;
  if (::stat(cache.formats_dir().c_str(), &st) == 0) {
    stamp = {static_cast<int64_t>(st.st_ino), st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
             st.st_ctim.tv_sec, st.st_ctim.tv_nsec};
  }
  {
    std::lock_guard lock(mu_);
    if (stamp && listing_ && listing_->stamp == *stamp) {
      if (problems != nullptr)
        problems->insert(problems->end(), listing_->problems.begin(), listing_->problems.end());
      return listing_->entries;
    }
  }
  std::vector<std::string> found_problems;
  Result<std::vector<CacheEntrySummary>> list = cache.List(&found_problems);
  if (problems != nullptr) {
    problems->insert(problems->end(), found_problems.begin(), found_problems.end());
  }
  if (!list.ok()) return list.error();
  std::lock_guard lock(mu_);
  if (stamp) {
    listing_ = Listing{*stamp, *list, std::move(found_problems)};
  } else {
    listing_.reset();
  }
  return list;
}

void FormatsService::Prepare(const std::string& key, const std::string& kernel) {
  if (root_.empty() || !IsValidKernelKey(key)) return;
  boost::asio::post(pool_, [self = shared_from_this(), key, kernel] {
    // The listing a panic's decode finds each boot's kernel in, taken now
    // rather than at the panic (Entries).
    (void)self->Entries(nullptr);
    Result<std::shared_ptr<const KernelFormats>> got = self->Get(key);
    if (!got.ok()) {
      self->log_(LogLevel::kWarning, "formats " + key + ": " + got.error().message);
      return;
    }
    if (*got != nullptr) return;
    if (kernel.empty() || self->harvest_initrd_.empty()) {
      // The command named fills this daemon's cache: the CLI asks the daemon
      // that answers on its socket, which harvests into |root_|.
      self->log_(
          LogLevel::kWarning,
          "formats " + key + " are not in " + self->root_.string() + " and " +
              (kernel.empty() ? std::string("the VM's kernel is unknown")
                              : std::string("no harvest_initrd is configured")) +
              ": captures keep region.bin only; " +
              (self->harvest_initrd_.empty() ? "set harvest_initrd in hvtraced.conf, then " : "") +
              "run `hvtrace formats harvest --kernel " +
              (kernel.empty() ? std::string("K") : kernel) +
              "` (hvtraced harvests it into this cache)");
      return;
    }
    std::lock_guard lock(self->mu_);
    if (self->harvest_state_.contains(key)) return;  // Queued, running, or failed before.
    HarvestJob job;
    job.key = key;
    job.kernel = kernel;
    job.label = kernel;
    self->EnqueueLocked(std::move(job));
  });
}

void FormatsService::Harvest(HarvestRequest request) {
  std::string missing;
  if (root_.empty()) missing = "hvtraced has no formats cache directory (cache_dir)";
  if (missing.empty() && harvest_initrd_.empty()) {
    missing =
        "hvtraced has no harvest initramfs: set harvest_initrd in hvtraced.conf (the package "
        "installs " +
        std::string(kPackagedHarvestInitrd) + ")";
  }
  if (missing.empty() && !IsValidKernelKey(request.key)) missing = "bad kernel key";
  if (!missing.empty()) {
    request.done(Error{"harvest of " + request.label + ": " + missing});
    return;
  }
  std::lock_guard lock(mu_);
  EnqueueLocked(HarvestJob{std::move(request.key), std::move(request.kernel),
                           std::move(request.label), request.boot_timeout,
                           std::move(request.progress), std::move(request.done)});
}

void FormatsService::EnqueueLocked(HarvestJob job) {
  // A state a running harvest of the same key set stays until that one ends.
  if (auto it = harvest_state_.find(job.key);
      it == harvest_state_.end() || it->second.starts_with("harvest failed")) {
    harvest_state_[job.key] = "queued";
  }
  harvest_queue_.push_back(std::move(job));
  if (!harvest_running_) {
    harvest_running_ = true;
    boost::asio::post(pool_, [self = shared_from_this()] { self->RunNextHarvest(); });
  }
}

Result<HarvestResult> FormatsService::RunHarvest(const HarvestJob& job) {
  HarvestOptions options;
  options.kernel = job.kernel;
  options.kernel_label = job.label;
  options.initrd = harvest_initrd_.string();
  options.cache_root = root_;
  options.boot_timeout = job.boot_timeout;
  options.progress = job.progress;
  // The initramfs decides what the harvest reports: only one nobody but
  // root (or this daemon's user) can have changed.
  if (Status trusted = CheckTrustedPath(harvest_initrd_, "harvest initramfs"); !trusted.ok()) {
    return Error{"harvest of " + job.label + ": " + trusted.error().message};
  }
  return HarvestFormats(options);
}

void FormatsService::RunNextHarvest() {
  HarvestJob job;
  {
    std::lock_guard lock(mu_);
    if (harvest_queue_.empty()) {
      harvest_running_ = false;
      return;
    }
    job = std::move(harvest_queue_.front());
    harvest_queue_.pop_front();
    harvest_state_[job.key] = "harvesting";
  }
  log_(LogLevel::kInfo,
       "formats " + job.key + ": " +
           (job.done ? "harvesting them from " + job.label + " as asked"
                     : "not cached; harvesting them from " + job.kernel + " in the background") +
           " with " + harvest_initrd_.string());
  Result<HarvestResult> harvested = RunHarvest(job);
  std::string outcome;
  if (!harvested.ok()) {
    outcome = "harvest failed: " + harvested.error().message;
  } else if (harvested->key != job.key) {
    // The image changed on disk since the VM booted (or since the daemon
    // hashed its copy): its entry is not this kernel's.
    outcome = "harvest failed: " + job.label + " changed since it was hashed (now " +
              harvested->key + ")";
    harvested = Error{outcome};
  }
  {
    std::lock_guard lock(mu_);
    if (outcome.empty()) {
      harvest_state_.erase(job.key);
    } else {
      harvest_state_[job.key] = outcome;
    }
  }
  if (outcome.empty()) {
    if (!harvested->cache_hit) {
      log_(LogLevel::kNotice, "formats " + job.key + ": harvested in " +
                                  std::to_string(harvested->seconds) + " s into " +
                                  harvested->entry_dir.string());
    }
    if (auto loaded = Get(job.key); !loaded.ok()) {
      log_(LogLevel::kWarning, "formats " + job.key + ": " + loaded.error().message);
    }
  } else {
    log_(LogLevel::kWarning, "formats " + job.key + ": " + outcome);
  }
  if (job.done) job.done(std::move(harvested));
  boost::asio::post(pool_, [self = shared_from_this()] { self->RunNextHarvest(); });
}

std::map<std::string, std::string> FormatsService::HarvestStates() {
  std::lock_guard lock(mu_);
  return harvest_state_;
}

std::string FormatsService::StateOf(const std::string& key) {
  {
    std::lock_guard lock(mu_);
    if (loaded_.contains(key)) return "loaded";
    if (auto it = harvest_state_.find(key); it != harvest_state_.end()) return it->second;
  }
  if (root_.empty() || !IsValidKernelKey(key)) return "missing";
  Result<std::optional<nlohmann::json>> found = FormatCache(root_).Lookup(key);
  if (!found.ok()) return "unreadable: " + found.error().message;
  return found->has_value() ? "cached" : "missing";
}

}  // namespace hvtrace::hostd
