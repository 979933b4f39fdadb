#include "meta_sender.h"

#include <fcntl.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include <cerrno>
#include <cstring>

#include "clock_ns.h"
#include "text_areas.h"
#include "tracefs.h"

namespace hvtrace::agent {
namespace {

constexpr uint64_t kClockPeriodNs = 10000000000ull;

const char* TypeName(meta::MetaType type) {
  switch (type) {
    case meta::MetaType::kBoot:
      return "boot";
    case meta::MetaType::kComms:
      return "comms";
    case meta::MetaType::kClock:
      return "clock";
    case meta::MetaType::kLeaving:
      return "leaving";
    case meta::MetaType::kAck:
      return "ack";
    case meta::MetaType::kHello:
      return "hello";
  }
  return "?";
}

}  // namespace

bool TakeClockSample(ClockSample* out) {
  // The TSC reads bracket the CLOCK_MONOTONIC read; the midpoint is the
  // same instant to within half the bracket. Of three tries the tightest
  // wins: a vCPU preempted in between (TCG, a busy host) would widen it.
  uint64_t best_width = UINT64_MAX;
  for (int i = 0; i < 3; ++i) {
    const uint64_t tsc0 = __rdtsc();
    const uint64_t mono = ClockNs(CLOCK_MONOTONIC);
    const uint64_t tsc1 = __rdtsc();
    if (tsc1 >= tsc0 && tsc1 - tsc0 < best_width) {
      best_width = tsc1 - tsc0;
      out->tsc = tsc0 + (tsc1 - tsc0) / 2;
      out->mono = mono;
    }
  }
  if (best_width == UINT64_MAX) return false;
  out->boot = ClockNs(CLOCK_BOOTTIME);
  out->real = ClockNs(CLOCK_REALTIME);
  return true;
}

MetaSender::MetaSender(MetaOptions options, LogFn log)
    : options_(std::move(options)), log_(std::move(log)), archive_(options_.archive) {}

int MetaSender::TimeoutMs(int otherwise) const {
  if (writer_.needs_boot()) return std::min(otherwise, 50);
  return otherwise;
}

void MetaSender::OnUevent(const Uevent& event) {
  if (event.subsystem != "virtio-ports") return;
  Verbose("virtio-ports uevent: " + event.action + " " + event.devpath);
  // A port that went away: close ours (a write would fail with ENODEV
  // anyway); the next Tick looks for it again.
  if (event.action == "remove" && writer_.fd() >= 0 && access(port_path_.c_str(), F_OK) != 0) {
    writer_.Close();
    log_("metadata port " + port_path_ + " removed");
  }
}

void MetaSender::EventsChanged() {
  if (!archive_.started()) return;
  log_("the set of trace events changed: building the boot archive again");
  archive_.Rebuild();
}

void MetaSender::TryOpen() {
  const std::string path =
      options_.port.empty() ? FindMetaPort(options_.sys_class, options_.dev) : options_.port;
  if (path.empty()) return;  // No port (yet): the usual case without the channel, silent.
  const int fd = open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    // EBUSY: another agent still holds it (the initramfs one, briefly).
    const std::string why = path + ": " + std::strerror(errno);
    if (why != open_error_) log_("cannot open the metadata port " + why);
    open_error_ = why;
    return;
  }
  open_error_.clear();
  port_path_ = path;
  writer_.Adopt(fd);
  archive_.Start();
  log_("metadata port " + path + " opened");
}

void MetaSender::Queue(meta::MetaType type, const std::string& payload) {
  const meta::BootId& id = archive_.Ready()->boot_id;
  std::vector<std::byte> frame = meta::EncodeMetaFrame(type, id, sequence_, payload, true);
  const size_t size = frame.size();
  if (writer_.Queue(type, std::move(frame))) {
    Verbose(std::string("metadata: queued ") + TypeName(type) + " #" + std::to_string(sequence_) +
            ", " + std::to_string(payload.size()) + " bytes, " + std::to_string(size) +
            " on the wire");
    ++sequence_;
  } else {
    Verbose(std::string("metadata: dropped ") + TypeName(type) + " (" +
            std::to_string(writer_.queued_bytes()) + " bytes queued)");
  }
}

