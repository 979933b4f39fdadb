// Guest-side region access: mapping and the publish protocol (region.h).
#include "hvtrace/region_writer.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>

namespace hvtrace {
namespace {

using region::ClockSync;
using region::CpuRingHeader;
using region::FormatEntry;
using region::FormatTableHeader;
using region::GuestIdentity;
using region::HostRequests;
using region::SlotDesc;

template <typename T>
T LoadAcquire(const T* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
template <typename T>
void StoreRelease(T* p, T v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

// Reads a sysfs hex attribute such as "0x1af4\n".
bool ReadHex(const std::string& path, unsigned long* out) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text)) return false;
  char* end = nullptr;
  errno = 0;
  *out = std::strtoul(text.c_str(), &end, 16);
  return errno == 0 && end != text.c_str();
}

// The SIGBUS guard's table. Lock-free for the handler: a range is live while
// its |base| is non-zero; |size| is stored before |base| is published.
constexpr int kMaxGuarded = 64;
struct GuardedRange {
  std::atomic<uintptr_t> base{0};
  std::atomic<uint64_t> size{0};
};
GuardedRange g_guarded[kMaxGuarded];
std::atomic<uint64_t> g_bus_faults{0};
std::mutex g_guard_mutex;
bool g_guard_installed = false;
struct sigaction g_previous_bus;

void OnBus(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (GuardedRange& r : g_guarded) {
    const uintptr_t base = r.base.load(std::memory_order_acquire);
    const uint64_t size = r.size.load(std::memory_order_relaxed);
    if (base == 0 || addr < base || addr - base >= size) continue;
    // The device is gone: put zero pages where it was, so the faulting
    // access (and every later one) completes. mmap is a plain system call.
    if (mmap(reinterpret_cast<void*>(base), size, PROT_READ | PROT_WRITE,
             MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) != MAP_FAILED) {
      g_bus_faults.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    break;
  }
  // Not ours: what would have happened without us.
  if ((g_previous_bus.sa_flags & SA_SIGINFO) != 0 && g_previous_bus.sa_sigaction != nullptr) {
    g_previous_bus.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous_bus.sa_handler != SIG_DFL && g_previous_bus.sa_handler != SIG_IGN) {
    g_previous_bus.sa_handler(sig);
    return;
  }
  signal(SIGBUS, SIG_DFL);  // Returning re-runs the access, which now kills us.
}

}  // namespace

void GuardRegionMapping(std::byte* base, uint64_t size) {
  std::lock_guard<std::mutex> lock(g_guard_mutex);
  if (!g_guard_installed) {
    struct sigaction sa {};
    sa.sa_sigaction = OnBus;
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &g_previous_bus) != 0) return;
    g_guard_installed = true;
  }
  for (GuardedRange& r : g_guarded) {
    if (r.base.load(std::memory_order_relaxed) != 0) continue;
    r.size.store(size, std::memory_order_relaxed);
    r.base.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
    return;
  }
}

void UnguardRegionMapping(std::byte* base) {
  std::lock_guard<std::mutex> lock(g_guard_mutex);
  for (GuardedRange& r : g_guarded) {
    if (r.base.load(std::memory_order_relaxed) == reinterpret_cast<uintptr_t>(base)) {
      r.base.store(0, std::memory_order_release);
    }
  }
}

uint64_t RegionBusFaults() { return g_bus_faults.load(std::memory_order_relaxed); }

