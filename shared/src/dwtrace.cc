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

// Events larger than this are dropped; it keeps the payload copy on the stack.
constexpr uint32_t kMaxPayload = 3072;
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
std::unordered_set<uint64_t>* g_alive = new std::unordered_set<uint64_t>;  // Never freed: used at thread exit.
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
    if (c == ';' || c == '\n' || c == '\t' || c == ':' || c == '"' || static_cast<unsigned char>(c) < 0x20) {
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

struct Tracer::ThreadState {
  uint64_t serial = 0;  // Tracer this thread is bound to (0: none).
  Tracer* tracer = nullptr;
  uint32_t ring = 0;
  region::SlotDesc* desc = nullptr;  // Open slot; nullptr: no ring.
  region::DwRingHeader* header = nullptr;
  PageLayout layout = PageLayout::Default();
  PageWriter writer{std::span<std::byte>(), PageLayout::Default(), 0};
  int32_t tid = 0;
  uint32_t retry = 0;

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
}  // namespace

Tracer::Tracer(GuestRegion region, RegionMapping mapping, Clock clock, uint32_t generation)
    : region_(std::move(region)),
      mapping_(std::move(mapping)),
      clock_(clock),
      generation_(generation),
      max_payload_(std::min<uint32_t>(kMaxPayload, region_.geometry().slot_size - 64)),
      serial_(g_next_serial.fetch_add(1)) {
  std::lock_guard<std::mutex> lock(g_alive_mutex);
  g_alive->insert(serial_);
}

Tracer::~Tracer() {
  std::lock_guard<std::mutex> lock(g_alive_mutex);
  g_alive->erase(serial_);
  if (tls_ != nullptr && tls_->serial == serial_) Release(tls_);
}

Result<std::unique_ptr<Tracer>> Tracer::FromMemory(std::byte* base, uint64_t size, Clock clock) {
  auto region = GuestRegion::Attach(base, size);
  if (!region.ok()) return region.error();
  if (region->geometry().dw_rings == 0) return Error{"region has no direct-write rings"};
  const region::GuestIdentity id = region->ReadIdentity();
  if (id.seq == 0 || (id.seq & 1) || id.boot_generation == 0 || id.boot_generation > UINT32_MAX) {
    return Error{"region: the agent has not announced the guest yet"};
  }
  return std::unique_ptr<Tracer>(
      new Tracer(std::move(*region), RegionMapping(), clock, static_cast<uint32_t>(id.boot_generation)));
}

Result<std::unique_ptr<Tracer>> Tracer::Open(const std::string& path_in, Clock clock) {
  std::vector<std::string> candidates;
  if (!path_in.empty()) {
    candidates.push_back(path_in);
  } else if (const char* env = std::getenv("HVTRACE_REGION"); env != nullptr && *env != '\0') {
    candidates.push_back(env);
  } else {
    if (std::string p = ReadFirstToken(kRegionPointerFile); !p.empty()) candidates.push_back(p);
    for (std::string& bar : FindIvshmemBars("/sys/bus/pci/devices")) candidates.push_back(std::move(bar));
  }
  if (candidates.empty()) return Error{"no hvtrace region: no ivshmem device and no " + std::string(kRegionPointerFile)};
  std::string errors;
  for (const std::string& path : candidates) {
    auto mapping = RegionMapping::Map(path);
    if (!mapping.ok()) {
      errors += mapping.error().message + "; ";
      continue;
    }
    auto tracer = FromMemory(mapping->data(), mapping->size(), clock);
    if (!tracer.ok()) {
      errors += path + ": " + tracer.error().message + "; ";
      continue;
    }
    (*tracer)->mapping_ = std::move(*mapping);
    return tracer;
  }
  return Error{errors};
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
    t += "\tfield:" + Declaration(f) + ";\toffset:" + std::to_string(sizeof(TraceEntry) + f.offset) +
         ";\tsize:" + std::to_string(f.size) + ";\tsigned:" + (f.is_signed ? "1" : "0") + ";\n";
  }
  t += "\nprint fmt: ";
  t += print_fmt.empty() ? AutoPrintFmt(fields) : std::string(print_fmt);
  t += "\n";
  return t;
}

