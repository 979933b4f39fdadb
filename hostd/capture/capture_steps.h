// The steps of a capture (capture_service.h), each one function over a
// PendingCapture and its manifest, shared by a live capture and by recovery.
// Internal to the capture layer.
#ifndef HVTRACE_HOSTD_CAPTURE_STEPS_H_
#define HVTRACE_HOSTD_CAPTURE_STEPS_H_

#include <cstddef>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "capture_pipeline.h"
#include "capture_service.h"
#include "capture_store.h"
#include "formats_service.h"
#include "hvtrace/kernel_log.h"
#include "hvtrace/region_reader.h"
#include "hvtrace/result.h"
#include "live_region.h"
#include "page_buffer.h"

namespace hvtrace::hostd {

inline constexpr const char* kRegionFileName = "region.bin";
inline constexpr const char* kAttachRegionFileName = "attach-region.bin";

// Step 1: |source| → |copy| and region.bin, durable on return, with the
// recovery record staged beside it (PendingCapture::PublishRecoveryRecord
// puts it in place). Fills manifest.region (or, when an attach region was
// described first, moves that to region.attach), kernel.path/formats_key
// and extra.timing_ms.
Status CopyRegionFileStep(const RegionFileSource& source, PageBuffer& copy, PendingCapture& pending,
                          CaptureManifest& manifest);

// Step 2: a private copy of |region| into |copy| (a pooled buffer: no
// allocation when it is large enough) and attach-region.bin, durable on
// return. Describes the region in the manifest (with its geometry, which
// recovery needs) as region, or region.attach beside a region file.
Status CopyAttachStep(const LiveRegion& region, std::vector<std::byte>& copy,
                      PendingCapture& pending, CaptureManifest& manifest);

// Step 3 for a region file copy: decodes a boot range with the VM's
// metadata-channel boots in |meta_dir| and |formats| (or counts it), nothing
// for a raw shmem region. Never fails: problems are in the manifest.
// |ring_log|: the newest boot's kernel log when the capture recovered one
// from guest memory (it then gives that boot's kernel.log and the crash
// summary instead of the console events); may be null. |newest_kaslr|:
// told the newest boot's KASLR offset mid-decode (capture_pipeline.h); may be
// empty.
void DecodeRegionFileStep(std::span<const std::byte> copy, FormatsService* formats,
                          const std::filesystem::path& meta_dir, PendingCapture& pending,
                          CaptureManifest& manifest, const KernelLog* ring_log = nullptr,
                          const KaslrHook& newest_kaslr = {});

// Step 3 for an attach copy; |copy| is handed back (BuildRegionCapture).
Status DecodeAttachStep(std::vector<std::byte>& copy, const RegionGeometry& geometry,
                        bool vcpus_stopped, PendingCapture& pending, CaptureManifest& manifest);

// Step 3 for every copy a capture holds, the same for the live capture and
// for a later run recovering one (capture_recovery.cc): the region file copy
// (a boot range decoded, and the boot timeline when the capture holds QEMU's
// trace log), then the attach copy, then the consistency summary
// (extra.consistency). An empty |region_copy| / null |attach_copy|: the
// capture has none. Fails only as DecodeAttachStep does. |ring_log| and
// |newest_kaslr| as for DecodeRegionFileStep.
Status DecodeCopiesStep(std::span<const std::byte> region_copy, std::vector<std::byte>* attach_copy,
                        const RegionGeometry& geometry, bool vcpus_stopped, FormatsService* formats,
                        const std::filesystem::path& meta_dir, PendingCapture& pending,
                        CaptureManifest& manifest, const KernelLog* ring_log = nullptr,
                        const KaslrHook& newest_kaslr = {});

// The attach region's description in |manifest| (region or region.attach);
// null when the capture has none.
const nlohmann::json* AttachRegionJson(const CaptureManifest& manifest);

// RegionGeometry in the manifest and back (checked: ValidateGeometry).
nlohmann::json GeometryToJson(const RegionGeometry& geometry);
Result<RegionGeometry> GeometryFromJson(const nlohmann::json& j);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CAPTURE_STEPS_H_
