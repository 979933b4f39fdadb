#include "attach_session.h"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <filesystem>
#include <system_error>

#include "host_time.h"
#include "hvtrace/region.h"
#include "units.h"

namespace hvtrace::hostd {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// How often the header is read while waiting for the agent: its
// announcement is one store, so this bounds announce_ms' resolution only.
constexpr auto kAgentPoll = std::chrono::milliseconds(50);

bool Announced(const RegionGuestInfo& guest) {
  return guest.present && guest.status.state == region::kStateRunning;
}

AttachedRegion RegionOf(const LiveRegion& region) {
  return AttachedRegion{
      {}, region.path().string(), region.size(), HexId(region.geometry().region_id)};
}

AttachedDevice DeviceOf(const PluggedDevice& device) {
  AttachedDevice d;
  d.id = device.id;
  d.memdev = device.memdev;
  if (!device.bus.empty()) d.bus = device.bus;
  return d;
}

}  // namespace

struct AttachSession::Job {
  AttachOptions options;
  AttachDone done;
  Clock::time_point start = Clock::now();
  Clock::time_point plugged_at;
  std::shared_ptr<LiveRegion> region;
  AttachReply reply;
  std::unique_ptr<boost::asio::steady_timer> timer;
};

AttachSession::AttachSession(boost::asio::any_io_executor timers, RegionTransport& transport)
    : timers_(std::move(timers)), transport_(transport) {}

AttachSession::~AttachSession() = default;

void AttachSession::Attach(const AttachOptions& options, AttachDone done) {
  {
    std::lock_guard lock(mu_);
    if (busy_) {
      done(Error{"an attach or detach is already under way"});
      return;
    }
    if (device_) {
      done(Error{"region " + region_->path().string() + " is already attached (device " +
                 device_->id + "); `hvtrace detach` first"});
      return;
    }
    busy_ = true;
  }
  auto job = std::make_shared<Job>();
  job->options = options;
  job->done = std::move(done);
  std::weak_ptr<int> life = life_;
  transport_.Probe(options, [this, life, job](Result<PlugTarget> target) {
    if (life.expired()) return;
    if (!target.ok()) return Finish(job, target.error());
    Plug(job, std::move(*target));
  });
}

void AttachSession::Plug(std::shared_ptr<Job> job, PlugTarget target) {
  LiveRegionOptions ro;
  ro.path = job->options.region_path;
  ro.size_bytes = job->options.size_bytes;
  ro.max_cpus = target.cpus;
  ro.events = job->options.events;
  ro.pump_interval_ms = job->options.pump_interval_ms;
  ro.owner_uid = target.owner_uid;
  ro.owner_gid = target.owner_gid;
  ro.qemu_group = target.qemu_group;
  ro.replace_existing = true;  // The daemon's own name for this VM's region.
  Result<std::shared_ptr<LiveRegion>> region = LiveRegion::Create(ro);
  if (!region.ok()) return Finish(job, region.error());
  job->region = *region;
  job->reply.region = RegionOf(*job->region);
  if (target.transport.is_object()) job->reply.transport = target.transport;
  std::weak_ptr<int> life = life_;
  transport_.Plug(*job->region, target, [this, life, job](Result<PluggedDevice> device) {
    if (life.expired()) return;
    if (!device.ok()) {
      // Nothing in the VM maps it: the file goes with the failed attach.
      std::error_code ec;
      std::filesystem::remove(job->region->path(), ec);
      return Finish(job, device.error());
    }
    job->plugged_at = Clock::now();
    job->reply.device = DeviceOf(*device);
    if (device->transport.is_object()) job->reply.transport.update(device->transport);
    job->reply.plug_ms = MsBetween(job->start, job->plugged_at);
    {
      std::lock_guard lock(mu_);
      region_ = job->region;
      device_ = std::move(*device);
    }
    AwaitAgent(job);
  });
}

