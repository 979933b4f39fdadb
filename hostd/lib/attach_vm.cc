#pragma GCC diagnostic ignored "-Wnull-dereference"  // Asio internals under GCC 12 (see daemon.cc).
#include "attach_vm.h"

#include <unistd.h>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "daemon.h"
#include "daemon_log.h"
#include "qmp_vm.h"
#include "region_stream.h"

namespace hvtrace::hostd {
namespace {

namespace asio = boost::asio;
using nlohmann::json;

Status GetString(const json& args, const char* cmd, const char* key, bool required, std::string* out) {
  auto it = args.find(key);
  if (it == args.end() || it->is_null()) {
    if (required) return Error{std::string(cmd) + ": args." + key + " is required"};
    return {};
  }
  if (!it->is_string()) return Error{std::string(cmd) + ": args." + key + " must be a string"};
  *out = it->get<std::string>();
  return {};
}

Status GetUint(const json& args, const char* cmd, const char* key, uint64_t lo, uint64_t hi,
               uint64_t* out) {
  auto it = args.find(key);
  if (it == args.end() || it->is_null()) return {};
  // JSON from the wire parses as unsigned; built in C++ it may be signed.
  if (!it->is_number_integer() || (!it->is_number_unsigned() && it->get<int64_t>() < 0)) {
    return Error{std::string(cmd) + ": args." + key + " must be a non-negative integer"};
  }
  const uint64_t v = it->get<uint64_t>();
  if (v < lo || v > hi) {
    return Error{std::string(cmd) + ": args." + key + " = " + std::to_string(v) + " is outside " +
                 std::to_string(lo) + ".." + std::to_string(hi)};
  }
  *out = v;
  return {};
}

Status CheckObject(const json& args, const char* cmd) {
  if (!args.is_object()) return Error{std::string(cmd) + ": args must be an object"};
  return {};
}

}  // namespace

Result<AttachArgs> ParseAttachArgs(const json& args) {
  if (Status s = CheckObject(args, "attach"); !s.ok()) return s.error();
  AttachArgs a;
  uint64_t size_mib = a.options.size_bytes >> 20;
  uint64_t pump = a.options.pump_interval_ms;
  uint64_t wait = static_cast<uint64_t>(a.options.wait.count());
  for (Status s : {GetString(args, "attach", "name", true, &a.name),
                   GetString(args, "attach", "qmp", false, &a.qmp),
                   GetString(args, "attach", "events", false, &a.options.events),
                   GetUint(args, "attach", "size_mib", 1, 16384, &size_mib),
                   GetUint(args, "attach", "pump_interval_ms", 1, 60000, &pump),
                   GetUint(args, "attach", "wait_ms", 0, 600000, &wait)}) {
    if (!s.ok()) return s.error();
  }
  if (Status s = ValidateVmName(a.name); !s.ok()) return Error{"attach: " + s.error().message};
  a.options.size_bytes = size_mib << 20;
  if (Status s = CheckRegionSize(a.options.size_bytes); !s.ok()) {
    return Error{"attach: --size " + std::to_string(size_mib) + "M: " + s.error().message};
  }
  if (a.options.events.size() > region::kEventsTextSize) {
    return Error{"attach: args.events is " + std::to_string(a.options.events.size()) +
                 " bytes; at most " + std::to_string(region::kEventsTextSize) + " fit in the region"};
  }
  a.options.pump_interval_ms = static_cast<uint32_t>(pump);
  a.options.wait = std::chrono::milliseconds(wait);
  return a;
}

Result<DetachArgs> ParseDetachArgs(const json& args) {
  if (Status s = CheckObject(args, "detach"); !s.ok()) return s.error();
  DetachArgs d;
  uint64_t timeout = static_cast<uint64_t>(d.timeout.count());
  for (Status s : {GetString(args, "detach", "name", true, &d.name),
                   GetUint(args, "detach", "timeout_ms", 1, 600000, &timeout)}) {
    if (!s.ok()) return s.error();
  }
  if (Status s = ValidateVmName(d.name); !s.ok()) return Error{"detach: " + s.error().message};
  d.timeout = std::chrono::milliseconds(timeout);
  return d;
}

Result<StreamArgs> ParseStreamArgs(const json& args) {
  if (Status s = CheckObject(args, "stream"); !s.ok()) return s.error();
  StreamArgs a;
  std::string format = "text", from = "now";
  for (Status s : {GetString(args, "stream", "name", true, &a.name),
                   GetString(args, "stream", "format", false, &format),
                   GetString(args, "stream", "from", false, &from)}) {
    if (!s.ok()) return s.error();
  }
  if (Status s = ValidateVmName(a.name); !s.ok()) return Error{"stream: " + s.error().message};
  if (format != "text" && format != "json") return Error{"stream: format '" + format + "' is not text or json"};
  if (from != "now" && from != "start") return Error{"stream: from '" + from + "' is not now or start"};
  a.json = format == "json";
  a.from_start = from == "start";
  return a;
}

namespace {

// One `hvtrace stream` request: polls the VM's region on the worker pool and
// sends what is new until the client hangs up, the VM goes, or the region is
// detached.
class StreamSession : public std::enable_shared_from_this<StreamSession> {
 public:
  StreamSession(asio::any_io_executor pool, std::shared_ptr<VmSupervisor> vm,
                std::shared_ptr<LiveRegion> region, std::shared_ptr<Responder> responder,
                const StreamArgs& args)
      : timer_(pool),
        vm_(std::move(vm)),
        region_(std::move(region)),
        responder_(std::move(responder)),
        streamer_(region_->geometry(), RegionStreamOptions{args.json, args.from_start, std::chrono::milliseconds(1000)}) {}

