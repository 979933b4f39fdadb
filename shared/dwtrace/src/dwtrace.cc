// Direct-write tracing: per-thread rings of kernel-format pages in the
// region (design in hvtrace/dwtrace.hpp, ABI in hvtrace/region.h).
#include "hvtrace/dwtrace.hpp"

#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <unordered_set>

#include "hvtrace/dwtrace.h"
#include "hvtrace/fingerprint.h"
#include "hvtrace/format.h"
#include "hvtrace/page.h"

namespace hvtrace::dw {
namespace {

// Events larger than this are dropped.
constexpr uint32_t kMaxPayload = 3072;
// Direct-write pages use the 64-bit layout (region.h): data after two u64.
constexpr uint32_t kDataOffset = 16;
// After failing to find a free ring, a thread retries only every this many writes.
constexpr uint32_t kRetryEvery = 1024;

struct TraceEntry {
  uint16_t type;
  uint8_t flags;
  uint8_t preempt_count;
  int32_t pid;
};
static_assert(sizeof(TraceEntry) == 8);

std::mutex g_alive_mutex;
std::unordered_set<uint64_t>* g_alive =
    new std::unordered_set<uint64_t>;  // Never freed: used at thread exit.
std::atomic<uint64_t> g_next_serial{1};

bool ValidName(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return !std::isdigit(static_cast<unsigned char>(s[0]));
}

bool ValidType(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    if (c == ';' || c == '\n' || c == '\t' || c == ':' || c == '"' ||
        static_cast<unsigned char>(c) < 0x20) {
      return false;
    }
  }
  return true;
}

// "char[16]" + "what" -> "char what[16]"; "int" + "step" -> "int step".
std::string Declaration(const Field& f) {
  const size_t bracket = f.type.find('[');
  if (bracket == std::string::npos) return f.type + " " + f.name;
  std::string base = f.type.substr(0, bracket);
  while (!base.empty() && base.back() == ' ') base.pop_back();
  return base + " " + f.name + f.type.substr(bracket);
}

std::string AutoPrintFmt(const std::vector<Field>& fields) {
  std::string fmt, args;
  for (const Field& f : fields) {
    const bool array = f.type.find('[') != std::string::npos;
    const char* conv = nullptr;
    if (array && f.type.rfind("char", 0) == 0) {
      conv = "%s";
    } else if (!array && f.size <= 4) {
      conv = f.is_signed ? "%d" : "%u";
    } else if (!array && f.size == 8) {
      conv = f.is_signed ? "%lld" : "%llu";
    }
    if (conv == nullptr) continue;
    if (!fmt.empty()) fmt += ' ';
    fmt += f.name + "=" + conv;
    args += ", REC->" + f.name;
  }
  return "\"" + fmt + "\"" + args;
}

std::string ReadFirstToken(const std::string& path) {
  std::ifstream in(path);
  std::string token;
  in >> token;
  return token;
}

}  // namespace

struct Tracer::Attachment {
  Attachment(GuestRegion r, uint32_t gen) : region(r), generation(gen) {}
  GuestRegion region;
  RegionMapping mapping;  // Empty for memory the caller owns.
  uint32_t generation;
  uint32_t max_payload = 0;
  // Ids Register() returned (index id - kDwFirstEventId) -> this region's
  // ids; null for the first region, whose ids they are.
  std::unique_ptr<std::atomic<uint16_t>[]> id_map;
};

struct Tracer::ThreadState {
  uint64_t serial = 0;  // Tracer region this thread is bound to (0: none).
  Tracer* tracer = nullptr;
  Attachment* attachment = nullptr;
  const std::atomic<uint16_t>* id_map = nullptr;
  // The host header word that says the region is still there (its region
  // id, or the magic when the id is 0) and the value it must have.
  const uint64_t* live_word = nullptr;
  uint64_t live_value = 0;
  uint32_t max_payload = 0;
  uint32_t ring = 0;
  region::SlotDesc* desc = nullptr;  // Open slot; nullptr: no ring.
  region::DwRingHeader* header = nullptr;
  // The open page (64-bit layout: u64 time_stamp, u64 commit, data at 16).
  std::byte* page = nullptr;
  uint32_t used = 0;      // Data bytes written.
  uint32_t capacity = 0;  // Data bytes the page holds.
  uint64_t last_time = 0;
  int32_t tid = 0;
  uint32_t retry = 0;

