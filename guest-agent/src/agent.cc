#include "agent.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "boot_marker.h"
#include "clock_ns.h"
#include "hvtrace/fingerprint.h"
#include "hvtrace/format.h"
#include "hvtrace/page.h"

namespace hvtrace::agent {
namespace {

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

// "0b1e...-..." -> 16 bytes; false if malformed.
bool ParseUuid(const std::string& text, uint8_t out[16]) {
  int n = 0;
  for (size_t i = 0; i < text.size() && n < 32; ++i) {
    const char c = text[i];
    int v;
    if (c >= '0' && c <= '9')
      v = c - '0';
    else if (c >= 'a' && c <= 'f')
      v = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      v = c - 'A' + 10;
    else
      continue;
    if (n % 2 == 0)
      out[n / 2] = static_cast<uint8_t>(v << 4);
    else
      out[n / 2] |= static_cast<uint8_t>(v);
    ++n;
  }
  return n == 32;
}

uint32_t ClockId(const std::string& name) {
  if (name == "mono") return region::kClockMono;
  if (name == "local") return region::kClockLocal;
  if (name == "x86-tsc") return region::kClockTsc;
  if (name == "boot") return region::kClockBoot;
  if (name == "global") return region::kClockGlobal;
  return region::kClockUnknown;
}

std::string Basename(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

// saved_cmdlines entries the agent asks for: the kernel's default (128)
// forgets the names of most tasks of a busy guest before the host sees them.
constexpr int kSavedCmdlines = 1024;

Agent::Agent(AgentOptions options)
    : options_(std::move(options)),
      tracefs_(options_.tracefs),
      instance_(options_.tracefs + "/instances/" + options_.instance),
      symbols_(options_.kallsyms),
      meta_(
          [this] {
            MetaOptions m = options_.meta;
            m.verbose = options_.verbose;
            m.archive.tracefs = options_.tracefs;
            m.archive.proc = options_.proc;
            m.archive.kallsyms = options_.kallsyms;
            return m;
          }(),
          [this](const std::string& message) { Log(message); }) {}

// The instance records on: a successor agent continues it (agent.h).
Agent::~Agent() { Detach("agent exit", false); }

void Agent::Log(const std::string& message) const {
  std::fprintf(stderr, "hvtrace-agent: %s\n", message.c_str());
}

Status Agent::OpenInstance() {
  const std::string& name = options_.instance;
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
    return Error{"instance name '" + name + "' is not a directory name"};
  if (mkdir(instance_.root().c_str(), 0755) != 0 && errno != EEXIST) {
    return Error{"cannot create tracefs instance " + instance_.root() + ": " +
                 std::strerror(errno) + " (is tracefs mounted at " + options_.tracefs + "?)"};
  }
  if (!instance_.Exists("tracing_on") || !instance_.Exists("trace_clock"))
    return Error{instance_.root() + " is not a tracefs instance (no tracing_on, trace_clock)"};
  return Status();
}

Status Agent::Attach(const std::string& path) {
  Detach("re-attach", true);
  if (Status s = OpenInstance(); !s.ok()) return s;
  auto mapping = RegionMapping::Map(path);
  if (!mapping.ok()) return mapping.error();
  auto region = GuestRegion::Attach(mapping->data(), mapping->size());
  if (!region.ok()) return Error{path + ": " + region.error().message};
  page_size_ = static_cast<uint32_t>(sysconf(_SC_PAGESIZE));
  if (region->geometry().slot_size != page_size_) {
    return Error{path + ": slot size " + std::to_string(region->geometry().slot_size) +
                 " differs from the guest's sub-buffer size " + std::to_string(page_size_)};
  }
  mapping_ = std::move(*mapping);
  region_.emplace(*region);
  const bool is_bar = path.size() > 10 && path.compare(path.size() - 10, 10, "/resource2") == 0;
  device_slot_ = is_bar ? Basename(path.substr(0, path.size() - 10)) : "";
  region_->status()->state = region::kStateAttaching;

  // The instance's events: a previous agent's (it exited and left them
  // recording) are ours now; ApplyRequests keeps those the host wants.
  AdoptEnabledEvents();
  if (!KeepBacklogFor(region_->geometry().region_id)) {
    // Events the instance buffered after the previous region went away belong
    // to no region; the new one starts with what happens from its attach on.
    // A restarted agent on the same region keeps them: they are its events.
    instance_.Write("trace", "");
  }
  discard_backlog_ = false;
  char owner[32];
  std::snprintf(owner, sizeof owner, "%llx",
                static_cast<unsigned long long>(region_->geometry().region_id));
  SetBacklogOwner(owner);
  instance_.Write("tracing_on", "1");
  // Writing trace_clock empties the instance's buffer: only when it differs.
  if (options_.set_mono_clock && instance_.CurrentClock() != "mono")
    instance_.Write("trace_clock", "mono");
  Announce();
  RaiseSavedCmdlines();  // After Announce: it counts nr_cpus_.
  PublishHeaders();
  symbols_written_ = false;
  comms_published_.clear();
  region_->status()->symbols_state = region::kSymbolsPending;
  symbols_.Start();
  page_buffer_.assign(page_size_, std::byte{0});
  const region::HostRequests requests = region_->ReadRequests();
  snapshot_seq_ = requests.snapshot_seq;  // Only later bumps ask for a snapshot.
  request_seq_ = 0;
  stopped_ = false;
  OpenPipes();
  ApplyRequests(requests);
  const uint64_t now = MonotonicNs();
  last_push_ns_ = 0;
  next_pump_ns_ = now;
  next_heartbeat_ns_ = now;
  region_->status()->max_push_gap_ns = 0;
  if (!stopped_) region_->status()->state = region::kStateRunning;
  WritePointerFile();
  Log("attached " + path + " (" + std::to_string(mapping_.size() >> 20) + " MiB, generation " +
      std::to_string(generation_) + ", " + std::to_string(nr_cpus_) + " CPUs, " +
      std::to_string(enabled_.size()) + " events)");
  return Status();
}

void Agent::Detach(const char* why, bool region_gone) {
  if (!region_) return;
  // After a device removal the mapping reads zeros and swallows writes, so
  // the state written here only reaches the host when it still maps it.
  region_->status()->state = region::kStateDetached;
  for (unsigned c = 0; c < nr_cpus_; ++c) region_->cpu_ring(c)->online = 0;
  ClosePipes();
  RemovePointerFile();
  if (region_gone) {
    DisableEvents();
    discard_backlog_ = true;
    SetBacklogOwner("none");
  }
  region_.reset();
  mapping_.Unmap();
  device_slot_.clear();
  Log(std::string("detached: ") + why +
      " (bus faults absorbed so far: " + std::to_string(RegionBusFaults()) + ")");
}

void Agent::Announce() {
  const region::GuestIdentity previous = region_->ReadIdentity();
  region::GuestIdentity id{};
  {  // A missing boot_id leaves zeros: every attach then counts as one boot.
    std::string text;
    const int fd =
        open((options_.proc + "/sys/kernel/random/boot_id").c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      char buf[64];
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n > 0) text.assign(buf, static_cast<size_t>(n));
      close(fd);
    }
    ParseUuid(text, id.boot_id);
  }
  const bool had = previous.seq != 0 && (previous.seq & 1) == 0 && previous.boot_generation > 0 &&
                   previous.boot_generation < UINT32_MAX;
  if (!had) {
    id.boot_generation = 1;
  } else if (std::memcmp(previous.boot_id, id.boot_id, sizeof(id.boot_id)) == 0) {
    id.boot_generation = previous.boot_generation;  // The agent restarted in the same boot.
  } else {
    id.boot_generation = previous.boot_generation + 1;  // A new boot or kexec.
  }
  generation_ = static_cast<uint32_t>(id.boot_generation);
  utsname u;
  if (uname(&u) == 0) {
    const size_t n = std::min(std::strlen(u.release), sizeof(id.kernel_release) - 1);
    std::memcpy(id.kernel_release, u.release, n);
  }
  const long cpus = sysconf(_SC_NPROCESSORS_CONF);
  nr_cpus_ = static_cast<uint32_t>(std::clamp<long>(cpus, 1, region_->geometry().max_cpus));
  if (cpus > static_cast<long>(nr_cpus_)) {
    Log("guest has " + std::to_string(cpus) + " CPUs, region only " + std::to_string(nr_cpus_) +
        ": the others are not pumped");
  }
  id.nr_cpus = nr_cpus_;
  id.agent_version = 1;
  id.trace_clock = ClockId(instance_.CurrentClock());
  id.page_size = page_size_;
  id.agent_pid = static_cast<uint32_t>(getpid());
  id.attach_mono_ns = MonotonicNs();
  // Two clock-sync samples a few ms apart, written before the identity: the
  // host can convert TSC stamps of direct-write events from the start, and
  // direct-write programs, which wait for the identity, find them and may
  // choose the TSC (dwtrace.hpp). The next comes a second later.
  SampleClocks();
  const uint64_t until = MonotonicNs() + 5000000;
  while (MonotonicNs() < until) {
  }
  SampleClocks();
  region_->WriteIdentity(id);
}

void Agent::SampleClocks() {
  ClockSample s;
  if (!TakeClockSample(&s)) return;  // The TSC went backwards each time: no sample.
  region_->AddClockSync(s.mono, s.boot, s.real, s.tsc);
}

void Agent::PublishHeaders() {
  for (auto [kind, file] : {std::pair{region::kFormatHeaderPage, "events/header_page"},
                            std::pair{region::kFormatHeaderEvent, "events/header_event"}}) {
    if (region_->HasFormat(kind, generation_, 0, 0)) continue;
    const std::string text = instance_.Read(file);
    if (text.empty()) {
      Log(std::string("cannot read ") + file);
      continue;
    }
    if (auto r = region_->PublishFormat(kind, generation_, 0, "ftrace", text, 0); !r.ok())
      Log(r.error().message);
  }
  // trace_marker writes are ftrace:print events: always decodable.
  PublishEvent("ftrace/print");
}

void Agent::PublishEvent(const std::string& sys_event) {
  const std::string text = instance_.Read("events/" + sys_event + "/format");
  const std::string sys = sys_event.substr(0, sys_event.find('/'));
  auto parsed = ParseEventFormat(sys, text);
  if (!parsed.ok()) {
    Log("format of " + sys_event + ": " + parsed.error().message);
    return;
  }
  const uint64_t fp = EventFingerprint(*parsed);
  if (region_->HasFormat(region::kFormatKernelEvent, generation_, parsed->id, fp)) return;
  if (auto r = region_->PublishFormat(region::kFormatKernelEvent, generation_, parsed->id, sys,
                                      text, fp);
      !r.ok()) {
    Log(sys_event + ": " + r.error().message);
  }
}

void Agent::PublishSymbols() {
  const SymbolSource::Symbols* s = symbols_.Ready();
  if (s == nullptr) return;
  symbols_written_ = true;
  uint32_t state = s->state;
  std::string note = s->note;
  if (state == region::kSymbolsPublished) {
    const region::TextAreaHeader h = region_->TextArea(TextAreaKind::kSymbols);
    const bool same = h.seq != 0 && (h.seq & 1) == 0 && h.boot_generation == generation_ &&
                      h.crc32 == s->text.crc32 && h.raw_size == s->text.raw_size &&
                      h.stored_size == s->text.stored.size();
    if (same) {
      note += " (already in the region)";
    } else if (Status w = region_->WriteTextArea(TextAreaKind::kSymbols, generation_, s->text);
               !w.ok()) {
      state =
          region_->geometry().symbol_size == 0 ? region::kSymbolsNoArea : region::kSymbolsTooLarge;
      note += ": not published, " + w.error().message;
    }
  }
  region_->status()->symbols_state = state;
  Log(note);
}

void Agent::PublishComms() {
  if (region_->geometry().comm_size == 0) return;
  // One list for all buffers (the kernel saves the comm of a task that
  // records into any of them), so the instance's events find their names.
  const std::string text = tracefs_.Read("saved_cmdlines");
  if (text.empty() || text == comms_published_) return;  // Unchanged: the usual case, one read.
  if (Status w = region_->WriteTextArea(TextAreaKind::kComms, generation_, EncodeText(text));
      !w.ok()) {
    if (comms_published_.empty()) Log("comms: " + w.error().message);
  }
  comms_published_ = text;
}

// A module with events came or went (event_set_watch.h): the metadata
// channel sends a new archive, and the host's standing request is applied
// again, so events it names by system or wildcard that exist only now are
// enabled and their formats published, and events that are gone are
// forgotten. A module loaded again gets new ids: its events are published
// and enabled anew.
void Agent::EventsChanged() {
  meta_.EventsChanged();
  if (!region_ || stopped_) return;
  Log("the set of trace events changed: applying the host's request again");
  recheck_events_ = true;
  ApplyRequests(region_->ReadRequests());
}

void Agent::ApplyRequests(const region::HostRequests& req) {
  if (req.request_seq == request_seq_ && !recheck_events_) return;
  const bool recheck = recheck_events_;
  recheck_events_ = false;
  request_seq_ = req.request_seq;
  pump_interval_ms_ =
      req.pump_interval_ms == 0 ? 100 : std::clamp<uint32_t>(req.pump_interval_ms, 1, 60000);
  if (req.flags & region::kRequestStop) {
    DisableEvents();
    stopped_ = true;
    region_->status()->state = region::kStateStopped;
  } else {
    stopped_ = false;
    std::set<std::string> wanted;
    const std::string text(req.events, req.events_len);
    size_t start = 0;
    while (start <= text.size()) {
      size_t end = text.find_first_of(",\n ", start);
      if (end == std::string::npos) end = text.size();
      const std::string spec = text.substr(start, end - start);
      if (!spec.empty()) {
        for (std::string& e : instance_.Resolve(spec)) wanted.insert(std::move(e));
      }
      start = end + 1;
    }
    for (const std::string& e : wanted) {
      if (enabled_.count(e)) {
        if (adopted_.erase(e) != 0) PublishEvent(e);  // Enabled by a previous agent.
        // After a change of the event set the event may be another one of
        // the same name (its module loaded again): published, enabled anew.
        if (!recheck || instance_.Read("events/" + e + "/enable").starts_with("1")) continue;
        enabled_.erase(e);
      }
      PublishEvent(e);
      if (instance_.Write("events/" + e + "/enable", "1"))
        enabled_.insert(e);
      else
        Log("cannot enable " + e);
    }
    for (auto it = enabled_.begin(); it != enabled_.end();) {
      if (wanted.count(*it)) {
        ++it;
      } else {
        instance_.Write("events/" + *it + "/enable", "0");
        adopted_.erase(*it);
        it = enabled_.erase(it);
      }
    }
    region_->status()->state = region::kStateRunning;
  }
  region_->status()->events_enabled = enabled_.size();
  __atomic_store_n(&region_->status()->request_ack, request_seq_, __ATOMIC_RELEASE);
}

void Agent::DisableEvents() {
  for (const std::string& e : enabled_) instance_.Write("events/" + e + "/enable", "0");
  enabled_.clear();
  adopted_.clear();
}

void Agent::AdoptEnabledEvents() {
  // set_event lists the instance's enabled events as "sys:event" lines. Only
  // an agent enables events here, so they are a predecessor's.
  const std::string text = instance_.Read("set_event");
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    const size_t colon = line.find(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == line.size()) continue;
    line[colon] = '/';
    if (enabled_.insert(line).second) adopted_.insert(line);
  }
  if (!adopted_.empty())
    Log("took over " + std::to_string(adopted_.size()) + " events enabled in " + instance_.root());
}

// <pointer dir>/backlog names the region the instance's events are recorded
// for ("none" once it went away). /run outlives the agent (and switch_root),
// so a successor agent knows whether the backlog is its region's.
bool Agent::KeepBacklogFor(uint64_t region_id) {
  if (discard_backlog_) return false;
  if (options_.pointer_file.empty()) return true;
  const std::string dir = options_.pointer_file.substr(0, options_.pointer_file.find_last_of('/'));
  Tracefs run(dir);  // Plain file I/O, as for tracefs.
  std::string owner = run.Read("backlog");
  // No region served in this boot yet: lines written before the first
  // attach are kept, as ever.
  if (owner.empty()) return true;
  while (!owner.empty() && (owner.back() == '\n' || owner.back() == ' ')) owner.pop_back();
  char want[32];
  std::snprintf(want, sizeof want, "%llx", static_cast<unsigned long long>(region_id));
  return owner == want;
}

void Agent::SetBacklogOwner(const std::string& owner) {
  if (options_.pointer_file.empty()) return;
  const std::string dir = options_.pointer_file.substr(0, options_.pointer_file.find_last_of('/'));
  mkdir(dir.c_str(), 0755);
  const std::string path = dir + "/backlog", tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return;
  std::fprintf(f, "%s\n", owner.c_str());
  std::fclose(f);
  std::rename(tmp.c_str(), path.c_str());
}

// saved_cmdlines_size is global (no per-instance form), and a resize frees
// the whole list: every buffer's tasks that exited lose their names (live
// ones are saved again at their next switch). So the agent raises it (never
// lowers it) once, and only when no buffer it can see needs a name yet: its
// own instance and the top level hold no unread event, and the top level has
// no tracer and no event enabled (no trace-cmd record there). That is the
// first agent of a boot, which starts before other tracers; a restarted
// agent whose instance holds a backlog leaves the size alone, or the backlog
// it is about to forward would lose its names. A tracer using an instance of
// its own (trace-cmd record -B) is not looked for.
void Agent::RaiseSavedCmdlines() {
  if (cmdlines_checked_) return;
  cmdlines_checked_ = true;
  const std::string size = tracefs_.Read("saved_cmdlines_size");
  if (size.empty() || std::atoi(size.c_str()) >= kSavedCmdlines) return;
  uint64_t buffered = 0;
  for (unsigned c = 0; c < nr_cpus_; ++c) buffered += instance_.Entries(c) + tracefs_.Entries(c);
  const std::string tracer = tracefs_.Read("current_tracer");
  const std::string events = tracefs_.Read("events/enable");
  if (buffered != 0 || tracer.rfind("nop", 0) != 0 || events.rfind("0", 0) != 0) {
    Log("saved_cmdlines_size stays " + size.substr(0, size.find('\n')) +
        ": a tracer or buffered events would lose names in a resize");
    return;
  }
  tracefs_.Write("saved_cmdlines_size", std::to_string(kSavedCmdlines));
}

void Agent::OpenPipes() {
  ClosePipes();
  for (unsigned c = 0; c < nr_cpus_; ++c) {
    const std::string path =
        instance_.root() + "/per_cpu/cpu" + std::to_string(c) + "/trace_pipe_raw";
    const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      Log("cannot open " + path + ": " + std::strerror(errno));
      continue;
    }
    pipes_.push_back({c, fd});
    region::CpuRingHeader* ring = region_->cpu_ring(c);
    ring->cpu = c;
    ring->online = 1;
  }
}