Result<uint16_t> Tracer::Register(std::string_view system, std::string_view name,
                                  const std::vector<Field>& fields, std::string_view print_fmt) {
  if (!ValidName(system) || !ValidName(name)) {
    return Error{"dwtrace: invalid event name '" + std::string(system) + ":" + std::string(name) + "'"};
  }
  for (const Field& f : fields) {
    if (!ValidName(f.name) || !ValidType(f.type) || f.size == 0 ||
        uint64_t{f.offset} + f.size > max_payload_) {
      return Error{"dwtrace: " + std::string(name) + ": bad field '" + f.name + "'"};
    }
  }
  if (print_fmt.find('\n') != std::string_view::npos) return Error{"dwtrace: print fmt has a newline"};
  // The fingerprint leaves the id out, so it can be computed before the id
  // is known and used to find the same event registered earlier this boot.
  auto probe = ParseEventFormat(system, FormatText(name, 0, fields, print_fmt));
  if (!probe.ok()) return Error{"dwtrace: " + probe.error().message};
  const uint64_t fingerprint = EventFingerprint(*probe);
  if (uint32_t id = region_.FindFormatId(region::kFormatDwEvent, generation_, fingerprint); id != 0) {
    return static_cast<uint16_t>(id);
  }
  const uint32_t id = region_.NextDwId();
  if (id == 0) return Error{"dwtrace: direct-write event ids exhausted"};
  auto index = region_.PublishFormat(region::kFormatDwEvent, generation_, id, system,
                                     FormatText(name, id, fields, print_fmt), fingerprint);
  if (!index.ok()) return index.error();
  return static_cast<uint16_t>(id);
}