uint64_t SeqBeginWrite(uint64_t* seq) {
  const uint64_t old = LoadAcquire(seq);
  const uint64_t odd = (old & 1) ? old + 2 : old + 1;  // A crashed writer may have left it odd.
  __atomic_store_n(seq, odd, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  return odd + 1;
}

void SeqEndWrite(uint64_t* seq, uint64_t value) { StoreRelease(seq, value); }

std::vector<std::string> FindIvshmemBars(const std::string& sysfs_pci_devices) {
  std::vector<std::string> bars;
  DIR* dir = opendir(sysfs_pci_devices.c_str());
  if (dir == nullptr) return bars;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const std::string dev = sysfs_pci_devices + "/" + entry->d_name;
    unsigned long vendor = 0, device = 0;
    if (!ReadHex(dev + "/vendor", &vendor) || !ReadHex(dev + "/device", &device)) continue;
    if (vendor != kIvshmemVendor || device != kIvshmemDevice) continue;
    const std::string bar = dev + "/resource2";
    if (access(bar.c_str(), F_OK) == 0) bars.push_back(bar);
  }
  closedir(dir);
  std::sort(bars.begin(), bars.end());
  return bars;
}

RegionMapping::~RegionMapping() { Unmap(); }

RegionMapping::RegionMapping(RegionMapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      path_(std::move(other.path_)) {}

RegionMapping& RegionMapping::operator=(RegionMapping&& other) noexcept {
  if (this != &other) {
    Unmap();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
  }
  return *this;
}

void RegionMapping::Unmap() {
  if (data_ != nullptr) {
    UnguardRegionMapping(data_);
    munmap(data_, size_);
  }
  data_ = nullptr;
  size_ = 0;
}

Result<RegionMapping> RegionMapping::Map(const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Error{"open " + path + ": " + std::strerror(errno)};
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0) {
    const int err = errno;
    close(fd);
    return Error{"stat " + path + ": " + (err ? std::strerror(err) : "empty file")};
  }
  void* p =
      mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) return Error{"mmap " + path + ": " + std::strerror(err)};
  GuardRegionMapping(static_cast<std::byte*>(p), static_cast<uint64_t>(st.st_size));
  RegionMapping m;
  m.data_ = static_cast<std::byte*>(p);
  m.size_ = static_cast<uint64_t>(st.st_size);
  m.path_ = path;
  return m;
}

Result<GuestRegion> GuestRegion::Attach(std::byte* base, uint64_t size) {
  if (base == nullptr || size < region::kControlAreaSize) {
    return Error{"region: mapping of " + std::to_string(size) + " bytes is too small"};
  }
  // Copy the header first: the host may still be writing it.
  std::vector<std::byte> header(sizeof(region::HostHeader));
  std::memcpy(header.data(), base, header.size());
  auto geometry = GeometryFromHeader(header, size);
  if (!geometry.ok()) return geometry.error();
  return GuestRegion(base, *geometry);
}

HostRequests GuestRegion::ReadRequests() const {
  const auto* live = At<const HostRequests>(region::kHostRequestsOffset);
  HostRequests copy{};
  for (int attempt = 0; attempt < 100; ++attempt) {
    const uint64_t before = LoadAcquire(&live->request_seq);
    std::memcpy(&copy, live, sizeof(copy));
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (LoadAcquire(&live->request_seq) == before) break;
  }
  copy.events_len = std::min<uint32_t>(copy.events_len, region::kEventsTextSize);
  return copy;
}

GuestIdentity GuestRegion::ReadIdentity() const {
  GuestIdentity copy;
  std::memcpy(&copy, At<const GuestIdentity>(region::kGuestIdentityOffset), sizeof(copy));
  return copy;
}

void GuestRegion::WriteIdentity(const GuestIdentity& identity) {
  auto* live = At<GuestIdentity>(region::kGuestIdentityOffset);
  const uint64_t done = SeqBeginWrite(&live->seq);
  std::memcpy(reinterpret_cast<std::byte*>(live) + sizeof(uint64_t),
              reinterpret_cast<const std::byte*>(&identity) + sizeof(uint64_t),
              sizeof(GuestIdentity) - sizeof(uint64_t));
  SeqEndWrite(&live->seq, done);
}