void Agent::ClosePipes() {
  for (CpuPipe& p : pipes_) close(p.fd);
  pipes_.clear();
}

uint64_t Agent::PumpAll() {
  if (!region_) return 0;
  uint64_t pushed = 0;
  const uint32_t max_per_cpu = region_->geometry().slots_per_cpu;
  for (CpuPipe& p : pipes_) {
    region::CpuRingHeader* ring = region_->cpu_ring(p.cpu);
    for (uint32_t i = 0; i < max_per_cpu; ++i) {
      const ssize_t n = read(p.fd, page_buffer_.data(), page_buffer_.size());
      if (n <= 0) {
        if (n < 0 && errno != EAGAIN && errno != EINTR) ring->read_errors++;
        break;
      }
      // The kernel's page header (64-bit layout, what header_page says on
      // every kernel this agent targets): commit at 8, data at 16.
      uint64_t commit_raw = 0;
      std::memcpy(&commit_raw, page_buffer_.data() + 8, sizeof(commit_raw));
      const uint64_t commit = commit_raw & kPageCommitMask;
      if (commit_raw & kPageMissedEvents) {
        uint64_t missed = 1;
        if ((commit_raw & kPageMissedStored) && 16 + commit + 8 <= static_cast<uint64_t>(n)) {
          std::memcpy(&missed, page_buffer_.data() + 16 + commit, sizeof(missed));
        }
        ring->lost_events += missed;
      }
      const uint32_t flags =
          16 + commit + 256 < static_cast<uint64_t>(n) ? uint32_t{region::kSlotPartial} : 0u;
      // Stamped before the page is published: a panic between the two must
      // not leave a page newer than the stamp (the host's loss window says
      // events after it were lost). The release fence keeps the stamp's
      // store before the page's stores (on x86 a compiler barrier only).
      std::atomic_ref<uint64_t>(region_->status()->last_push_mono_ns)
          .store(MonotonicNs(), std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_release);
      region_->PushCpuPage(p.cpu, generation_,
                           std::span<const std::byte>(page_buffer_.data(), static_cast<size_t>(n)),
                           flags);
      ++pushed;
    }
  }
  const uint64_t now = MonotonicNs();
  region::GuestStatus* st = region_->status();
  if (last_push_ns_ != 0) st->max_push_gap_ns = std::max(st->max_push_gap_ns, now - last_push_ns_);
  last_push_ns_ = now;
  std::atomic_ref<uint64_t>(st->last_push_mono_ns).store(now, std::memory_order_relaxed);
  st->pages_pushed += pushed;
  return pushed;
}