  // GuestRegion::StillMapped, in one load.
  bool Live() const { return __atomic_load_n(live_word, __ATOMIC_RELAXED) == live_value; }

  ~ThreadState() {
    std::lock_guard<std::mutex> lock(g_alive_mutex);
    if (serial != 0 && g_alive->count(serial) != 0) tracer->Release(this);
    if (Tracer::tls_ == this) Tracer::tls_ = nullptr;
  }
};

thread_local Tracer::ThreadState* Tracer::tls_ = nullptr;

namespace {
// Owns the calling thread's ThreadState; its destructor (thread exit) gives
// the ring back. Touched only on the slow path, so the hot path never pays
// for a thread_local with a destructor.
struct ThreadStateOwner {
  std::unique_ptr<Tracer::ThreadState> state;
};
thread_local ThreadStateOwner t_owner;

uint64_t CoarseNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

constexpr uint64_t kReopenEveryNs = 50'000'000;
constexpr uint32_t kIdMapSize = 0x10000 - region::kDwFirstEventId;
}  // namespace

bool HasInvariantTsc() {
  static const bool invariant = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("flags", 0) != 0) continue;
      const std::string padded = " " + line + " ";
      return padded.find(" constant_tsc ") != std::string::npos &&
             padded.find(" nonstop_tsc ") != std::string::npos;
    }
    return false;
  }();
  return invariant;
}

bool KernelTrustsTsc() {
  // The kernel's clocksource watchdog takes the TSC off this list when it
  // finds it unstable (it loses CLOCK_SOURCE_VALID_FOR_HRES).
  static const bool trusted = [] {
    std::ifstream in("/sys/devices/system/clocksource/clocksource0/available_clocksource");
    std::string name;
    while (in >> name) {
      if (name == "tsc") return true;
    }
    return false;
  }();
  return trusted;
}

Clock AutoClock(const GuestRegion& region) {
  // The host converts TSC stamps with the agent's clock-sync samples
  // (region_clock.h); the agent writes two before it announces the guest.
  const bool samples = region.status()->clock_sync_count >= 2;
  return HasInvariantTsc() && KernelTrustsTsc() && samples ? Clock::kTsc : Clock::kMonotonic;
}

Tracer::Tracer(std::unique_ptr<Attachment> first, Clock clock)
    : clock_(clock == Clock::kAuto ? AutoClock(first->region) : clock) {
  current_.store(first.get());
  attachments_.push_back(std::move(first));
  std::lock_guard<std::mutex> lock(g_alive_mutex);
  serial_.store(g_next_serial.fetch_add(1));
  g_alive->insert(serial_.load());
}

Tracer::~Tracer() {
  std::lock_guard<std::mutex> lock(g_alive_mutex);
  g_alive->erase(serial_.load());
  if (tls_ != nullptr && tls_->serial == serial_.load()) Release(tls_);
}

uint32_t Tracer::boot_generation() const { return current_.load()->generation; }
const RegionGeometry& Tracer::geometry() const { return current_.load()->region.geometry(); }
uint32_t Tracer::max_payload() const { return current_.load()->max_payload; }
bool Tracer::attached() const { return current_.load()->region.StillMapped(); }

Result<std::unique_ptr<Tracer::Attachment>> Tracer::AttachMemory(std::byte* base, uint64_t size) {
  auto region = GuestRegion::Attach(base, size);
  if (!region.ok()) return region.error();
  if (region->geometry().dw_rings == 0) return Error{"region has no direct-write rings"};
  const region::GuestIdentity id = region->ReadIdentity();
  if (id.seq == 0 || (id.seq & 1) || id.boot_generation == 0 || id.boot_generation > UINT32_MAX) {
    return Error{"region: the agent has not announced the guest yet"};
  }
  auto a = std::make_unique<Attachment>(*region, static_cast<uint32_t>(id.boot_generation));
  a->max_payload = std::min<uint32_t>(kMaxPayload, region->geometry().slot_size - 64);
  return a;
}

