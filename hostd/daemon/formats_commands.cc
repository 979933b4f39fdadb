// formats-list and formats-harvest (requests.h): the daemon's formats
// cache, the one every VM decodes with, listed and filled for clients.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstring>
#include <set>

#include "client_files.h"
#include "daemon.h"
#include "daemon_log.h"
#include "formats_replies.h"

namespace hvtrace::hostd {

namespace asio = boost::asio;
using nlohmann::json;

// Client harvests queued or running at once; more are refused as busy (each
// holds a private copy of a kernel of up to kMaxKernelBytes).
constexpr int kMaxClientHarvests = 4;

void Daemon::HandleFormatsList(const Request&, const FormatsListRequest&,
                               const ResponderPtr& responder) {
  // Listing reads every entry's manifest: off the I/O thread.
  asio::post(pool_, [formats = formats_, responder] {
    FormatsListReply reply;
    if (!formats->root().empty()) reply.cache = FormatCache(formats->root()).formats_dir().string();
    reply.harvest_initrd = formats->harvest_initrd().string();
    std::set<std::string> listed;
    if (formats->root().empty()) {
      reply.problems.push_back("hvtraced has no formats cache directory (cache_dir)");
    } else {
      std::vector<std::string> problems;
      auto entries = FormatCache(formats->root()).List(&problems);
      if (!entries.ok()) {
        responder->Fail(kErrInternal, "formats-list: " + entries.error().message);
        return;
      }
      reply.problems.insert(reply.problems.end(), problems.begin(), problems.end());
      for (const CacheEntrySummary& e : *entries) {
        listed.insert(e.key);
        reply.kernels.push_back(KernelRowOf(e, formats->StateOf(e.key)));
      }
    }
    for (const auto& [key, state] : formats->HarvestStates()) {
      if (!listed.contains(key)) reply.harvests.push_back(FormatsHarvestRow{{}, key, state});
    }
    responder->Reply(reply);
  });
}

// Runs on the I/O thread: checks the request and the descriptor, then the
// copy, the hash and the harvest go to the pools (formats_service.h).
void Daemon::HandleFormatsHarvest(const Request& request, const FormatsHarvestRequest& args,
                                  const ResponderPtr& responder) {
  auto kernel_fd = RequestFile(request, "kernel", kMaxKernelBytes, /*required=*/true);
  if (!kernel_fd.ok()) {
    responder->Fail(kErrBadRequest, kernel_fd.error().message);
    return;
  }
  const std::string who = "uid " + std::to_string(request.peer_uid.value_or(0));
  if (client_harvests_.fetch_add(1) >= kMaxClientHarvests) {
    client_harvests_.fetch_sub(1);
    responder->Fail(kErrBusy, "formats-harvest " + args.kernel + ": " +
                                  std::to_string(kMaxClientHarvests) +
                                  " harvests are already queued; try again when they end");
    return;
  }
  static std::atomic<uint64_t> next_copy{0};
  const std::filesystem::path copy =
      HarvestInputsDir() / ("kernel-" + std::to_string(next_copy.fetch_add(1)));
  asio::post(pool_, [this, args, fd = *kernel_fd, copy, who, responder] {
    // The daemon's own copy: it is hashed, booted and hashed again by the
    // harvest, and the client could rewrite its file between those reads.
    const std::string what = "kernel " + args.kernel + " of " + who;
    auto fail = [this, &copy, &responder](const std::string& why) {
      std::error_code ec;
      std::filesystem::remove(copy, ec);
      client_harvests_.fetch_sub(1);
      LogWarning("formats-harvest: " + why);
      responder->Fail(kErrVmFailed, why);
    };
    Status copied = MakeDirs(copy.parent_path(), 0700);
    if (copied.ok() && ::chmod(copy.parent_path().c_str(), 0700) != 0) {
      copied = Error{"chmod " + copy.parent_path().string() + ": " + std::strerror(errno)};
    }
    if (copied.ok()) copied = CopyClientFile(fd->get(), what, copy, kMaxKernelBytes);
    if (!copied.ok()) return fail(copied.error().message);
    auto key = KernelKeyOfFile(copy.string());
    if (!key.ok()) return fail(what + ": " + key.error().message);
    LogInfo(who + " asked for the formats of " + args.kernel + " (" + *key + ")");
    const std::string cache = FormatCache(formats_->root()).formats_dir().string();
    responder->Stream(
        ProgressItem{{}, "kernel " + *key + ": queued for hvtraced's cache " + cache});
    FormatsService::HarvestRequest harvest;
    harvest.key = *key;
    harvest.kernel = copy.string();
    harvest.label = args.kernel;
    harvest.boot_timeout = args.timeout();
    harvest.progress = [responder](std::string_view line) {
      responder->Stream(ProgressItem{{}, std::string(line)});
    };
    harvest.done = [this, copy, who, responder, cache](Result<HarvestResult> r) {
      std::error_code ec;
      std::filesystem::remove(copy, ec);
      client_harvests_.fetch_sub(1);
      if (!r.ok()) {
        responder->Fail(kErrVmFailed, r.error().message);
        return;
      }
      LogInfo(who + ": formats " + r->key +
              (r->cache_hit ? " were cached in " : " harvested into ") + r->entry_dir.string());
      responder->End(HarvestReplyOf(*r, cache));
    };
    formats_->Harvest(std::move(harvest));
  });
}

std::filesystem::path Daemon::HarvestInputsDir() const {
  // "inputs": ShareStateDir leaves such directories 0700 (client_files.h).
  return state_.root() / "harvest" / "inputs";
}

}  // namespace hvtrace::hostd