void Agent::Heartbeat(uint64_t now) {
  region::GuestStatus* st = region_->status();
  st->heartbeat++;
  st->heartbeat_mono_ns = now;
  if (now < next_heartbeat_ns_) return;
  next_heartbeat_ns_ = now + 1000000000ull;
  SampleClocks();
  for (const CpuPipe& p : pipes_) region_->cpu_ring(p.cpu)->overrun = instance_.Overrun(p.cpu);
  ReapDwRings();
}

void Agent::ReapDwRings() {
  const RegionGeometry& g = region_->geometry();
  for (uint32_t r = 0; r < g.dw_rings; ++r) {
    region::DwRingHeader* h = region_->dw_ring(r);
    uint64_t owner = __atomic_load_n(&h->owner, __ATOMIC_ACQUIRE);
    if (owner == 0) continue;
    const uint32_t gen = static_cast<uint32_t>(owner >> 32);
    const uint32_t tid = static_cast<uint32_t>(owner);
    const std::string task =
        options_.proc + "/" + std::to_string(h->pid) + "/task/" + std::to_string(tid);
    if (gen == generation_ && access(task.c_str(), F_OK) == 0) continue;
    if (__atomic_compare_exchange_n(&h->owner, &owner, uint64_t{0}, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_RELAXED)) {
      for (uint32_t s = 0; s < g.dw_slots; ++s) {
        __atomic_fetch_and(&region_->dw_desc(r, s)->flags, ~uint32_t{region::kSlotOpen},
                           __ATOMIC_RELEASE);
      }
    }
  }
}

