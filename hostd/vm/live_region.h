// An attach-mode region file on the host (ABI: hvtrace/region.h), created and
// mapped by hvtraced, shared by every reader of one VM's region: the capture,
// `hvtrace stream`, status.
//
// The mapping stays valid as long as the LiveRegion lives, also after the
// device was unplugged, QEMU quit or the file was unlinked: captures after a
// detach or a crash still read it. Everything read through it is a private
// copy (Copy, Guest, or an IncrementalRegionReader over data()); the guest
// may write the mapping at any time.
//
// The geometry is the one hostd planned for the file it created. A region
// opened by path (OpenExisting, e.g. after a daemon restart) takes it from
// the file's header and checks it against the file's size.
#ifndef HVTRACE_HOSTD_LIVE_REGION_H_
#define HVTRACE_HOSTD_LIVE_REGION_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "attach_reply.h"
#include "hvtrace/region_incremental.h"
#include "hvtrace/region_reader.h"
#include "hvtrace/result.h"

namespace hvtrace::hostd {

struct LiveRegionOptions {
  std::filesystem::path path;         // <run_dir>/mem/ or (libvirt) /dev/shm/hvtrace-<vm>-attach.
  uint64_t size_bytes = 16ull << 20;  // A power of two (QEMU aborts otherwise).
  uint32_t max_cpus = 1;              // CPU rings: the guest's vCPUs.
  std::string events;                 // HostRequests::events ("" = the agent's default).
  uint32_t pump_interval_ms = 50;
  std::optional<uid_t> owner_uid;  // chown the file (a QEMU running as another user).
  std::optional<gid_t> owner_gid;
  // QEMU runs as another user but the daemon keeps the file: the file's
  // group becomes |qemu_group| with mode 0660, so QEMU opens it by name.
  std::optional<gid_t> qemu_group;
  // Replace a stale file the daemon or QEMU (|owner_uid|) owns; anything
  // else at the path is always refused.
  bool replace_existing = false;
};

// Checks |size_bytes| for a region QEMU can map: a power of two within the
// ABI's limits. The message says why QEMU needs it.
Status CheckRegionSize(uint64_t size_bytes);

// The guest agent's announcement as attach replies and `status` show it.
AgentAnnouncement AnnouncementOf(const RegionGuestInfo& guest);

class LiveRegion {
 public:
  // Creates the file, sizes it, maps it and writes the host header and the
  // initial requests. The file is left in place when the LiveRegion goes.
  static Result<std::shared_ptr<LiveRegion>> Create(const LiveRegionOptions& options);
  // Maps an existing region file; the geometry comes from its header,
  // validated against the file's size.
  static Result<std::shared_ptr<LiveRegion>> OpenExisting(const std::filesystem::path& path);

  ~LiveRegion();
  LiveRegion(const LiveRegion&) = delete;
  LiveRegion& operator=(const LiveRegion&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const RegionGeometry& geometry() const { return geometry_; }
  uint64_t size() const { return geometry_.region_size; }
  // The shared mapping. Never parse it in place: copy first.
  const std::byte* data() const { return data_; }

  // A reader for whoever polls the region (`hvtrace stream`): each Read
  // copies and validates only what changed since its last one.
  Result<std::unique_ptr<IncrementalRegionReader>> NewReader() const {
    return IncrementalRegionReader::Create(geometry_);
  }
  // |reader|'s Refresh from the mapping, under the bus guard: an error if
  // the file shrank (the reader is then spent).
  Status Refresh(IncrementalRegionReader& reader) const;
  // The guest's announcement, from a copy of the control area alone
  // (status, the attach wait); not present if the file shrank.
  RegionGuestInfo Guest() const;
  // The whole region copied (CopyLiveRegion), for the raw region.bin of a
  // capture; an error if the file shrank under the copy (bus_guard.h).
  Result<std::vector<std::byte>> Copy() const;
  // The same into |out|, which keeps its allocation when large enough.
  Status CopyInto(std::vector<std::byte>& out) const;

  // Host → guest requests (HostRequests, bumping request_seq); dropped if
  // the file shrank (the guest cannot see them then either).
  void SetEvents(const std::string& events);
  void SetPumpInterval(uint32_t ms);
  // Asks the agent for an immediate push of every CPU.
  void RequestSnapshot();

  // Set by the backend once the device is unplugged: readers (stream) stop
  // expecting new data; captures still read the mapping.
  void MarkDetached() { detached_.store(true); }
  bool detached() const { return detached_.load(); }

 private:
  LiveRegion(std::filesystem::path path, int fd, std::byte* data, RegionGeometry geometry);
  void BumpRequest();

  std::filesystem::path path_;
  int fd_ = -1;
  std::byte* data_ = nullptr;
  RegionGeometry geometry_;
  std::mutex requests_mu_;  // One host writer of HostRequests at a time.
  std::atomic<bool> detached_{false};
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_LIVE_REGION_H_