void AttachSession::AwaitAgent(std::shared_ptr<Job> job) {
  const RegionGuestInfo guest = job->region->Guest();
  const bool announced = Announced(guest);
  if (!announced && Clock::now() - job->plugged_at < job->options.wait) {
    if (!job->timer) job->timer = std::make_unique<boost::asio::steady_timer>(timers_);
    job->timer->expires_after(kAgentPoll);
    std::weak_ptr<int> life = life_;
    job->timer->async_wait([this, life, job](const boost::system::error_code& ec) {
      if (ec || life.expired()) return;
      AwaitAgent(job);
    });
    return;
  }
  AttachReply& reply = job->reply;
  if (announced) {
    reply.announce_ms = MsBetween(job->plugged_at, Clock::now());
    reply.guest = AnnouncementOf(guest);
  } else {
    reply.note =
        "no hvtrace-agent announced itself within " + std::to_string(job->options.wait.count()) +
        " ms; the region stays plugged (start hvtrace-agent in the guest; `hvtrace status` "
        "shows it later)";
  }
  Finish(job, std::move(reply));
}

void AttachSession::Finish(std::shared_ptr<Job> job, Result<AttachReply> result) {
  {
    std::lock_guard lock(mu_);
    busy_ = false;
    last_ = result.ok() ? MessageToJson(*result) : json{{"error", result.error().message}};
  }
  if (job->done) std::exchange(job->done, nullptr)(std::move(result));
}

void AttachSession::Detach(std::chrono::milliseconds timeout, DetachDone done) {
  PluggedDevice device;
  {
    std::lock_guard lock(mu_);
    if (busy_) {
      done(Error{"an attach or detach is already under way"});
      return;
    }
    if (!device_) {
      done(Error{"no region is attached"});
      return;
    }
    busy_ = true;
    device = *device_;
  }
  const Clock::time_point start = Clock::now();
  std::weak_ptr<int> life = life_;
  transport_.Unplug(device, timeout, [this, life, device, start, done](Result<std::string> after) {
    if (life.expired()) return;
    Result<DetachReply> reply = DetachReply{};
    if (after.ok()) {
      DeviceGone(device.id);  // Idempotent: the transport may have reported it first.
      reply->device = device.id;
      reply->device_deleted_ms = MsBetween(start, Clock::now());
      reply->region.file = this->region()->path().string();
      if (!after->empty()) reply->object_del_error = *after;
    } else {
      reply = after.error();
    }
    {
      std::lock_guard lock(mu_);
      busy_ = false;
      last_ = reply.ok() ? MessageToJson(*reply) : json{{"error", reply.error().message}};
    }
    done(std::move(reply));
  });
}

bool AttachSession::DeviceGone(const std::string& id) {
  std::shared_ptr<LiveRegion> region;
  {
    std::lock_guard lock(mu_);
    if (!device_ || id.empty() || device_->id != id) return false;
    // Whoever asked: without this a guest-side eject left the VM "attached"
    // (a stream waiting forever, attach refused).
    device_.reset();
    region = region_;
    if (!busy_) {
      last_ = {{"detached", true}, {"device", id}, {"by", "the guest (nobody asked for it)"}};
    }
  }
  if (region) region->MarkDetached();
  return true;
}

void AttachSession::Adopt(std::shared_ptr<LiveRegion> region, PluggedDevice device) {
  std::lock_guard lock(mu_);
  region_ = std::move(region);
  last_ = {{"region", MessageToJson(RegionOf(*region_))},
           {"device", MessageToJson(DeviceOf(device))},
           {"found", true}};
  device_ = std::move(device);
}

void AttachSession::AdoptFailed(std::string message) {
  std::lock_guard lock(mu_);
  last_ = {{"error", std::move(message)}};
}

std::shared_ptr<LiveRegion> AttachSession::region() const {
  std::lock_guard lock(mu_);
  return region_;
}

std::optional<PluggedDevice> AttachSession::device() const {
  std::lock_guard lock(mu_);
  return device_;
}

json AttachSession::Status() const {
  std::lock_guard lock(mu_);
  if (!region_ && last_.is_null()) return nullptr;
  json j = {{"attached", device_.has_value()},
            {"busy", busy_},
            {"region", region_ ? MessageToJson(RegionOf(*region_)) : json(nullptr)},
            {"device", device_ ? MessageToJson(DeviceOf(*device_)) : json(nullptr)},
            {"last", last_}};
  const RegionGuestInfo guest = region_ ? region_->Guest() : RegionGuestInfo{};
  j["guest"] = guest.present ? MessageToJson(AnnouncementOf(guest)) : json(nullptr);
  return j;
}

}  // namespace hvtrace::hostd