void Agent::Tick(bool force) {
  if (!region_) return;
  // The remove uevent comes after the kernel zapped the BAR (and the guard
  // swapped in zero pages), so the region may be gone before we hear of it.
  if (!region_->StillMapped()) {
    Detach("the region is gone (device removed or replaced)", true);
    return;
  }
  const region::HostRequests req = region_->ReadRequests();
  ApplyRequests(req);
  const uint64_t now = MonotonicNs();
  const bool snapshot = req.snapshot_seq != snapshot_seq_;
  if (!symbols_written_) PublishSymbols();
  if (!stopped_ && (force || snapshot || now >= next_pump_ns_)) {
    // Names first: the pages pushed next then find their tasks named.
    PublishComms();
    PumpAll();
    next_pump_ns_ = now + uint64_t{pump_interval_ms_} * 1000000ull;
  }
  if (snapshot) {
    snapshot_seq_ = req.snapshot_seq;
    __atomic_store_n(&region_->status()->snapshot_ack, snapshot_seq_, __ATOMIC_RELEASE);
  }
  Heartbeat(now);
}

void Agent::HandleUevent(const Uevent& event) {
  const std::string slot = event.pci_slot.empty() ? Basename(event.devpath) : event.pci_slot;
  if (event.action == "remove" && region_ && slot == device_slot_) {
    Detach("device removed", true);
    return;
  }
  if (event.action == "add" && event.IsIvshmem()) {
    if (options_.verbose) Log("ivshmem device " + slot + " added");
    pending_slots_.push_back(slot);
    pending_deadline_ns_ = MonotonicNs() + 5000000000ull;
  }
}