Status GuestRegion::WriteTextArea(TextAreaKind kind, uint32_t generation, const EncodedText& text) {
  const bool symbols = kind == TextAreaKind::kSymbols;
  const uint64_t offset = symbols ? geometry_.symbol_offset : geometry_.comm_offset;
  const uint64_t size = symbols ? geometry_.symbol_size : geometry_.comm_size;
  const char* name = symbols ? "symbol area" : "comm area";
  if (size == 0) return Error{std::string("the host gave this region no ") + name};
  if (text.stored.size() > size - sizeof(region::TextAreaHeader)) {
    return Error{std::to_string(text.stored.size()) + " compressed bytes do not fit the " +
                 std::to_string(size - sizeof(region::TextAreaHeader)) + "-byte " + name};
  }
  auto* h = At<region::TextAreaHeader>(offset);
  const uint64_t done = SeqBeginWrite(&h->seq);
  std::memcpy(base_ + offset + sizeof(region::TextAreaHeader), text.stored.data(),
              text.stored.size());
  h->boot_generation = generation;
  h->encoding = region::kTextZlib;
  h->raw_size = text.raw_size;
  h->stored_size = static_cast<uint32_t>(text.stored.size());
  h->crc32 = text.crc32;
  h->lines = text.lines;
  SeqEndWrite(&h->seq, done);
  return Status();
}

region::TextAreaHeader GuestRegion::TextArea(TextAreaKind kind) const {
  region::TextAreaHeader h{};
  const bool symbols = kind == TextAreaKind::kSymbols;
  if ((symbols ? geometry_.symbol_size : geometry_.comm_size) == 0) return h;
  std::memcpy(&h, base_ + (symbols ? geometry_.symbol_offset : geometry_.comm_offset), sizeof(h));
  return h;
}

region::GuestStatus* GuestRegion::status() const {
  return At<region::GuestStatus>(region::kGuestStatusOffset);
}

