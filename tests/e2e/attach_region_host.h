// Host side of attach-mode e2e tests, for tests that run before (or beside)
// hvtraced's own attach: a region file created as hvtraced creates it, read
// with the shared region reader, plus the guest image that carries this
// build's agent, and QMP hot-plug/unplug of an ivshmem-plain device.
#ifndef HVTRACE_TESTS_E2E_ATTACH_REGION_HOST_H_
#define HVTRACE_TESTS_E2E_ATTACH_REGION_HOST_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "guest_harness.h"
#include "hvtrace/region_reader.h"

namespace hvtrace::e2e {

// The guest image of kernel |version| ("6.12", "6.1") with this build's
// hvtrace-agent and hvtrace-guest-test in its initramfs (build-guest.sh is
// cached).
Result<GuestImage> ImageWithThisAgent(const std::string& version = "6.12");

class HostRegion {
 public:
  // Creates |path| (power-of-two |size|), maps it and writes the header and
  // the requests (|events|, pump interval).
  static Result<std::unique_ptr<HostRegion>> Create(const std::string& path, uint64_t size,
                                                    uint32_t max_cpus, uint64_t region_id,
                                                    uint32_t pump_interval_ms,
                                                    const std::string& events);
  ~HostRegion();  // Unmaps and deletes the file.

  const RegionGeometry& geometry() const { return geometry_; }
  const std::string& path() const { return path_; }
  std::byte* live() const { return base_; }
  // Asks the agent for another event set (requests + request_seq bump).
  void SetEvents(const std::string& events);
  // A validated snapshot (copy first, then parse the copy).
  RegionSnapshot Read() const;
  // The raw bytes as they are now.
  std::vector<std::byte> Bytes() const;

 private:
  HostRegion() = default;
  std::string path_;
  std::byte* base_ = nullptr;
  RegionGeometry geometry_;
};

// Every record of |s|: CPU pages (kernel events) and direct-write pages,
// as (payload text, time stamp, ring, direct_write).
struct RegionRecord {
  std::string payload;
  uint64_t ts = 0;
  uint32_t ring = 0;
  bool direct_write = false;
  uint16_t type = 0;
};
std::vector<RegionRecord> AllRecords(const RegionSnapshot& s);
bool AnyRecordContains(const std::vector<RegionRecord>& records, const std::string& needle);

// QMP: object-add memory-backend-file (share=on) + device_add ivshmem-plain.
Status HotplugRegion(hostd::QmpSyncClient& qmp, const std::string& backend_id,
                     const std::string& device_id, const std::string& path, uint64_t size);
// QMP: device_del, wait for DEVICE_DELETED, object-del.
Status UnplugRegion(hostd::QmpSyncClient& qmp, const std::string& backend_id,
                    const std::string& device_id);

// Polls |done| every 100 ms until it is true or |timeout| passes.
bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout);

}  // namespace hvtrace::e2e

#endif  // HVTRACE_TESTS_E2E_ATTACH_REGION_HOST_H_