void Agent::TryPendingAttach(uint64_t now) {
  if (pending_slots_.empty() || now < pending_retry_ns_) return;
  for (auto it = pending_slots_.begin(); it != pending_slots_.end();) {
    const std::string dev = options_.sysfs_pci_devices + "/" + *it;
    if (access((dev + "/resource2").c_str(), F_OK) != 0) {
      ++it;
      continue;
    }
    if (!region_) {
      // A hot-plugged device has no driver, so nobody enabled its memory
      // decoding; without it the BAR reads as nothing.
      Tracefs sysfs(dev);
      if (sysfs.Read("enable").rfind("0", 0) == 0) sysfs.Write("enable", "1");
      if (Status s = Attach(dev + "/resource2"); !s.ok()) {
        // A device just plugged can fail once (decoding not on yet, the
        // host still writing the header): try again until the deadline
        // rather than wait for an event that already came.
        if (s.error().message != pending_error_) Log(s.error().message + "; trying again");
        pending_error_ = s.error().message;
        pending_retry_ns_ = now + 100000000ull;
        ++it;
        continue;
      }
    }
    it = pending_slots_.erase(it);
  }
  if (now > pending_deadline_ns_ && !pending_slots_.empty()) {
    // An attach error was logged already (once: the rescan net tries a
    // foreign ivshmem device again and again).
    if (pending_error_.empty())
      Log("device " + pending_slots_.front() + " never got a BAR; giving up");
    pending_slots_.clear();
  }
}