void MetaSender::QueueDue(uint64_t now_ns, uint32_t pump_interval_ms) {
  const BootArchive* boot = archive_.Ready();
  if (boot == nullptr) return;
  if (logged_revision_ != archive_.revision()) {
    logged_revision_ = archive_.revision();
    log_(boot->note + (logged_revision_ > 1 ? " (revision " + std::to_string(logged_revision_) + ")"
                                            : std::string()));
  }
  const bool fresh = writer_.needs_boot();
  if (fresh || (writer_.boot_queued() && sent_revision_ != archive_.revision())) {
    // A new connection, or a newer archive for this one: a kBoot that
    // starts the sequence again (its frame is encoded with sequence 0).
    sequence_ = 0;
    if (writer_.Queue(meta::MetaType::kBoot, boot->frame)) {
      Verbose("metadata: queued boot #0 (revision " + std::to_string(archive_.revision()) + "), " +
              std::to_string(boot->tar.size()) + " bytes, " + std::to_string(boot->frame.size()) +
              " on the wire");
      sequence_ = 1;
      sent_revision_ = archive_.revision();
    }
  }
  if (fresh) {
    comms_sent_.reset();  // Each connection gets the list once, even an empty one.
    next_comms_ns_ = now_ns;
    next_clock_ns_ = now_ns;
  }
  if (!writer_.boot_queued()) return;
  if (now_ns >= next_comms_ns_) {
    next_comms_ns_ = now_ns + uint64_t{pump_interval_ms} * 1000000ull;
    // One list for the whole kernel (all buffers): read only, never written.
    const std::string text = Tracefs(options_.archive.tracefs).Read("saved_cmdlines");
    if (text != comms_sent_ && text.size() <= meta::kMaxCommsRaw) {
      Queue(meta::MetaType::kComms, text);
      comms_sent_ = text;
    }
  }
  if (now_ns >= next_clock_ns_) {
    next_clock_ns_ = now_ns + kClockPeriodNs;
    ClockSample s;
    if (TakeClockSample(&s)) {
      Queue(meta::MetaType::kClock, "{\"samples\": [{\"mono\": " + std::to_string(s.mono) +
                                        ", \"boot\": " + std::to_string(s.boot) +
                                        ", \"real\": " + std::to_string(s.real) +
                                        ", \"tsc\": " + std::to_string(s.tsc) + "}]}");
    }
  }
}

void MetaSender::Tick(uint64_t now_ns, uint32_t pump_interval_ms) {
  if (!options_.enabled) return;
  if (writer_.fd() < 0) TryOpen();
  if (writer_.fd() < 0) return;
  // Before any write: a hello read now keeps the old stream's frames from
  // the new host.
  if (writer_.ReadFromHost()) {
    log_("metadata: a new host on " + port_path_ +
         " (its hello came without a hangup first): sending the boot archive again");
  }
  if (!writer_.Service()) {
    log_("metadata port " + port_path_ + ": " + std::strerror(errno) + "; closed, looking again");
    writer_.Close();
    return;
  }
  if (writer_.connected() != was_connected_) {
    was_connected_ = writer_.connected();
    log_(std::string("metadata: host ") + (was_connected_ ? "connected" : "gone") + " on " +
         port_path_);
  }
  archive_.Poll();
  QueueDue(now_ns, pump_interval_ms);
  if ((writer_.PollEvents() & POLLOUT) != 0 && !writer_.Service()) writer_.Close();
}

void MetaSender::AnnounceLeaving() {
  if (!options_.enabled || options_.leave_wait_ms == 0 || writer_.fd() < 0) return;
  // The archive's boot id when it was built; else /proc's (an agent stopped
  // right after it started).
  meta::BootId id{};
  if (const BootArchive* boot = archive_.Ready()) {
    id = boot->boot_id;
  } else {
    int error = 0;
    const std::string text =
        ReadWholeFile(options_.archive.proc + "/sys/kernel/random/boot_id", &error);
    if (auto parsed = meta::ParseBootId(text)) id = *parsed;
  }
  const LeaveOutcome outcome =
      agent::AnnounceLeaving(writer_, id, sequence_++, options_.leave_wait_ms);
  log_(DescribeLeaveOutcome(outcome, options_.leave_wait_ms));
}

}  // namespace hvtrace::agent
