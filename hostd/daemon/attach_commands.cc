#include <unistd.h>

#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "daemon.h"
#include "daemon_libvirt.h"
#include "daemon_log.h"
#include "live_region.h"
#include "private_path.h"
#include "qmp_vm.h"
#include "region_stream.h"

namespace hvtrace::hostd {
namespace asio = boost::asio;
using nlohmann::json;

namespace {

// How often `stream` looks at the region.
constexpr std::chrono::milliseconds kStreamPollInterval{50};

// One `hvtrace stream` request: polls the VM's region on the worker pool and
// sends what is new until the client hangs up, the VM goes, or the region is
// detached.
class StreamSession : public std::enable_shared_from_this<StreamSession> {
 public:
  StreamSession(asio::any_io_executor pool, std::shared_ptr<VmSupervisor> vm,
                std::shared_ptr<LiveRegion> region, std::shared_ptr<Responder> responder,
                const StreamRequest& args, std::function<bool()> daemon_stopping,
                std::atomic<int>& active)
      : timer_(pool),
        daemon_stopping_(std::move(daemon_stopping)),
        active_(active),
        vm_(std::move(vm)),
        region_(std::move(region)),
        responder_(std::move(responder)),
        streamer_(region_->geometry(), RegionStreamOptions{args.json(), args.from_start(),
                                                           std::chrono::milliseconds(1000)}) {
    ++active_;
  }
  ~StreamSession() { --active_; }
  StreamSession(const StreamSession&) = delete;
  StreamSession& operator=(const StreamSession&) = delete;

  void Start() {
    responder_->Stream(StreamChunk{
        {},
        {},
        "streaming VM " + vm_->name() + " (region " + region_->path().string() + "); Ctrl-C ends"});
    Tick();
  }

 private:
  void Tick() {
    if (!responder_->connected()) {
      LogInfo("VM " + vm_->name() + ": stream client gone after " +
              std::to_string(streamer_.events_out()) + " events");
      return;
    }
    const VmState state = vm_->state();
    std::string end_reason;
    if (daemon_stopping_()) {
      // The daemon waits for its workers before it exits: end now.
      end_reason = "hvtraced is shutting down";
    } else if (state == VmState::kGone || state == VmState::kStopped || state == VmState::kFailed ||
               state == VmState::kOffline) {
      end_reason = "VM " + vm_->name() + " is " + std::string(VmStateName(state));
    } else if (state == VmState::kPanicked) {
      end_reason = "VM " + vm_->name() + " panicked";
    } else if (region_->detached()) {
      end_reason = "region detached from VM " + vm_->name();
    }
    const bool flush = !end_reason.empty();
    if (!reader_) {
      auto reader = region_->NewReader();
      if (!reader.ok()) {
        responder_->Fail(kErrInternal, "stream " + vm_->name() + ": " + reader.error().message);
        return;
      }
      reader_ = std::move(*reader);
    }
    // Copies and validates only what changed since the last tick: an idle
    // stream costs its descriptors, not the region.
    if (Status s = region_->Refresh(*reader_); !s.ok()) {
      responder_->Fail(kErrInternal, "stream " + vm_->name() + ": " + s.error().message);
      return;
    }
    RegionStreamer::Output out =
        streamer_.Feed(reader_->Validate(), std::chrono::steady_clock::now(), flush);
    for (const std::string& note : out.notes) responder_->Stream(StreamChunk{{}, {}, note});
    if (!out.text.empty()) {
      responder_->Stream(StreamChunk{{}, std::move(out.text), {}});
    }
    if (flush) {
      responder_->End(
          StreamEndReply{{}, end_reason, streamer_.events_out(), streamer_.pages_missed()});
      return;
    }
    timer_.expires_after(kStreamPollInterval);
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (ec) return;
      try {
        self->Tick();
      } catch (const std::exception& e) {
        self->responder_->Fail(kErrInternal, std::string("stream failed: ") + e.what());
      }
    });
  }

  asio::steady_timer timer_;
  std::function<bool()> daemon_stopping_;
  std::atomic<int>& active_;  // The daemon's count of running streams.
  std::shared_ptr<VmSupervisor> vm_;
  std::shared_ptr<LiveRegion> region_;
  std::shared_ptr<Responder> responder_;
  RegionStreamer streamer_;
  std::unique_ptr<IncrementalRegionReader> reader_;  // Made on the pool, at the first tick.
};

}  // namespace

void Daemon::HandleStream(const Request&, const StreamRequest& args,
                          const ResponderPtr& responder) {
  auto vm = VmNamed(args.name, *responder);
  if (!vm) return;
  std::shared_ptr<LiveRegion> region = vm->backend() ? vm->backend()->live_region() : nullptr;
  if (!region) {
    responder->Fail(
        kErrBadRequest,
        "VM " + vm->name() + " has no attached region; `hvtrace attach " + vm->name() + "` first");
    return;
  }
  auto session = std::make_shared<StreamSession>(
      pool_.get_executor(), vm, region, responder, args, [this] { return stopping(); },
      active_streams_);
  asio::post(pool_, [session] { session->Start(); });
}

