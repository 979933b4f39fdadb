// Guest side of the hvtrace region (ABI in hvtrace/region.h): finding and
// mapping the ivshmem BAR, and the writes hvtrace-agent and direct-write
// programs make into it (identity, status, clock sync, format table, pages),
// each with the publish protocol region.h describes.
//
// The guest trusts the host's geometry only after checking it against the
// size of its own mapping (GeometryFromHeader), so a broken header cannot
// make the guest write outside the BAR.
#ifndef HVTRACE_REGION_WRITER_H_
#define HVTRACE_REGION_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/region.h"
#include "hvtrace/region_reader.h"
#include "hvtrace/region_text.h"
#include "hvtrace/result.h"

namespace hvtrace {

// PCI id of ivshmem devices.
inline constexpr uint16_t kIvshmemVendor = 0x1af4;
inline constexpr uint16_t kIvshmemDevice = 0x1110;
// Where hvtrace-agent tells direct-write programs which BAR to map: one line,
// the path of the resource2 file, then the region id in hex.
inline constexpr char kRegionPointerFile[] = "/run/hvtrace/region";

// resource2 paths of every ivshmem device under |sysfs_pci_devices|
// (normally /sys/bus/pci/devices), sorted. Devices whose BAR is not assigned
// yet have no resource2 and are left out.
std::vector<std::string> FindIvshmemBars(const std::string& sysfs_pci_devices);

// A MAP_SHARED mapping of a region file (resource2, or a host file in tests).
// While it is mapped it is guarded (GuardRegionMapping): if the device goes
// away, touching it no longer kills the process.
class RegionMapping {
 public:
  RegionMapping() = default;
  ~RegionMapping();
  RegionMapping(RegionMapping&& other) noexcept;
  RegionMapping& operator=(RegionMapping&& other) noexcept;

  // Maps all of |path| read-write. Fails with the path and errno text.
  static Result<RegionMapping> Map(const std::string& path);

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  void Unmap();

 private:
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
  std::string path_;
};

// Survival of a hot-unplug. When the ivshmem device is removed, the kernel
// zaps every mapping of its resource2 before it sends the remove uevent, and
// the next access raises SIGBUS; a process in the middle of a write has no
// way to see it coming. A guarded range is replaced, on such a fault, with
// anonymous zero pages at the same address, so the access completes (reads
// return 0, writes go nowhere) and the process lives on to notice that the
// region is gone (GuestRegion::StillMapped). SIGBUS outside every guarded
// range goes to the handler installed before ours (or the default action).
// The handler is installed on the first call. Thread-safe; up to 64 ranges.
void GuardRegionMapping(std::byte* base, uint64_t size);
void UnguardRegionMapping(std::byte* base);
// Faults the guard absorbed in this process.
uint64_t RegionBusFaults();

// Typed, protocol-keeping access to a mapped region from the guest.
class GuestRegion {
 public:
  // Checks the magic, version and geometry against |size|.
  static Result<GuestRegion> Attach(std::byte* base, uint64_t size);

  const RegionGeometry& geometry() const { return geometry_; }
  std::byte* base() const { return base_; }

  // Whether the mapping still shows the region it was attached to: false once
  // the device is gone (the guard's zero pages) or another region took its
  // place. Cheap enough for a hot path: one load of a line the host wrote
  // once (the magic catches zero pages when the host chose region id 0).
  bool StillMapped() const {
    return __atomic_load_n(live_region_id(), __ATOMIC_RELAXED) == geometry_.region_id &&
           __atomic_load_n(At<const uint64_t>(0), __ATOMIC_RELAXED) ==
               (region::kRegionMagicXored[0] ^ region::kRegionMagicXor[0]);
  }
  const uint64_t* live_region_id() const {
    return At<const uint64_t>(offsetof(region::HostHeader, region_id));
  }

  // A consistent copy of the host's requests (retries while the host writes).
  region::HostRequests ReadRequests() const;

  region::GuestIdentity ReadIdentity() const;
  // Seqlocked rewrite of the whole identity (|identity.seq| is ignored).
  void WriteIdentity(const region::GuestIdentity& identity);

  // Status is informational; the agent is its only writer.
  region::GuestStatus* status() const;
  // Appends a clock-sync sample (seqlocked) and bumps the status count.
  void AddClockSync(uint64_t mono_ns, uint64_t boottime_ns, uint64_t realtime_ns, uint64_t tsc);

  // Appends a format (entry + text). |text| is the format file's text;
  // |system| goes in front of it. Claims space with fetch-adds, so several
  // writers may publish at once. Fails (and counts |dropped|) when full.
  Result<uint32_t> PublishFormat(region::FormatKind kind, uint32_t generation, uint32_t id,
                                 std::string_view system, std::string_view text,
                                 uint64_t fingerprint);
  // Id of a published format of |kind| in |generation| with |fingerprint|,
  // or 0 when none.
  uint32_t FindFormatId(region::FormatKind kind, uint32_t generation, uint64_t fingerprint) const;
  // Whether a format of |kind| with |id| and |fingerprint| is published for
  // |generation| (an agent restarted in the same boot does not republish).
  bool HasFormat(region::FormatKind kind, uint32_t generation, uint32_t id,
                 uint64_t fingerprint) const;
  // Replaces the symbol or comm area with |text| (EncodeText), seqlocked.
  // Fails when the host gave no such area or the text does not fit it.
  Status WriteTextArea(TextAreaKind kind, uint32_t generation, const EncodedText& text);
  // A copy of the area's header (zeros when there is no area).
  region::TextAreaHeader TextArea(TextAreaKind kind) const;

  // Hands out the next direct-write event id, 0 when exhausted.
  uint32_t NextDwId();

  // CPU rings: copies |page| (a whole sub-buffer as trace_pipe_raw returned
  // it, <= slot_size bytes) into the next slot of |cpu| and publishes it.
  void PushCpuPage(uint32_t cpu, uint32_t generation, std::span<const std::byte> page,
                   uint32_t flags);
  region::CpuRingHeader* cpu_ring(uint32_t cpu) const;

  region::DwRingHeader* dw_ring(uint32_t ring) const;
  region::SlotDesc* dw_desc(uint32_t ring, uint32_t slot) const;
  std::byte* dw_page(uint32_t ring, uint32_t slot) const;
  region::FormatTableHeader* format_table() const;

 private:
  GuestRegion(std::byte* base, const RegionGeometry& geometry) : base_(base), geometry_(geometry) {}
  template <typename T>
  T* At(uint64_t offset) const {
    return reinterpret_cast<T*>(base_ + offset);
  }

  std::byte* base_ = nullptr;
  RegionGeometry geometry_;
};

// Seqlock helpers on shared memory (the protocol of region.h). BeginWrite
// makes |*seq| odd and returns the even value EndWrite will store.
uint64_t SeqBeginWrite(uint64_t* seq);
void SeqEndWrite(uint64_t* seq, uint64_t value);

}  // namespace hvtrace

#endif  // HVTRACE_REGION_WRITER_H_