Result<std::unique_ptr<Tracer::Attachment>> Tracer::MapRegion(const std::string& path_in) {
  std::vector<std::string> candidates;
  if (!path_in.empty()) {
    candidates.push_back(path_in);
  } else if (const char* env = std::getenv("HVTRACE_REGION"); env != nullptr && *env != '\0') {
    candidates.push_back(env);
  } else {
    if (std::string p = ReadFirstToken(kRegionPointerFile); !p.empty()) candidates.push_back(p);
    for (std::string& bar : FindIvshmemBars("/sys/bus/pci/devices"))
      candidates.push_back(std::move(bar));
  }
  if (candidates.empty())
    return Error{"no hvtrace region: no ivshmem device and no " + std::string(kRegionPointerFile)};
  std::string errors;
  for (const std::string& path : candidates) {
    auto mapping = RegionMapping::Map(path);
    if (!mapping.ok()) {
      errors += mapping.error().message + "; ";
      continue;
    }
    auto a = AttachMemory(mapping->data(), mapping->size());
    if (!a.ok()) {
      errors += path + ": " + a.error().message + "; ";
      continue;
    }
    (*a)->mapping = std::move(*mapping);
    return a;
  }
  return Error{errors};
}

Result<std::unique_ptr<Tracer>> Tracer::FromMemory(std::byte* base, uint64_t size, Clock clock) {
  auto a = AttachMemory(base, size);
  if (!a.ok()) return a.error();
  return std::unique_ptr<Tracer>(new Tracer(std::move(*a), clock));
}

Result<std::unique_ptr<Tracer>> Tracer::Open(const std::string& path, Clock clock) {
  auto a = MapRegion(path);
  if (!a.ok()) return a.error();
  std::unique_ptr<Tracer> t(new Tracer(std::move(*a), clock));
  t->can_reopen_ = true;
  t->open_path_ = path;
  return t;
}

std::string Tracer::FormatText(std::string_view name, uint32_t id, const std::vector<Field>& fields,
                               std::string_view print_fmt) {
  std::string t;
  t += "name: " + std::string(name) + "\n";
  t += "ID: " + std::to_string(id) + "\n";
  t += "format:\n";
  t += "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n";
  t += "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n";
  t += "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n";
  t += "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n";
  for (const Field& f : fields) {
    t += "\tfield:" + Declaration(f) +
         ";\toffset:" + std::to_string(sizeof(TraceEntry) + f.offset) +
         ";\tsize:" + std::to_string(f.size) + ";\tsigned:" + (f.is_signed ? "1" : "0") + ";\n";
  }
  t += "\nprint fmt: ";
  t += print_fmt.empty() ? AutoPrintFmt(fields) : std::string(print_fmt);
  t += "\n";
  return t;
}

// Finds or publishes |r| in |a|'s region; returns the region's id for it.
Result<uint16_t> Tracer::RegisterIn(Attachment* a, const Registration& r) {
  // The fingerprint leaves the id out, so it can be computed before the id
  // is known and used to find the same event registered earlier this boot.
  auto probe = ParseEventFormat(r.system, FormatText(r.name, 0, r.fields, r.print_fmt));
  if (!probe.ok()) return Error{"dwtrace: " + probe.error().message};
  const uint64_t fingerprint = EventFingerprint(*probe);
  GuestRegion& region = a->region;
  if (uint32_t id = region.FindFormatId(region::kFormatDwEvent, a->generation, fingerprint);
      id != 0) {
    return static_cast<uint16_t>(id);
  }
  const uint32_t id = region.NextDwId();
  if (id == 0) return Error{"dwtrace: direct-write event ids exhausted"};
  auto index = region.PublishFormat(region::kFormatDwEvent, a->generation, id, r.system,
                                    FormatText(r.name, id, r.fields, r.print_fmt), fingerprint);
  if (!index.ok()) return index.error();
  return static_cast<uint16_t>(id);
}