void Daemon::HandleDetach(const Request&, const DetachRequest& args,
                          const ResponderPtr& responder) {
  auto vm = VmNamed(args.name, *responder);
  if (!vm) return;
  if (!vm->backend()) {
    responder->Fail(kErrBadRequest, "VM " + vm->name() + " is offline (no backend to detach from)");
    return;
  }
  const std::string name = vm->name();
  vm->backend()->Detach(args.timeout(), [vm, responder, name](Result<DetachReply> result) {
    if (!result.ok()) {
      responder->Fail(kErrVmFailed, "detach " + name + ": " + result.error().message);
      return;
    }
    result->name = name;
    LogNotice("VM " + name + ": detached");
    responder->Reply(*result);
  });
}

void Daemon::AdoptForAttach(const Request& request, const AttachRequest& args, VmKind kind,
                            const ResponderPtr& responder, std::function<void()> then) {
  const std::string& name = args.name;
  if (kind == VmKind::kQmp) {
    // An attach-only QMP VM (no boot range). AdoptKind saw args.qmp.
    QmpVmSpec spec;
    spec.qmp_socket = std::filesystem::absolute(args.qmp.value_or("")).string();
    if (Status s = CheckQmpPeer(request, spec.qmp_socket); !s.ok()) {
      responder->Fail(kErrBadRequest, "attach " + name + ": " + s.error().message);
      return;
    }
    if (Status s = RegisterQmpVm(name, spec, nullptr); !s.ok()) {
      responder->Fail(kErrInternal, "attach " + name + ": " + s.error().message);
      return;
    }
    asio::post(pool_, std::move(then));
    return;
  }
  if (!libvirt_) {
    responder->Fail(
        registry_.Find(name) ? kErrBadRequest : kErrUnknownVm,
        "VM '" + name + "' is not watched by hvtraced; give its QMP socket (`hvtrace attach " +
            name + " --qmp SOCK`), adopt it first, or set libvirt_uri to attach libvirt domains");
    return;
  }
  asio::post(pool_, [this, name, responder, then = std::move(then)] {
    Result<AdoptReply> adopted = libvirt_->Adopt(name, name, /*allow_no_region=*/true);
    if (!adopted.ok()) {
      responder->Fail(
          kErrVmFailed,
          "attach " + name + ": hvtraced does not serve '" + name +
              "' yet and cannot adopt it as a libvirt domain: " + adopted.error().message +
              " (a QEMU of your own: `hvtrace attach " + name + " --qmp SOCK`)");
      return;
    }
    then();
  });
}

void Daemon::HandleAttach(const Request& request, const AttachRequest& args,
                          const ResponderPtr& responder) {
  const std::string name = args.name;
  AttachOptions options;
  options.size_bytes = args.size_mib << 20;
  if (Status s = CheckRegionSize(options.size_bytes); !s.ok()) {
    responder->Fail(kErrBadRequest,
                    "attach: --size " + std::to_string(args.size_mib) + "M: " + s.error().message);
    return;
  }
  options.events = args.events;
  options.pump_interval_ms = static_cast<uint32_t>(args.pump_interval_ms);
  options.wait = args.wait();
  // Runs on the pool once the VM is served, whatever its kind.
  auto attach = [this, name, options, responder]() mutable {
    auto vm = registry_.Find(name);
    if (!vm || !vm->backend()) {
      responder->Fail(kErrInternal, "attach " + name + ": the VM vanished while adopting it");
      return;
    }
    const std::string file = "hvtrace-" + name + "-attach";
    if (std::filesystem::path dir = vm->backend()->attach_region_dir(); !dir.empty()) {
      options.region_path = dir / file;
    } else {
      dir = config()->EffectiveSocketPath().parent_path() / kMemoryDirName;
      // Kept as it is (0700, or 0710 for QEMU's group when VMs run as
      // qemu_user); the region file itself is given to QEMU's group when
      // QEMU is not the daemon's user (QmpRegionTransport::Probe).
      if (Status s =
              EnsureGuestMemoryDir(dir, std::nullopt, "attach " + name + ": region directory");
          !s.ok()) {
        responder->Fail(kErrInternal, s.error().message);
        return;
      }
      options.region_path = dir / file;
    }
    // Before the region exists, so its first capture does not allocate.
    captures_->Reserve({.attach = options.size_bytes});
    vm->backend()->Attach(options, [vm, responder, name](Result<AttachReply> result) {
      if (!result.ok()) {
        responder->Fail(kErrVmFailed, "attach " + name + ": " + result.error().message);
        return;
      }
      result->name = name;
      LogNotice("VM " + name + ": attached region " + result->region.file);
      responder->Reply(*result);
    });
  };
  auto vm = registry_.Find(name);
  if (vm && vm->live()) {
    asio::post(pool_, attach);
    return;
  }
  Result<VmKind> kind = AdoptKind("attach", name, args.qmp.has_value());
  if (!kind.ok()) {
    responder->Fail(kErrBadRequest, kind.error().message);
    return;
  }
  // A libvirt adopt makes the VM's directory once the domain is found.
  if (!ReadyForNewVm(name, *responder, /*make_dir=*/*kind == VmKind::kQmp)) return;
  AdoptForAttach(request, args, *kind, responder, attach);
}

}  // namespace hvtrace::hostd
