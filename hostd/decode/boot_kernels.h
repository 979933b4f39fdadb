// Which kernel build wrote each boot of a boot-range capture, and whether its
// formats fit the records that boot left.
//
// Event ids are handed out at boot: a kexec into another build (or the same
// build with modules loaded in another order) can give an id to another
// event. So each boot of the range is decoded with its own kernel's formats:
//
//  1. Identification. Without an agent the host still has the VM's serial
//     console (<vm dir>/console.log, hvtraced writes it for the VMs it
//     boots): every boot, a kexec'd one too, prints "Linux version ..." at
//     time 0, and that line is the kernel's /proc/version. The range's
//     newest boot is the one that died, so range boot i of B pairs with the
//     (B - i)-th banner from the end. The formats cache entry whose harvested
//     /proc/version equals that banner is the candidate. The console is
//     guest-written: a banner is evidence to check, not proof.
//  2. The check (a fingerprint check of the data): every record of the boot
//     must fit its id's format in the candidate: the id exists and parsed,
//     the record holds every fixed field, is no longer than the event's
//     struct when the event has no dynamic part, and each __data_loc /
//     __rel_loc points inside the record. One misfit fails the candidate.
//  3. Whatever decodes a boot (identified, the metadata channel's, the kernel
//     file's harvest), the same check runs; with formats that are not proven
//     for the boot, ids whose records do not fit are dropped from the boot's
//     formats, so those records count as unknown ids and stay raw in
//     region.bin, never decoded with a wrong layout.
//
// extra.boots[n].decoded_with records the kernel, how it was identified and
// the check's result; EventsAcrossBoots (event_id_table.h) compares the boots'
// formats by fingerprint.
#ifndef HVTRACE_HOSTD_BOOT_KERNELS_H_
#define HVTRACE_HOSTD_BOOT_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "capture_pipeline.h"
#include "formats_service.h"
#include "hvtrace/boot_map.h"

namespace hvtrace::hostd {

// The "Linux version ..." lines the kernel prints at time 0 ("[    0.000000]
// Linux version 6.12.95+deb12-amd64 (...) #1 SMP ..."), in order, without
// the time prefix and line end. Lines that do not carry a time-0 stamp are
// not banners (a user can echo the text later). At most |max_banners|
// newest ones are kept.
std::vector<std::string> ConsoleBanners(std::string_view console_text, size_t max_banners = 64);

// <vm dir>/console.log for the VM whose metadata directory is |meta_dir|
// (<vm dir>/meta); empty for an empty |meta_dir|.
std::filesystem::path ConsoleLogOfMetaDir(const std::filesystem::path& meta_dir);

// The banners of |console_log| and its rotated predecessors (.1 is older),
// reading at most the last 32 MiB of each. Missing files give no banners.
std::vector<std::string> ReadConsoleBanners(const std::filesystem::path& console_log);

// The result of fitting one boot's records to a set of formats.
struct FormatsFit {
  uint64_t records = 0;
  uint64_t misfit_records = 0;
  // id -> why its records do not fit (the first reason seen) and how many.
  struct Misfit {
    std::string reason;
    uint64_t records = 0;     // Records that do not fit.
    uint64_t id_records = 0;  // Every record with this id (some may fit by chance).
  };
  std::map<uint32_t, Misfit> misfits;
  size_t ids = 0;  // Distinct ids seen.
  bool ok() const { return misfit_records == 0; }
  // Records of the ids that do not fit: what dropping those ids leaves raw.
  uint64_t misfit_id_records() const;
  nlohmann::json ToJson() const;  // Compact: counts, the first misfits.
};

// Fits |records| (one boot's, any CPU) to |formats|.
FormatsFit FitRecords(std::span<const BootMapRecord* const> records, const KernelFormats& formats);

// Per-boot formats for a boot-range decode: wraps what the caller would use
// (|inner|: the metadata channel's or the kernel file's) with identification
// by console banner and the fit check. Keeps the formats it made alive for
// the build.
class BootKernels {
 public:
  // |copy| is the range copy (read here for the records of each boot, with
  // |options|' CPU count and sub-buffer size, as the decode reads it);
  // |layout| (may be null: 6.12's default) gives the page layout and stands
  // for a fallback without formats (as in the build); |service| the formats
  // cache (may be null: no identification); |banners| from the VM's console.
  BootKernels(std::span<const std::byte> copy, const KernelFormats* layout, FormatsService* service,
              std::vector<std::string> banners, const BootMapCaptureOptions& options = {});

  // Puts the map read here, and how, into |options| (null map when the read
  // failed): the decode then need not read the range again.
  void LendMap(BootMapCaptureOptions& options) const;

  // What stands for a fallback without formats (the build's formats).
  void set_default(const KernelFormats* formats) { layout_ = formats; }

  // The formats of boot |boot| of |nboots|: identified and fitting when the
  // evidence allows, else |fallback| (what the caller chose) checked, with
  // ids that do not fit dropped unless |fallback| is proven for the boot
  // (the agent's metadata for this very boot: own_symbols and from "meta
  // channel"; the channel's "nearest boot" stand-in is not proven).
  BootFormats For(uint32_t boot, uint32_t nboots, BootFormats fallback);

  // The formats each boot got (after For), for the id table; null entries
  // for boots not asked.
  const std::vector<const KernelFormats*>& chosen() const { return chosen_; }

  // Puts each boot's source (what For returned) as decoded_with into
  // |boots| (manifest extra.boots) beside what is there (the KASLR record),
  // unless the build already recorded the formats' source (the metadata
  // channel's boots).
  void AnnotateBoots(nlohmann::json& boots) const;

  // The newest boot's identified formats (for the page layout when the VM's
  // kernel file is not cached), or null.
  const KernelFormats* NewestIdentified();

  // Summary for extra.formats.identify.
  nlohmann::json Summary() const;

 private:
  struct Candidate {
    std::string key;
    std::shared_ptr<const KernelFormats> formats;
  };
  std::optional<Candidate> CandidateFor(const std::string& banner);
  std::span<const BootMapRecord* const> RecordsOf(uint32_t boot) const;
  const KernelFormats* WithoutIds(const KernelFormats& formats, const FormatsFit& fit);

  const KernelFormats* layout_;
  FormatsService* service_;
  std::vector<std::string> banners_;
  std::string map_error_;
  BootMapOptions map_options_;
  BootMap map_;
  std::vector<std::vector<const BootMapRecord*>> by_boot_;
  std::vector<const KernelFormats*> chosen_;
  std::vector<nlohmann::json> sources_;
  std::deque<std::unique_ptr<KernelFormats>> owned_;
  std::map<std::string, std::optional<Candidate>> candidates_;  // banner -> entry
  nlohmann::json cache_problems_ = nlohmann::json::array();
  double read_ms_ = 0, lookup_ms_ = 0, check_ms_ = 0;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_BOOT_KERNELS_H_