  void Start() {
    responder_->Stream({{"note", "streaming VM " + vm_->name() + " (region " + region_->path().string() +
                                     "); Ctrl-C ends"}});
    Tick();
  }

 private:
  void Tick() {
    if (!responder_->connected()) {
      Log("VM " + vm_->name() + ": stream client gone after " + std::to_string(streamer_.events_out()) + " events");
      return;
    }
    const VmState state = vm_->state();
    std::string end_reason;
    if (state == VmState::kGone || state == VmState::kStopped || state == VmState::kFailed ||
        state == VmState::kOffline) {
      end_reason = "VM " + vm_->name() + " is " + std::string(VmStateName(state));
    } else if (state == VmState::kPanicked) {
      end_reason = "VM " + vm_->name() + " panicked";
    } else if (region_->detached()) {
      end_reason = "region detached from VM " + vm_->name();
    }
    const bool flush = !end_reason.empty();
    auto snapshot = region_->Snapshot();
    if (!snapshot.ok()) {
      responder_->Fail(kErrInternal, "stream " + vm_->name() + ": " + snapshot.error().message);
      return;
    }
    RegionStreamer::Output out = streamer_.Feed(&*snapshot, std::chrono::steady_clock::now(), flush);
    for (const std::string& note : out.notes) responder_->Stream({{"note", note}});
    if (!out.text.empty()) responder_->Stream({{"text", std::move(out.text)}});
    if (flush) {
      responder_->End({{"reason", end_reason},
                       {"events", streamer_.events_out()},
                       {"pages_missed", streamer_.pages_missed()}});
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
  std::shared_ptr<VmSupervisor> vm_;
  std::shared_ptr<LiveRegion> region_;
  std::shared_ptr<Responder> responder_;
  RegionStreamer streamer_;
};

}  // namespace

bool Daemon::HandleAttachCommand(const Request& request, const std::shared_ptr<Responder>& responder) {
  const std::string& cmd = request.cmd;
  if (cmd != "attach" && cmd != "detach" && cmd != "stream") return false;

  if (cmd == "stream") {
    auto args = ParseStreamArgs(request.args);
    if (!args.ok()) {
      responder->Fail(kErrBadRequest, args.error().message);
      return true;
    }
    auto vm = VmFromArgs(request, *responder);
    if (!vm) return true;
    std::shared_ptr<LiveRegion> region = vm->backend() ? vm->backend()->live_region() : nullptr;
    if (!region) {
      responder->Fail(kErrBadRequest, "VM " + vm->name() + " has no attached region; `hvtrace attach " +
                                          vm->name() + "` first");
      return true;
    }
    auto session = std::make_shared<StreamSession>(pool_.get_executor(), vm, region, responder, *args);
    asio::post(pool_, [session] { session->Start(); });
    return true;
  }

  if (cmd == "detach") {
    auto args = ParseDetachArgs(request.args);
    if (!args.ok()) {
      responder->Fail(kErrBadRequest, args.error().message);
      return true;
    }
    auto vm = VmFromArgs(request, *responder);
    if (!vm) return true;
    if (!vm->backend()) {
      responder->Fail(kErrBadRequest, "VM " + vm->name() + " is offline (no backend to detach from)");
      return true;
    }
    const std::string name = vm->name();
    vm->backend()->Detach(args->timeout, [vm, responder, name](Result<json> result) {
      if (!result.ok()) {
        responder->Fail(kErrVmFailed, "detach " + name + ": " + result.error().message);
        return;
      }
      Log("VM " + name + ": detached");
      responder->Reply(*result);
    });
    return true;
  }

  // attach
  auto args = ParseAttachArgs(request.args);
  if (!args.ok()) {
    responder->Fail(kErrBadRequest, args.error().message);
    return true;
  }
  auto vm = registry_.Find(args->name);
  const bool live = vm && vm->backend() && vm->state() != VmState::kGone &&
                    vm->state() != VmState::kStopped && vm->state() != VmState::kFailed;
  if (!live) {
    if (args->qmp.empty()) {
      responder->Fail(vm ? kErrBadRequest : kErrUnknownVm,
                      "VM '" + args->name + "' is not watched by hvtraced; give its QMP socket "
                      "(`hvtrace attach " + args->name + " --qmp SOCK`) or adopt it first");
      return true;
    }
    // Adopt it: an attach-only QMP VM (no boot range).
    QmpVmSpec spec;
    spec.qmp_socket = std::filesystem::absolute(args->qmp).string();
    const std::filesystem::path vm_dir = state_.VmDir(args->name);
    if (Status s = MakeDirs(vm_dir, 0750); !s.ok()) {
      responder->Fail(kErrInternal, s.error().message);
      return true;
    }
    if (Status s = SaveQmpVmSpec(vm_dir, spec); !s.ok()) Log("warning: VM " + args->name + ": " + s.error().message);
    if (auto old = registry_.Remove(args->name)) old->Stop();
    auto backend = std::make_unique<QmpVmBackend>(io_.get_executor(), spec, nullptr);
    if (Status s = AddVm(args->name, std::move(backend)); !s.ok()) {
      responder->Fail(kErrInternal, s.error().message);
      return true;
    }
    Log("VM " + args->name + ": adopted for attach (QMP " + spec.qmp_socket + ")");
    vm = registry_.Find(args->name);
  }
  const std::string name = args->name;
  args->options.region_path = "/dev/shm/hvtrace-" + name + "-attach";
  if (auto* qmp = dynamic_cast<QmpVmBackend*>(vm->backend())) qmp->set_spec_dir(state_.VmDir(name));
  vm->backend()->Attach(args->options, [vm, responder, name](Result<json> result) {
    if (!result.ok()) {
      responder->Fail(kErrVmFailed, "attach " + name + ": " + result.error().message);
      return;
    }
    json reply = std::move(*result);
    reply["name"] = name;
    Log("VM " + name + ": attached region " + reply.value("/region/file"_json_pointer, std::string()));
    responder->Reply(reply);
  });
  return true;
}

}  // namespace hvtrace::hostd