// Looks at the PCI devices for itself: at the start, after the uevent socket
// overflowed, and now and then while nothing is attached (a lost uevent
// must not leave a plugged region unused for the agent's whole life).
void Agent::ScanForDevices(uint64_t now) {
  for (const std::string& bar : FindIvshmemBars(options_.sysfs_pci_devices)) {
    const std::string slot = Basename(bar.substr(0, bar.size() - 10));
    if (std::find(pending_slots_.begin(), pending_slots_.end(), slot) == pending_slots_.end())
      pending_slots_.push_back(slot);
  }
  pending_deadline_ns_ = now + 5000000000ull;
}

void Agent::WritePointerFile() {
  if (options_.pointer_file.empty()) return;
  const std::string dir = options_.pointer_file.substr(0, options_.pointer_file.find_last_of('/'));
  mkdir(dir.c_str(), 0755);
  const std::string tmp = options_.pointer_file + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    // Direct-write programs then fall back to scanning for the device.
    Log("cannot write " + tmp + ": " + std::strerror(errno) + "; " + options_.pointer_file +
        " not updated");
    return;
  }
  std::fprintf(f, "%s %llx\n", mapping_.path().c_str(),
               static_cast<unsigned long long>(region_->geometry().region_id));
  std::fclose(f);
  std::rename(tmp.c_str(), options_.pointer_file.c_str());
}

