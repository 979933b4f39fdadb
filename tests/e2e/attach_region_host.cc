#include "attach_region_host.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <thread>

#include "hvtrace/page.h"

namespace hvtrace::e2e {

using SteadyClock = std::chrono::steady_clock;

Result<GuestImage> ImageWithThisAgent(const std::string& version) {
  const std::string out = std::string(HVTRACE_BIN_DIR) + "/../guest-attach";
  // The test tools (dw-write, scribble) come along when they are built.
  const std::string guest_test = std::string(HVTRACE_BIN_DIR) + "/hvtrace-guest-test";
  const std::string cmd =
      std::string(HVTRACE_SOURCE_DIR) + "/qemu-scripts/build-guest.sh --kernel " + version +
      " --out " + out + " --agent " + HVTRACE_BIN_DIR + "/hvtrace-agent" +
      (access(guest_test.c_str(), X_OK) == 0 ? " --guest-test " + guest_test : "") + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return Error{"cannot run build-guest.sh"};
  std::string all;
  char line[4096];
  GuestImage image;
  const std::string want = "GUEST " + version + " KERNEL=%1023s INITRD=%1023s RELEASE=%255s";
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    all += line;
    char kernel[1024], initrd[1024], release[256];
    if (std::sscanf(line, want.c_str(), kernel, initrd, release) == 3)
      image = {kernel, initrd, release};
  }
  if (pclose(p) != 0 || image.kernel.empty()) return Error{"build-guest.sh failed:\n" + all};
  return image;
}

Result<std::unique_ptr<HostRegion>> HostRegion::Create(const std::string& path, uint64_t size,
                                                       uint32_t max_cpus, uint64_t region_id,
                                                       uint32_t pump_interval_ms,
                                                       const std::string& events) {
  RegionPlanOptions opt;
  opt.max_cpus = max_cpus;
  opt.region_id = region_id;
  auto geometry = PlanRegion(size, opt);
  if (!geometry.ok()) return geometry.error();
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Error{"create " + path + ": " + std::strerror(errno)};
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    unlink(path.c_str());
    return Error{"ftruncate " + path};
  }
  void* map = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    unlink(path.c_str());
    return Error{"mmap " + path};
  }
  std::unique_ptr<HostRegion> r(new HostRegion());
  r->path_ = path;
  r->base_ = static_cast<std::byte*>(map);
  r->geometry_ = *geometry;
  if (Status s = InitRegionHeader({r->base_, size}, *geometry, 1); !s.ok()) return s.error();
  auto* req = reinterpret_cast<region::HostRequests*>(r->base_ + region::kHostRequestsOffset);
  req->pump_interval_ms = pump_interval_ms;
  const size_t n = std::min(events.size(), sizeof(req->events));
  std::memcpy(req->events, events.data(), n);
  req->events_len = static_cast<uint32_t>(n);
  __atomic_store_n(&req->request_seq, req->request_seq + 1, __ATOMIC_RELEASE);
  return r;
}

HostRegion::~HostRegion() {
  if (base_ != nullptr) munmap(base_, geometry_.region_size);
  unlink(path_.c_str());
}

void HostRegion::SetEvents(const std::string& events) {
  auto* req = reinterpret_cast<region::HostRequests*>(base_ + region::kHostRequestsOffset);
  std::memset(req->events, 0, sizeof(req->events));
  const size_t n = std::min(events.size(), sizeof(req->events));
  std::memcpy(req->events, events.data(), n);
  req->events_len = static_cast<uint32_t>(n);
  __atomic_store_n(&req->request_seq, req->request_seq + 1, __ATOMIC_RELEASE);
}

RegionSnapshot HostRegion::Read() const {
  std::vector<std::byte> copy;
  CopyLiveRegion(base_, geometry_, &copy);
  auto s = ReadRegion(std::move(copy), geometry_);
  return s.ok() ? std::move(*s) : RegionSnapshot{};
}

std::vector<std::byte> HostRegion::Bytes() const {
  return std::vector<std::byte>(base_, base_ + geometry_.region_size);
}

std::vector<RegionRecord> AllRecords(const RegionSnapshot& s) {
  std::vector<RegionRecord> out;
  auto walk = [&](const std::vector<RegionRing>& rings, const PageLayout& layout, bool dw) {
    for (const RegionRing& ring : rings) {
      for (const RegionPage& page : ring.pages) {
        PageStats stats;
        WalkPage(page.page, layout, &stats, [&](const RawRecord& r) {
          RegionRecord rec;
          rec.payload.assign(reinterpret_cast<const char*>(r.payload.data()), r.payload.size());
          rec.ts = r.timestamp;
          rec.ring = ring.index;
          rec.direct_write = dw;
          if (r.payload.size() >= 2) std::memcpy(&rec.type, r.payload.data(), 2);
          out.push_back(std::move(rec));
        });
      }
    }
  };
  walk(s.cpus, s.cpu_layout, false);
  walk(s.dw_rings, s.dw_layout, true);
  return out;
}

bool AnyRecordContains(const std::vector<RegionRecord>& records, const std::string& needle) {
  for (const RegionRecord& r : records) {
    if (r.payload.find(needle) != std::string::npos) return true;
  }
  return false;
}

Status HotplugRegion(hostd::QmpSyncClient& qmp, const std::string& backend_id,
                     const std::string& device_id, const std::string& path, uint64_t size) {
  auto added = qmp.Execute("object-add", {{"qom-type", "memory-backend-file"},
                                          {"id", backend_id},
                                          {"mem-path", path},
                                          {"size", size},
                                          {"share", true}});
  if (!added.ok()) return Error{"object-add " + backend_id + ": " + added.error().message};
  auto plugged = qmp.Execute(
      "device_add", {{"driver", "ivshmem-plain"}, {"memdev", backend_id}, {"id", device_id}});
  if (!plugged.ok()) return Error{"device_add " + device_id + ": " + plugged.error().message};
  return Status();
}

Status UnplugRegion(hostd::QmpSyncClient& qmp, const std::string& backend_id,
                    const std::string& device_id) {
  auto del = qmp.Execute("device_del", {{"id", device_id}});
  if (!del.ok()) return Error{"device_del " + device_id + ": " + del.error().message};
  const auto deadline = SteadyClock::now() + std::chrono::seconds(60);
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
    if (left.count() <= 0) return Error{"no DEVICE_DELETED for " + device_id + " within 60 s"};
    auto ev = qmp.WaitForEvent("DEVICE_DELETED", left);
    if (!ev.ok())
      return Error{"waiting for DEVICE_DELETED of " + device_id + ": " + ev.error().message};
    if (ev->data.value("device", std::string()) == device_id) break;
  }
  auto obj = qmp.Execute("object-del", {{"id", backend_id}});
  if (!obj.ok()) return Error{"object-del " + backend_id + ": " + obj.error().message};
  return Status();
}

bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto deadline = SteadyClock::now() + timeout;
  while (true) {
    if (done()) return true;
    if (SteadyClock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace hvtrace::e2e
