// What hvtraced keeps of the metadata a VM's agent sends over the metadata
// channel (hvtrace/meta_channel.h): the checks a boot bundle must pass, and
// the per-VM, per-boot store the boot-range decode reads.
//
//   <vm dir>/meta/boots.json                 index, boots in arrival order
//   <vm dir>/meta/<boot_id>/formats/<key>/   the bundle (FormatCache layout,
//                                            key = SHA-256 of the archive)
//   <vm dir>/meta/<boot_id>/identity.json    what the agent claimed, as checked
//   <vm dir>/meta/<boot_id>/fingerprints     the newest bundle's, as checked
//   <vm dir>/meta/<boot_id>/comms            the newest kComms text
//   <vm dir>/meta/<boot_id>/clock.json       the newest kClock samples
//
// Everything on the channel is hostile: a bundle is refused whole when any
// check fails (ValidateMetaBoot says which, naming the event or member; a
// format with no fingerprint line is the one exception: set aside, unverified,
// since an older agent could not parse it), and
// it is stored under its VM's own directory only, so a VM's metadata never
// decodes another VM's capture. Files appear whole (temp, fsync, rename).
// Only the newest |keep| boots stay; bundles are loaded from disk when a
// capture needs them, never all held in memory.
#ifndef HVTRACE_HOSTD_META_STORE_H_
#define HVTRACE_HOSTD_META_STORE_H_

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats_bundle.h"
#include "formats_cache.h"
#include "hvtrace/meta_channel.h"
#include "hvtrace/result.h"

namespace hvtrace::hostd {

inline constexpr size_t kMaxMetaKallsyms = 32u << 20;
inline constexpr size_t kMaxMetaIdentity = 64u << 10;
inline constexpr size_t kMaxMetaFingerprints = 4u << 20;
inline constexpr size_t kMetaBootsKept = 8;

// A kBoot bundle that passed every check.
struct MetaBoot {
  std::string boot_id;  // Text form, "xxxxxxxx-xxxx-…".
  std::string release;
  std::string proc_version;
  std::string build_id;  // Lowercase hex.
  std::string agent_version;
  uint32_t nr_cpus = 0;
  uint32_t page_size = 0;
  std::string key;       // SHA-256 of the archive: its FormatCache key.
  std::string identity;  // identity.json as sent.
  HarvestBundle bundle;
  std::string fingerprints;  // The fingerprints member, as checked.
  size_t fingerprints_checked = 0;
};

// Checks a kBoot payload sent with |frame_boot_id|: a harvest archive
// (ParseHarvestArchive) plus identity.json and fingerprints; identity's
// boot_id equals the frame's, its release the archive's, its build_id is
// 16..64 bytes of hex; every event our parser reads has exactly one
// fingerprints line whose id and fingerprint (hvtrace/fingerprint.h) match
// its format, and no line names anything else; kallsyms is at most
// kMaxMetaKallsyms with nonzero addresses; no format contradicts another.
// The error says which check failed ("fingerprint of sched/sched_switch does
// not match its format").
Result<MetaBoot> ValidateMetaBoot(const meta::BootId& frame_boot_id, std::string_view archive);

// The GNU build id (lowercase hex) in |notes|, a run of ELF notes as the
// kernel's .notes section holds them (read from guest memory at
// __start_notes), or an error when none is found in it.
Result<std::string> FindGnuBuildId(std::span<const std::byte> notes);

// One boot in the index.
struct MetaBootEntry {
  std::string boot_id;
  std::string release;
  std::string build_id;
  std::string key;
  std::string received_utc;
  int64_t received_ns = 0;  // Host realtime; 0 in indexes written before it was kept.
  nlohmann::json verified = nlohmann::json::object();  // How far it was checked.
  // 1 for the boot's first bundle, +1 for each newer one the agent sent
  // (the set of events changed, meta_sender.h); |updated_utc| is when the
  // newest came and |changes| what it changed (meta_bundle_diff.h).
  uint32_t revision = 1;
  std::string updated_utc;
  nlohmann::json changes;
};

class MetaStore {
 public:
  // |dir| is <vm dir>/meta (MetaDirOfVm).
  explicit MetaStore(std::filesystem::path dir, size_t keep = kMetaBootsKept)
      : dir_(std::move(dir)), keep_(keep) {}
  const std::filesystem::path& dir() const { return dir_; }

  // The boots, oldest first; none when nothing was ever stored.
  Result<std::vector<MetaBootEntry>> List() const;
  // Whether |boot_id| is stored with bundle |key| (a resend after a reconnect).
  bool Has(std::string_view boot_id, std::string_view key) const;
  // Whether |boot_id| is stored (with any bundle).
  bool HasBoot(std::string_view boot_id) const;
  // Stores |boot| as the newest boot and drops the oldest beyond |keep|. A
  // newer bundle of a boot already stored replaces its bundle in place (the
  // boot keeps its place and first arrival time; its revision goes up and
  // the index records what changed): the boot's captures from then on
  // decode all its events with the newest bundle. Captures already written
  // keep what they were decoded with.
  Status StoreBoot(const MetaBoot& boot, const nlohmann::json& verified, int64_t received_ns);
  // kComms / kClock of a stored boot (refused for an unknown boot).
  Status StoreComms(std::string_view boot_id, std::string_view text);
  Status StoreClock(std::string_view boot_id, std::string_view text);

  Result<KernelFormats> LoadFormats(const MetaBootEntry& entry) const;
  // The boot's comms text ("" when none arrived).
  Result<std::string> LoadComms(const MetaBootEntry& entry) const;

 private:
  Status WriteIndex(const std::vector<MetaBootEntry>& boots) const;
  Status StoreExtra(std::string_view boot_id, const char* name, std::string_view text);

  std::filesystem::path dir_;
  size_t keep_;
};

inline std::filesystem::path MetaDirOfVm(const std::filesystem::path& vm_dir) {
  return vm_dir / "meta";
}

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_META_STORE_H_