void Agent::RemovePointerFile() {
  if (!options_.pointer_file.empty()) unlink(options_.pointer_file.c_str());
}

int Agent::Run() {
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  // A metadata port that is a socket (tests) reports a gone host as EPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  const uint64_t start = MonotonicNs();
  // The instance exists from the start, so guest services can write its
  // trace_marker before a region comes; an attach keeps those lines.
  if (Status s = OpenInstance(); !s.ok()) {
    Log(s.error().message);
    return 1;
  }
  WriteBootMarker(options_.tracefs, options_.boot_instance, BootMarkerText(getpid()));
  if (!options_.region_path.empty()) {
    if (Status s = Attach(options_.region_path); !s.ok()) {
      Log(s.error().message);
      return 1;
    }
  } else {
    if (!uevents_.Open())
      Log(std::string("no uevent socket (") + std::strerror(errno) + "): rescanning every second");
    ScanForDevices(start);
    TryPendingAttach(start);
    if (!region_) Log("waiting for an hvtrace ivshmem device");
  }
  uint64_t next_scan = start + 1000000000ull;
  std::vector<pollfd> fds;
  while (!g_stop) {
    uint64_t now = MonotonicNs();
    if (options_.run_for_ms != 0 && now - start >= options_.run_for_ms * 1000000ull) break;
    fds.clear();
    if (uevents_.fd() >= 0) fds.push_back({uevents_.fd(), POLLIN, 0});
    const size_t first_pipe = fds.size();
    if (!stopped_) {
      for (const CpuPipe& p : pipes_) fds.push_back({p.fd, POLLIN, 0});
    }
    int timeout_ms = 1000;
    if (region_) {
      timeout_ms = static_cast<int>(std::min<uint64_t>(
          1000, next_pump_ns_ > now ? (next_pump_ns_ - now + 999999) / 1000000 : 0));
    }
    if (!pending_slots_.empty()) timeout_ms = std::min(timeout_ms, 2);
    timeout_ms = meta_.TimeoutMs(timeout_ms);
    const size_t meta_index = fds.size();
    if (meta_.Watched()) fds.push_back({meta_.fd(), meta_.PollEvents(), 0});
    if (event_set_.Due(now) &&
        event_set_.Observe(ReadEventSetSignature(options_.proc, options_.tracefs), now)) {
      EventsChanged();
    }
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      Log(std::string("poll: ") + std::strerror(errno));
      break;
    }
    if (uevents_.fd() >= 0 && (fds[0].revents & POLLIN)) {
      Uevent event;
      for (int r; (r = uevents_.Receive(&event)) != -1;) {
        if (r == UeventSocket::kOverflow) {
          Log("uevents were lost (socket buffer full): looking at the PCI devices again");
          if (!region_) ScanForDevices(MonotonicNs());
          continue;
        }
        if (r != 1) continue;
        HandleUevent(event);
        meta_.OnUevent(event);
      }
    }
    bool readable = false;
    for (size_t i = first_pipe; i < meta_index; ++i) readable |= (fds[i].revents & POLLIN) != 0;
    now = MonotonicNs();
    TryPendingAttach(now);
    Tick(readable);
    meta_.Tick(now, pump_interval_ms_);
    if (options_.region_path.empty() && !region_ && pending_slots_.empty() && now >= next_scan) {
      // Without uevents this is how devices are found; with them, a net.
      next_scan = now + (uevents_.fd() < 0 ? 1000000000ull : 10000000000ull);
      ScanForDevices(now);
    }
  }
  if (region_) {
    PublishComms();
    PumpAll();
  }
  // A stop signal (systemd stopping the unit for a kexec, reboot or
  // poweroff; init's SIGTERM): the host copies the boot range before the
  // next kernel may initialise it afresh. Bounded (leave_handshake.h).
  if (g_stop) meta_.AnnounceLeaving();
  if (region_) Detach("agent exit", false);
  meta_.Finish();
  return 0;
}

}  // namespace hvtrace::agent