uint64_t Tracer::Now() const {
  if (clock_ == Clock::kTsc) return __rdtsc();
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

bool Tracer::Bind(ThreadState* ts) {
  if (ts->serial == serial_ && ts->retry > 0) {
    --ts->retry;
    __atomic_fetch_add(&region_.status()->dw_rings_exhausted, 1, __ATOMIC_RELAXED);
    return false;
  }
  {
    // Leaving another tracer: give its ring back if that tracer still lives.
    std::lock_guard<std::mutex> lock(g_alive_mutex);
    if (ts->serial != 0 && ts->serial != serial_ && g_alive->count(ts->serial) != 0) {
      ts->tracer->Release(ts);
    }
  }
  ts->serial = serial_;
  ts->tracer = this;
  ts->desc = nullptr;
  ts->header = nullptr;
  ts->retry = 0;
  ts->tid = static_cast<int32_t>(syscall(SYS_gettid));
  ts->layout = PageLayout::Default(region_.geometry().slot_size);
  const uint32_t rings = region_.geometry().dw_rings;
  const uint64_t token = (uint64_t{generation_} << 32) | static_cast<uint32_t>(ts->tid);
  // Our own ring first (a thread that bound before and came back), then a
  // free one, starting at a tid-dependent place so threads spread out.
  int64_t found = -1;
  for (uint32_t i = 0; i < rings && found < 0; ++i) {
    if (__atomic_load_n(&region_.dw_ring(i)->owner, __ATOMIC_ACQUIRE) != token) continue;
    found = i;
    for (uint32_t s = 0; s < region_.geometry().dw_slots; ++s) {
      __atomic_fetch_and(&region_.dw_desc(i, s)->flags, ~uint32_t{region::kSlotOpen}, __ATOMIC_RELEASE);
    }
  }
  for (uint32_t k = 0; k < rings && found < 0; ++k) {
    const uint32_t i = (static_cast<uint32_t>(ts->tid) + k) % rings;
    uint64_t expected = 0;
    if (__atomic_compare_exchange_n(&region_.dw_ring(i)->owner, &expected, token, false,
                                    __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
      found = i;
    }
  }
  if (found < 0) {
    ts->retry = kRetryEvery;
    __atomic_fetch_add(&region_.status()->dw_rings_exhausted, 1, __ATOMIC_RELAXED);
    return false;
  }
  ts->ring = static_cast<uint32_t>(found);
  region::DwRingHeader* h = region_.dw_ring(ts->ring);
  ts->header = h;
  h->pid = static_cast<uint32_t>(getpid());
  h->tid = static_cast<uint32_t>(ts->tid);
  h->boot_generation = generation_;
  h->clock = static_cast<uint32_t>(clock_);
  char comm[17] = {};
  prctl(PR_GET_NAME, comm);
  std::memcpy(h->comm, comm, sizeof(h->comm));
  h->claims++;
  return StartPage(ts, Now());
}

bool Tracer::StartPage(ThreadState* ts, uint64_t now) {
  region::DwRingHeader* h = ts->header;
  if (ts->desc != nullptr) __atomic_fetch_and(&ts->desc->flags, ~uint32_t{region::kSlotOpen}, __ATOMIC_RELEASE);
  const uint64_t sequence = h->published;
  const uint32_t slot = static_cast<uint32_t>(sequence % region_.geometry().dw_slots);
  region::SlotDesc* desc = region_.dw_desc(ts->ring, slot);
  const uint64_t done = SeqBeginWrite(&desc->seq);
  std::span<std::byte> page(region_.dw_page(ts->ring, slot), region_.geometry().slot_size);
  ts->writer = PageWriter(page, ts->layout, now);
  desc->sequence = sequence;
  desc->boot_generation = generation_;
  desc->length = ts->layout.data_offset;
  desc->flags = region::kSlotOpen;
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

bool Tracer::Write(uint16_t id, const void* payload, uint32_t size) {
  ThreadState* ts = tls_;
  if (ts == nullptr || ts->serial != serial_ || ts->desc == nullptr) [[unlikely]] {
    if (ts == nullptr) {
      t_owner.state = std::make_unique<ThreadState>();
      ts = tls_ = t_owner.state.get();
    }
    if (!Bind(ts)) return false;
  }
  if (size > max_payload_) [[unlikely]] {
    ts->header->lost_events++;
    return false;
  }
  const uint64_t now = Now();
  alignas(8) std::byte record[sizeof(TraceEntry) + kMaxPayload];
  const TraceEntry entry{id, 0, 0, ts->tid};
  std::memcpy(record, &entry, sizeof(entry));
  std::memcpy(record + sizeof(entry), payload, size);
  const std::span<const std::byte> bytes(record, sizeof(entry) + size);
  if (!ts->writer.Append(now, bytes)) [[unlikely]] {
    if (!StartPage(ts, now) || !ts->writer.Append(now, bytes)) {
      ts->header->lost_events++;
      return false;
    }
  }
  ts->writer.Finish();
  // The publish point: the host reads this many bytes of the page.
  __atomic_store_n(&ts->desc->length, ts->layout.data_offset + ts->writer.used(), __ATOMIC_RELEASE);
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

extern "C" int hvt_dw_register(const char* system, const char* name, const struct hvt_dw_field* fields,
                               unsigned int nfields, const char* print_fmt) {
  hvtrace::dw::Tracer* t = g_c_tracer.load(std::memory_order_acquire);
  if (t == nullptr) return -EBADF;
  if (system == nullptr || name == nullptr || (nfields > 0 && fields == nullptr)) return -EINVAL;
  std::vector<hvtrace::dw::Field> list;
  for (unsigned int i = 0; i < nfields; ++i) {
    if (fields[i].name == nullptr || fields[i].type == nullptr) return -EINVAL;
    list.push_back({fields[i].name, fields[i].type, fields[i].offset, fields[i].size, fields[i].is_signed != 0});
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