Result<uint16_t> Tracer::Register(std::string_view system, std::string_view name,
                                  const std::vector<Field>& fields, std::string_view print_fmt) {
  if (!ValidName(system) || !ValidName(name)) {
    return Error{"dwtrace: invalid event name '" + std::string(system) + ":" + std::string(name) +
                 "'"};
  }
  for (const Field& f : fields) {
    if (!ValidName(f.name) || !ValidType(f.type) || f.size == 0 ||
        uint64_t{f.offset} + f.size > kMaxPayload) {
      return Error{"dwtrace: " + std::string(name) + ": bad field '" + f.name + "'"};
    }
  }
  if (print_fmt.find('\n') != std::string_view::npos)
    return Error{"dwtrace: print fmt has a newline"};
  std::lock_guard<std::mutex> lock(mutex_);
  Attachment* a = current_.load();
  if (!a->region.StillMapped() && !ReopenLocked()) return Error{"dwtrace: the region is gone"};
  a = current_.load();
  Registration r{std::string(system), std::string(name), fields, std::string(print_fmt), 0};
  for (const Field& f : fields) {
    if (uint64_t{f.offset} + f.size > a->max_payload) {
      return Error{"dwtrace: " + std::string(name) + ": field '" + f.name +
                   "' past the largest payload"};
    }
  }
  auto id = RegisterIn(a, r);
  if (!id.ok()) return id.error();
  if (a->id_map == nullptr) {
    r.app_id = *id;  // The first region: its ids are the ones programs hold.
  } else {
    // A later region: keep the region's id when no earlier registration
    // holds it, else the first id nobody holds.
    auto taken = [&](uint32_t app) {
      for (const Registration& old : registrations_) {
        if (old.app_id == app) return true;
      }
      return false;
    };
    uint32_t app = *id;
    for (const Registration& old : registrations_) {
      if (old.system == r.system && old.name == r.name &&
          a->id_map[old.app_id - region::kDwFirstEventId] == *id) {
        return old.app_id;
      }
    }
    if (taken(app)) {
      app = region::kDwFirstEventId;
      while (app < 0x10000 && taken(app)) ++app;
      if (app >= 0x10000) return Error{"dwtrace: direct-write event ids exhausted"};
    }
    r.app_id = static_cast<uint16_t>(app);
    a->id_map[app - region::kDwFirstEventId].store(*id, std::memory_order_release);
  }
  for (const Registration& old : registrations_) {
    if (old.app_id == r.app_id) return r.app_id;
  }
  registrations_.push_back(std::move(r));
  return registrations_.back().app_id;
}

