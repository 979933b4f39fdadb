#include "formats_service.h"

#include <boost/asio/post.hpp>
#include <optional>
#include <utility>

#include "formats_harvest.h"
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
  auto shared = std::make_shared<const KernelFormats>(std::move(*formats));
  std::lock_guard lock(mu_);
  loaded_[key] = shared;
  return shared;
}

void FormatsService::Prepare(const std::string& key, const std::string& kernel) {
  if (root_.empty() || !IsValidKernelKey(key)) return;
  boost::asio::post(pool_, [self = shared_from_this(), key, kernel] {
    Result<std::shared_ptr<const KernelFormats>> got = self->Get(key);
    if (!got.ok()) {
      self->log_(LogLevel::kWarning, "formats " + key + ": " + got.error().message);
      return;
    }
    if (*got != nullptr) return;
    if (kernel.empty() || self->harvest_initrd_.empty()) {
      self->log_(LogLevel::kWarning,
                 "formats " + key + " are not in " + self->root_.string() + " and " +
                     (kernel.empty() ? std::string("the VM's kernel is unknown")
                                     : std::string("no harvest_initrd is configured")) +
                     ": captures keep region.bin only; run `hvtrace formats harvest --kernel " +
                     (kernel.empty() ? std::string("K") : kernel) + " --initrd I`");
      return;
    }
    std::lock_guard lock(self->mu_);
    if (self->harvest_state_.contains(key)) return;  // Queued, running, or failed before.
    self->harvest_state_[key] = "queued";
    self->harvest_queue_.push_back(HarvestJob{key, kernel});
    if (!self->harvest_running_) {
      self->harvest_running_ = true;
      boost::asio::post(self->pool_, [self] { self->RunNextHarvest(); });
    }
  });
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
  log_(LogLevel::kInfo, "formats " + job.key + ": not cached; harvesting them from " + job.kernel +
                            " in the background with " + harvest_initrd_.string());
  HarvestOptions options;
  options.kernel = job.kernel;
  options.initrd = harvest_initrd_.string();
  options.cache_root = root_;
  // The initramfs decides what the harvest reports: only one nobody but
  // root (or this daemon's user) can have changed.
  Result<HarvestResult> harvested = Error{""};
  if (Status trusted = CheckTrustedPath(harvest_initrd_, "harvest initramfs"); !trusted.ok()) {
    harvested = trusted.error();
  } else {
    harvested = HarvestFormats(options);
  }
  std::string outcome;
  if (!harvested.ok()) {
    outcome = "harvest failed: " + harvested.error().message;
  } else if (harvested->key != job.key) {
    // The image changed on disk since the VM booted: its entry is not this VM's.
    outcome = "harvest failed: " + job.kernel + " changed since the VM booted (now " +
              harvested->key + ")";
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
    log_(LogLevel::kNotice, "formats " + job.key + ": harvested in " +
                                std::to_string(harvested->seconds) + " s into " +
                                harvested->entry_dir.string());
    if (auto loaded = Get(job.key); !loaded.ok()) {
      log_(LogLevel::kWarning, "formats " + job.key + ": " + loaded.error().message);
    }
  } else {
    log_(LogLevel::kWarning, "formats " + job.key + ": " + outcome);
  }
  boost::asio::post(pool_, [self = shared_from_this()] { self->RunNextHarvest(); });
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
