#include "live_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "bus_guard.h"
#include "hvtrace/region.h"

namespace hvtrace::hostd {
namespace {

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

uint64_t RandomRegionId() {
  uint64_t id = 0;
  while (id == 0) {
    if (::getrandom(&id, sizeof id, 0) != sizeof id) {
      id = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    }
  }
  return id;
}

uint64_t RealtimeNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

region::HostRequests* Requests(std::byte* data) {
  return reinterpret_cast<region::HostRequests*>(data + region::kHostRequestsOffset);
}

Status CheckReplaceable(const LiveRegionOptions& options, const std::string& where) {
  struct stat st {};
  if (::lstat(options.path.c_str(), &st) != 0) {
    if (errno == ENOENT) return {};
    return Error{Errno("cannot stat " + where)};
  }
  const bool ours =
      st.st_uid == ::geteuid() || (options.owner_uid && st.st_uid == *options.owner_uid);
  if (S_ISREG(st.st_mode) && ours) return {};
  const std::string kind = S_ISLNK(st.st_mode)   ? "a symlink"
                           : S_ISREG(st.st_mode) ? "a file"
                           : S_ISDIR(st.st_mode) ? "a directory"
                                                 : "not a regular file";
  return Error{where + " already exists and is not this daemon's: " + kind + " owned by uid " +
               std::to_string(st.st_uid) +
               " (not the daemon's or QEMU's user); refusing to use or replace it. Remove it "
               "after checking who made it"};
}

}  // namespace

Status CheckRegionSize(uint64_t size_bytes) {
  const bool power_of_two = size_bytes != 0 && (size_bytes & (size_bytes - 1)) == 0;
  if (!power_of_two) {
    return Error{"region size " + std::to_string(size_bytes) +
                 " bytes is not a power of two: QEMU's ivshmem aborts on such a BAR "
                 "(use 1M, 2M, 4M, 8M, 16M, ...)"};
  }
  if (size_bytes < region::kMinRegionSize || size_bytes > region::kMaxRegionSize) {
    return Error{"region size " + std::to_string(size_bytes) + " bytes is outside " +
                 std::to_string(region::kMinRegionSize >> 20) + " MiB .. " +
                 std::to_string(region::kMaxRegionSize >> 30) + " GiB"};
  }
  return {};
}

LiveRegion::LiveRegion(std::filesystem::path path, int fd, std::byte* data, RegionGeometry geometry)
    : path_(std::move(path)), fd_(fd), data_(data), geometry_(geometry) {}

LiveRegion::~LiveRegion() {
  if (data_ != nullptr) ::munmap(data_, geometry_.region_size);
  if (fd_ >= 0) ::close(fd_);
}

Result<std::shared_ptr<LiveRegion>> LiveRegion::Create(const LiveRegionOptions& options) {
  const std::string where = "region " + options.path.string();
  if (Status s = CheckRegionSize(options.size_bytes); !s.ok())
    return Error{where + ": " + s.error().message};
  RegionPlanOptions plan;
  plan.max_cpus = std::max<uint32_t>(1, options.max_cpus);
  plan.region_id = RandomRegionId();
  auto geometry = PlanRegion(options.size_bytes, plan);
  if (!geometry.ok()) return Error{where + ": " + geometry.error().message};
  if (options.events.size() > region::kEventsTextSize) {
    return Error{where + ": the event list is " + std::to_string(options.events.size()) +
                 " bytes; the region holds at most " + std::to_string(region::kEventsTextSize)};
  }

  if (options.replace_existing) {
    // A new region must start zeroed: a stale file's guest data would be
    // mistaken for this guest's. Only a file this daemon or the VM's QEMU
    // owns is stale; anything else (a local user's file or symlink planted
    // in /dev/shm under the name) is refused, never reused or followed.
    if (Status s = CheckReplaceable(options, where); !s.ok()) return s.error();
    if (::unlink(options.path.c_str()) != 0 && errno != ENOENT)
      return Error{Errno("cannot replace " + where)};
  }
  // O_EXCL: if someone recreated the name since, this fails instead of
  // opening their file.
  const int fd =
      ::open(options.path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    if (errno == EEXIST) {
      return Error{where + " already exists (left by an earlier attach?); remove it or replace it"};
    }
    return Error{Errno("cannot create " + where)};
  }
  auto fail = [&](const std::string& message) -> Error {
    ::close(fd);
    ::unlink(options.path.c_str());
    return Error{message};
  };
  if (::ftruncate(fd, static_cast<off_t>(options.size_bytes)) != 0)
    return fail(Errno("cannot size " + where));
  if (options.owner_uid || options.owner_gid) {
    const uid_t uid = options.owner_uid.value_or(static_cast<uid_t>(-1));
    const gid_t gid = options.owner_gid.value_or(static_cast<gid_t>(-1));
    if (::fchown(fd, uid, gid) != 0) return fail(Errno("cannot chown " + where));
    // Guest memory: QEMU's user only (chown may have kept other bits).
    if (::fchmod(fd, 0600) != 0) return fail(Errno("cannot chmod " + where));
  } else if (options.qemu_group) {
    // The daemon stays the owner (CheckReplaceable and a restarted daemon
    // see its file); QEMU's group gets read and write, nobody else anything.
    if (::fchown(fd, static_cast<uid_t>(-1), *options.qemu_group) != 0)
      return fail(Errno("cannot give " + where + " to QEMU's group " +
                        std::to_string(*options.qemu_group)));
    if (::fchmod(fd, 0660) != 0) return fail(Errno("cannot chmod " + where));
  }
  void* map = ::mmap(nullptr, options.size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return fail(Errno("cannot map " + where));
  auto* data = static_cast<std::byte*>(map);
  if (Status s = InitRegionHeader({data, options.size_bytes}, *geometry, RealtimeNs()); !s.ok()) {
    ::munmap(map, options.size_bytes);
    return fail(where + ": " + s.error().message);
  }
  std::shared_ptr<LiveRegion> region(new LiveRegion(options.path, fd, data, *geometry));
  region::HostRequests* r = Requests(data);
  r->pump_interval_ms = options.pump_interval_ms;
  std::memcpy(r->events, options.events.data(), options.events.size());
  r->events_len = static_cast<uint32_t>(options.events.size());
  // Everything above is in place before the guest can see the device.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return region;
}

Result<std::shared_ptr<LiveRegion>> LiveRegion::OpenExisting(const std::filesystem::path& path) {
  const std::string where = "region " + path.string();
  // O_NONBLOCK: a FIFO planted under the name must not block the worker.
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return Error{Errno("cannot open " + where)};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return Error{Errno("cannot stat " + where)};
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Error{where + " is not a regular file"};
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (Status s = CheckRegionSize(size); !s.ok()) {
    ::close(fd);
    return Error{where + ": " + s.error().message};
  }
  void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    ::close(fd);
    return Error{Errno("cannot map " + where)};
  }
  std::vector<std::byte> header(sizeof(region::HostHeader));
  std::memcpy(header.data(), map, header.size());
  auto geometry = GeometryFromHeader(header, size);
  if (!geometry.ok()) {
    ::munmap(map, size);
    ::close(fd);
    return Error{where + ": " + geometry.error().message};
  }
  return std::shared_ptr<LiveRegion>(
      new LiveRegion(path, fd, static_cast<std::byte*>(map), *geometry));
}

Result<std::vector<std::byte>> LiveRegion::Copy() const {
  std::vector<std::byte> copy;
  if (Status s = CopyInto(copy); !s.ok()) return s.error();
  return copy;
}

Status LiveRegion::CopyInto(std::vector<std::byte>& out) const {
  // Sized first: nothing allocates while the mapping is read.
  out.resize(geometry_.region_size);
  const bool copied = RunBusGuarded([&] { CopyLiveRegion(data_, geometry_, &out); });
  if (!copied) return Error{"region " + path_.string() + " shrank while it was being copied"};
  return {};
}

Status LiveRegion::Refresh(IncrementalRegionReader& reader) const {
  if (!RunBusGuarded([&] { reader.Refresh(data_); })) {
    return Error{"region " + path_.string() + " shrank while it was being read"};
  }
  return {};
}

RegionGuestInfo LiveRegion::Guest() const {
  std::array<std::byte, region::kControlAreaSize> control{};
  if (!RunBusGuarded([&] { CopyLiveControl(data_, control.data()); })) return {};
  return GuestFromControl(control, geometry_);
}

void LiveRegion::BumpRequest() {
  // The agent re-reads the requests whenever request_seq moves (region.h).
  auto* seq = &Requests(data_)->request_seq;
  __atomic_store_n(seq, __atomic_load_n(seq, __ATOMIC_RELAXED) + 1, __ATOMIC_RELEASE);
}

// The lock is taken outside the guard: an abandoned write still unlocks.
void LiveRegion::SetEvents(const std::string& events) {
  std::lock_guard lock(requests_mu_);
  RunBusGuarded([&] {
    region::HostRequests* r = Requests(data_);
    const size_t n = std::min<size_t>(events.size(), region::kEventsTextSize);
    std::memcpy(r->events, events.data(), n);
    std::memset(r->events + n, 0, region::kEventsTextSize - n);
    __atomic_store_n(&r->events_len, static_cast<uint32_t>(n), __ATOMIC_RELAXED);
    BumpRequest();
  });
}

void LiveRegion::SetPumpInterval(uint32_t ms) {
  std::lock_guard lock(requests_mu_);
  RunBusGuarded([&] {
    __atomic_store_n(&Requests(data_)->pump_interval_ms, ms, __ATOMIC_RELAXED);
    BumpRequest();
  });
}

void LiveRegion::RequestSnapshot() {
  std::lock_guard lock(requests_mu_);
  RunBusGuarded([&] {
    auto* seq = &Requests(data_)->snapshot_seq;
    __atomic_store_n(seq, __atomic_load_n(seq, __ATOMIC_RELAXED) + 1, __ATOMIC_RELEASE);
  });
}

AgentAnnouncement AnnouncementOf(const RegionGuestInfo& g) {
  static const char* const kClocks[] = {"unknown", "local", "mono", "x86-tsc", "boot", "global"};
  AgentAnnouncement a;
  a.boot_id = g.boot_id;
  a.boot_generation = g.boot_generation;
  a.kernel_release = g.kernel_release;
  a.nr_cpus = g.nr_cpus;
  a.agent_pid = g.agent_pid;
  a.trace_clock = g.trace_clock < 6 ? kClocks[g.trace_clock] : "unknown";
  a.page_size = g.page_size;
  a.state = g.status.state;
  return a;
}

}  // namespace hvtrace::hostd