// Maps the region that replaced a vanished one and re-registers every event
// there. Holds |mutex_|.
bool Tracer::ReopenLocked() {
  if (!can_reopen_) return false;
  next_reopen_ns_.store(CoarseNs() + kReopenEveryNs, std::memory_order_relaxed);
  auto fresh = MapRegion(open_path_);
  if (!fresh.ok()) return false;
  Attachment* a = fresh->get();
  a->id_map = std::make_unique<std::atomic<uint16_t>[]>(kIdMapSize);
  for (uint32_t i = 0; i < kIdMapSize; ++i) a->id_map[i].store(0, std::memory_order_relaxed);
  for (const Registration& r : registrations_) {
    auto id = RegisterIn(a, r);
    if (id.ok())
      a->id_map[r.app_id - region::kDwFirstEventId].store(*id, std::memory_order_relaxed);
  }
  attachments_.push_back(std::move(*fresh));
  current_.store(a, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(g_alive_mutex);
    g_alive->erase(serial_.load());
    const uint64_t serial = g_next_serial.fetch_add(1);
    g_alive->insert(serial);
    serial_.store(serial, std::memory_order_release);
  }
  reattaches_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// An event written while the region is gone: count it, and now and then look
// for a new region (threads then rebind on their next write).
bool Tracer::DropDetached() {
  dropped_detached_.fetch_add(1, std::memory_order_relaxed);
  if (!can_reopen_ || CoarseNs() < next_reopen_ns_.load(std::memory_order_relaxed)) return false;
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  if (!current_.load()->region.StillMapped()) ReopenLocked();
  return false;
}

uint64_t Tracer::Now() const {
  if (clock_ == Clock::kTsc) return __rdtsc();
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

bool Tracer::Bind(ThreadState* ts) {
  const uint64_t serial = serial_.load(std::memory_order_acquire);
  Attachment* a = current_.load(std::memory_order_acquire);
  if (ts->serial == serial && ts->retry > 0) {
    --ts->retry;
    __atomic_fetch_add(&a->region.status()->dw_rings_exhausted, 1, __ATOMIC_RELAXED);
    return false;
  }
  {
    // Leaving another tracer: give its ring back if that tracer still lives.
    std::lock_guard<std::mutex> lock(g_alive_mutex);
    if (ts->serial != 0 && ts->serial != serial && g_alive->count(ts->serial) != 0) {
      ts->tracer->Release(ts);
    }
  }
  if (!a->region.StillMapped()) {
    ts->serial = 0;
    return DropDetached();
  }
  GuestRegion& region = a->region;
  ts->serial = serial;
  ts->tracer = this;
  ts->attachment = a;
  ts->id_map = a->id_map.get();
  const auto* header_words = reinterpret_cast<const uint64_t*>(region.base());
  if (region.geometry().region_id != 0) {
    ts->live_word = header_words + offsetof(region::HostHeader, region_id) / 8;
    ts->live_value = region.geometry().region_id;
  } else {
    ts->live_word = header_words;
    ts->live_value = region::kRegionMagicXored[0] ^ region::kRegionMagicXor[0];
  }
  ts->max_payload = a->max_payload;
  ts->desc = nullptr;
  ts->header = nullptr;
  ts->retry = 0;
  ts->tid = static_cast<int32_t>(syscall(SYS_gettid));
  const uint32_t rings = region.geometry().dw_rings;
  const uint64_t token = (uint64_t{a->generation} << 32) | static_cast<uint32_t>(ts->tid);
  // Our own ring first (a thread that bound before and came back), then a
  // free one, starting at a tid-dependent place so threads spread out.
  int64_t found = -1;
  for (uint32_t i = 0; i < rings && found < 0; ++i) {
    if (__atomic_load_n(&region.dw_ring(i)->owner, __ATOMIC_ACQUIRE) != token) continue;
    found = i;
    for (uint32_t s = 0; s < region.geometry().dw_slots; ++s) {
      __atomic_fetch_and(&region.dw_desc(i, s)->flags, ~uint32_t{region::kSlotOpen},
                         __ATOMIC_RELEASE);
    }
  }
  for (uint32_t k = 0; k < rings && found < 0; ++k) {
    const uint32_t i = (static_cast<uint32_t>(ts->tid) + k) % rings;
    uint64_t expected = 0;
    if (__atomic_compare_exchange_n(&region.dw_ring(i)->owner, &expected, token, false,
                                    __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
      found = i;
    }
  }
  if (found < 0) {
    ts->retry = kRetryEvery;
    __atomic_fetch_add(&region.status()->dw_rings_exhausted, 1, __ATOMIC_RELAXED);
    return false;
  }
  ts->ring = static_cast<uint32_t>(found);
  region::DwRingHeader* h = region.dw_ring(ts->ring);
  ts->header = h;
  h->pid = static_cast<uint32_t>(getpid());
  h->tid = static_cast<uint32_t>(ts->tid);
  h->boot_generation = a->generation;
  h->clock = static_cast<uint32_t>(clock_);
  char comm[17] = {};
  prctl(PR_GET_NAME, comm);
  std::memcpy(h->comm, comm, sizeof(h->comm));
  h->claims++;
  return StartPage(ts, Now());
}

bool Tracer::StartPage(ThreadState* ts, uint64_t now) {
  GuestRegion& region = ts->attachment->region;
  region::DwRingHeader* h = ts->header;
  if (ts->desc != nullptr)
    __atomic_fetch_and(&ts->desc->flags, ~uint32_t{region::kSlotOpen}, __ATOMIC_RELEASE);
  // The host may have scribbled |published|; whatever it says, the slot
  // index stays inside the ring.
  const uint64_t sequence = h->published;
  const uint32_t slot = static_cast<uint32_t>(sequence % region.geometry().dw_slots);
  region::SlotDesc* desc = region.dw_desc(ts->ring, slot);
  const uint64_t done = SeqBeginWrite(&desc->seq);
  ts->page = region.dw_page(ts->ring, slot);
  ts->used = 0;
  ts->capacity = region.geometry().slot_size - kDataOffset;
  ts->last_time = now;
  const uint64_t zero = 0;
  std::memcpy(ts->page, &now, 8);       // time_stamp
  std::memcpy(ts->page + 8, &zero, 8);  // commit
  desc->sequence = sequence;
  desc->boot_generation = ts->attachment->generation;
  desc->length = kDataOffset;
  desc->flags = region::kSlotOpen;
  desc->clock = static_cast<uint32_t>(clock_);
  SeqEndWrite(&desc->seq, done);
  __atomic_store_n(&h->published, sequence + 1, __ATOMIC_RELEASE);
  ts->desc = desc;
  return true;
}

void Tracer::Release(ThreadState* ts) {
  if (ts->desc != nullptr) {
    __atomic_fetch_and(&ts->desc->flags, ~uint32_t{region::kSlotOpen}, __ATOMIC_RELEASE);
    __atomic_store_n(&ts->header->owner, uint64_t{0}, __ATOMIC_RELEASE);
  }
  ts->serial = 0;
  ts->desc = nullptr;
  ts->header = nullptr;
}

// Appends a record the fast path does not take: a time gap past 27 bits (a
// TIME_EXTEND first), a payload past 112 bytes (length word), or time that
// went backwards (kept at the page's last time). False when it does not fit.
static bool AppendRecord(Tracer::ThreadState* ts, uint64_t now, const TraceEntry& entry,
                         const void* payload, uint32_t size) {
  if (now < ts->last_time) now = ts->last_time;
  uint64_t delta = now - ts->last_time;
  const uint32_t data = static_cast<uint32_t>(sizeof(TraceEntry)) + size;
  const uint32_t padded = (data + 3) & ~3u;
  const bool big = padded > 4 * kRecordTypeMaxData;
  const uint32_t extend = delta > kTimeDeltaMax ? 8 : 0;  // 59 bits: a TIME_EXTEND is enough.
  const uint32_t record = (big ? 8 : 4) + padded;
  if (uint64_t{ts->used} + extend + record > ts->capacity) return false;
  std::byte* at = ts->page + kDataOffset + ts->used;
  if (extend != 0) {
    const uint32_t words[2] = {
        kRecordTypeTimeExtend | static_cast<uint32_t>((delta & kTimeDeltaMax) << 5),
        static_cast<uint32_t>(delta >> kTimeDeltaBits)};
    std::memcpy(at, words, 8);
    at += 8;
    delta = 0;
  }
  const uint32_t head = static_cast<uint32_t>(delta << 5) | (big ? 0u : padded / 4);
  std::memcpy(at, &head, 4);
  at += 4;
  if (big) {
    const uint32_t length = padded + 4;
    std::memcpy(at, &length, 4);
    at += 4;
  }
  const uint32_t zero = 0;
  std::memcpy(at + padded - 4, &zero, 4);  // Padding bytes stay zero.
  std::memcpy(at, &entry, sizeof(entry));
  std::memcpy(at + sizeof(entry), payload, size);
  ts->used += extend + record;
  ts->last_time = now;
  return true;
}

// The payload copy of Write's fast path (at most 4 * kRecordTypeMaxData
// bytes): two overlapping fixed-size copies inline for the common sizes
// instead of a call to memcpy, which was a tenth of the cost per event.
[[gnu::always_inline]] inline void CopyPayload(std::byte* to, const void* from, uint32_t size) {
  const auto* src = static_cast<const std::byte*>(from);
  if (size >= 16 && size <= 32) {
    std::memcpy(to, src, 16);
    std::memcpy(to + size - 16, src + size - 16, 16);
  } else if (size >= 8 && size < 16) {
    std::memcpy(to, src, 8);
    std::memcpy(to + size - 8, src + size - 8, 8);
  } else if (size != 0) {  // An empty payload may come with a null pointer.
    std::memcpy(to, src, size);
  }
}

bool Tracer::Write(uint16_t id, const void* payload, uint32_t size) {
  ThreadState* ts = tls_;
  if (ts == nullptr || ts->serial != serial_.load(std::memory_order_relaxed) || ts->desc == nullptr)
      [[unlikely]] {
    if (ts == nullptr) {
      t_owner.state = std::make_unique<ThreadState>();
      ts = tls_ = t_owner.state.get();
    }
    if (!Bind(ts)) return false;
  }
  if (!ts->Live()) [[unlikely]]
    return DropDetached();
  if (ts->id_map != nullptr) [[unlikely]] {
    id = id >= region::kDwFirstEventId
             ? ts->id_map[id - region::kDwFirstEventId].load(std::memory_order_relaxed)
             : 0;
    if (id == 0) {
      ts->header->lost_events++;
      return false;
    }
  }
  if (size > ts->max_payload) [[unlikely]] {
    ts->header->lost_events++;
    return false;
  }
  // The TSC read inline (Now() is a call): the fast clock's whole point.
  const uint64_t now = clock_ == Clock::kTsc ? __rdtsc() : Now();
  const TraceEntry entry{id, 0, 0, ts->tid};
  const uint32_t padded = (static_cast<uint32_t>(sizeof(TraceEntry)) + size + 3) & ~3u;
  const uint64_t delta = now - ts->last_time;  // Huge when time went backwards: slow path.
  if (padded <= 4 * kRecordTypeMaxData && delta <= kTimeDeltaMax &&
      ts->used + 4 + padded <= ts->capacity) [[likely]] {
    // The common record, written in place: header word (delta, length in
    // words), trace_entry, payload.
    std::byte* at = ts->page + kDataOffset + ts->used;
    const uint32_t head = static_cast<uint32_t>(delta << 5) | (padded / 4);
    const uint32_t zero = 0;
    std::memcpy(at, &head, 4);
    std::memcpy(at + padded, &zero, 4);  // Last word first: padding stays zero.
    // trace_entry as one little-endian word (the region is little-endian):
    // type, flags = 0, preempt_count = 0, pid.
    const uint64_t entry_word = id | static_cast<uint64_t>(static_cast<uint32_t>(ts->tid)) << 32;
    std::memcpy(at + 4, &entry_word, sizeof(entry_word));
    CopyPayload(at + 4 + sizeof(entry), payload, size);
    ts->used += 4 + padded;
    ts->last_time = now;
  } else if (!AppendRecord(ts, now, entry, payload, size)) [[unlikely]] {
    if (!StartPage(ts, now) || !AppendRecord(ts, now, entry, payload, size)) {
      ts->header->lost_events++;
      return false;
    }
  }
  // The page's own commit (for tools that read the page alone), then the
  // publish point: the host reads this many bytes of the page.
  const uint64_t commit = ts->used;
  std::memcpy(ts->page + 8, &commit, 8);
  __atomic_store_n(&ts->desc->length, kDataOffset + ts->used, __ATOMIC_RELEASE);
  return true;
}

}  // namespace hvtrace::dw

// C API: one process-wide tracer.
namespace {
std::mutex g_c_mutex;
std::atomic<hvtrace::dw::Tracer*> g_c_tracer{nullptr};
}  // namespace

extern "C" int hvt_dw_open(const char* region_path) {
  std::lock_guard<std::mutex> lock(g_c_mutex);
  if (g_c_tracer.load() != nullptr) return 0;
  auto tracer = hvtrace::dw::Tracer::Open(region_path ? region_path : "");
  if (!tracer.ok()) {
    return tracer.error().message.find("not announced") != std::string::npos ? -EAGAIN : -ENODEV;
  }
  g_c_tracer.store(tracer->release(), std::memory_order_release);
  return 0;
}

extern "C" int hvt_dw_register(const char* system, const char* name,
                               const struct hvt_dw_field* fields, unsigned int nfields,
                               const char* print_fmt) {
  hvtrace::dw::Tracer* t = g_c_tracer.load(std::memory_order_acquire);
  if (t == nullptr) return -EBADF;
  if (system == nullptr || name == nullptr || (nfields > 0 && fields == nullptr)) return -EINVAL;
  std::vector<hvtrace::dw::Field> list;
  for (unsigned int i = 0; i < nfields; ++i) {
    if (fields[i].name == nullptr || fields[i].type == nullptr) return -EINVAL;
    list.push_back({fields[i].name, fields[i].type, fields[i].offset, fields[i].size,
                    fields[i].is_signed != 0});
  }
  std::lock_guard<std::mutex> lock(g_c_mutex);
  auto id = t->Register(system, name, list, print_fmt ? print_fmt : "");
  return id.ok() ? *id : -EINVAL;
}

extern "C" int hvt_dw_write(int id, const void* payload, uint32_t size) {
  hvtrace::dw::Tracer* t = g_c_tracer.load(std::memory_order_acquire);
  if (t == nullptr) return -EBADF;
  return t->Write(static_cast<uint16_t>(id), payload, size) ? 0 : -ENOSPC;
}

extern "C" void hvt_dw_close(void) {
  std::lock_guard<std::mutex> lock(g_c_mutex);
  delete g_c_tracer.exchange(nullptr);
}