void GuestRegion::AddClockSync(uint64_t mono_ns, uint64_t boottime_ns, uint64_t realtime_ns,
                               uint64_t tsc) {
  region::GuestStatus* st = status();
  const uint32_t n = st->clock_sync_count;
  auto* c =
      At<ClockSync>(region::kClockSyncOffset + (n % region::kClockSyncCount) * sizeof(ClockSync));
  // Samples are ordered by seq, so each new one must get a larger even seq
  // than any before: derive it from the running count.
  const uint64_t odd = 2ull * n + 1;
  __atomic_store_n(&c->seq, odd, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  c->mono_ns = mono_ns;
  c->boottime_ns = boottime_ns;
  c->realtime_ns = realtime_ns;
  c->tsc = tsc;
  StoreRelease(&c->seq, odd + 1);
  st->clock_sync_count = n + 1;
}

FormatTableHeader* GuestRegion::format_table() const {
  return At<FormatTableHeader>(geometry_.format_offset);
}

Result<uint32_t> GuestRegion::PublishFormat(region::FormatKind kind, uint32_t generation,
                                            uint32_t id, std::string_view system,
                                            std::string_view text, uint64_t fingerprint) {
  FormatTableHeader* table = format_table();
  if (system.empty() || system.size() > 0xffff) return Error{"format: bad system name"};
  const uint64_t len = system.size() + text.size();
  if (len > geometry_.format_text_size) {
    __atomic_fetch_add(&table->dropped, 1, __ATOMIC_RELAXED);
    return Error{"format " + std::string(system) + ": " + std::to_string(len) +
                 " bytes do not fit"};
  }
  const uint32_t text_at =
      __atomic_fetch_add(&table->text_used, static_cast<uint32_t>(len), __ATOMIC_RELAXED);
  if (uint64_t{text_at} + len > geometry_.format_text_size) {
    __atomic_fetch_add(&table->dropped, 1, __ATOMIC_RELAXED);
    return Error{"format table text area full (" + std::to_string(geometry_.format_text_size) +
                 " bytes)"};
  }
  const uint32_t index = __atomic_fetch_add(&table->entry_count, 1, __ATOMIC_RELAXED);
  if (index >= geometry_.format_entries) {
    __atomic_fetch_add(&table->dropped, 1, __ATOMIC_RELAXED);
    return Error{"format table full (" + std::to_string(geometry_.format_entries) + " entries)"};
  }
  char* dst = reinterpret_cast<char*>(base_ + geometry_.FormatTextOffset() + text_at);
  std::memcpy(dst, system.data(), system.size());
  std::memcpy(dst + system.size(), text.data(), text.size());
  auto* e = At<FormatEntry>(geometry_.FormatEntryOffset(index));
  __atomic_store_n(&e->seq, 1u, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  e->boot_generation = generation;
  e->id = id;
  e->kind = kind;
  e->system_len = static_cast<uint16_t>(system.size());
  e->fingerprint = fingerprint;
  e->text_offset = text_at;
  e->text_len = static_cast<uint32_t>(len);
  StoreRelease(&e->seq, 2u);
  return index;
}

uint32_t GuestRegion::FindFormatId(region::FormatKind kind, uint32_t generation,
                                   uint64_t fingerprint) const {
  const FormatTableHeader* table = format_table();
  const uint32_t count = std::min(LoadAcquire(&table->entry_count), geometry_.format_entries);
  for (uint32_t i = 0; i < count; ++i) {
    const auto* e = At<const FormatEntry>(geometry_.FormatEntryOffset(i));
    if (LoadAcquire(&e->seq) == 2 && e->kind == kind && e->boot_generation == generation &&
        e->fingerprint == fingerprint) {
      return e->id;
    }
  }
  return 0;
}

bool GuestRegion::HasFormat(region::FormatKind kind, uint32_t generation, uint32_t id,
                            uint64_t fingerprint) const {
  const FormatTableHeader* table = format_table();
  const uint32_t count = std::min(LoadAcquire(&table->entry_count), geometry_.format_entries);
  for (uint32_t i = 0; i < count; ++i) {
    const auto* e = At<const FormatEntry>(geometry_.FormatEntryOffset(i));
    if (LoadAcquire(&e->seq) == 2 && e->kind == kind && e->boot_generation == generation &&
        e->id == id && e->fingerprint == fingerprint) {
      return true;
    }
  }
  return false;
}

uint32_t GuestRegion::NextDwId() {
  const uint32_t n = __atomic_fetch_add(&format_table()->next_dw_id, 1, __ATOMIC_RELAXED);
  if (n > 0xffff - region::kDwFirstEventId) return 0;
  return region::kDwFirstEventId + n;
}

CpuRingHeader* GuestRegion::cpu_ring(uint32_t cpu) const {
  return At<CpuRingHeader>(geometry_.CpuRingOffset(cpu));
}
region::DwRingHeader* GuestRegion::dw_ring(uint32_t ring) const {
  return At<region::DwRingHeader>(geometry_.DwRingOffset(ring));
}
SlotDesc* GuestRegion::dw_desc(uint32_t ring, uint32_t slot) const {
  return At<SlotDesc>(geometry_.DwDescOffset(ring, slot));
}
std::byte* GuestRegion::dw_page(uint32_t ring, uint32_t slot) const {
  return base_ + geometry_.DwPageOffset(ring, slot);
}

void GuestRegion::PushCpuPage(uint32_t cpu, uint32_t generation, std::span<const std::byte> page,
                              uint32_t flags) {
  if (cpu >= geometry_.max_cpus || page.empty() || page.size() > geometry_.slot_size) return;
  CpuRingHeader* ring = cpu_ring(cpu);
  const uint64_t sequence = ring->published;
  const uint32_t slot = static_cast<uint32_t>(sequence % geometry_.slots_per_cpu);
  auto* desc = At<SlotDesc>(geometry_.CpuDescOffset(cpu, slot));
  const uint64_t done = SeqBeginWrite(&desc->seq);
  std::memcpy(base_ + geometry_.CpuPageOffset(cpu, slot), page.data(), page.size());
  desc->sequence = sequence;
  desc->boot_generation = generation;
  desc->length = static_cast<uint32_t>(page.size());
  desc->flags = flags;
  SeqEndWrite(&desc->seq, done);
  StoreRelease(&ring->published, sequence + 1);
}

}  // namespace hvtrace
