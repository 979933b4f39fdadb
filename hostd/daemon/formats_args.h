// The formats cache in hvtraced: the control commands formats-list and
// formats-harvest (handlers: Daemon::HandleFormatsList/HandleFormatsHarvest
// in formats_commands.cc) and their arguments.
//
// There is one formats cache, the daemon's (formats_service.h): the CLI's
// `hvtrace formats list|harvest` send these commands when a daemon answers,
// so what a user harvests is what the daemon decodes with.
//
//   formats-list {}                                            observer
//     Reply: {cache, harvest_initrd, kernels [{key, release, kernel, events,
//     harvested_utc, state}], harvests [{key, state}], problems [text]};
//     |harvests| are this daemon run's harvests that are queued, running or
//     failed (state "queued", "harvesting", "harvest failed: why").
//   formats-harvest {kernel, kernel_fd, timeout_ms? = 180000}  admin
//     The kernel comes as a descriptor the client opened with its own rights
//     (fd_passing.h); |kernel| is its path, for messages and the entry's
//     manifest only. The daemon copies the file into a directory only it may
//     enter (client_files.h), hashes the copy and harvests it with its own
//     harvest initramfs into its own cache (queued behind any other
//     harvest). Stream items {"progress": line}; the final line {key, path,
//     cache_hit, seconds, manifest, cache}. |initrd| is refused: what the
//     harvest guest reports becomes the formats of every VM with that kernel,
//     so only the daemon's harvest_initrd boots (formats_service.h).
#ifndef HVTRACE_HOSTD_FORMATS_ARGS_H_
#define HVTRACE_HOSTD_FORMATS_ARGS_H_

#include <chrono>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

struct FormatsHarvestArgs {
  std::string kernel;  // The client's path, for messages.
  std::chrono::milliseconds timeout{180000};
};
Result<FormatsHarvestArgs> ParseFormatsHarvestArgs(const nlohmann::json& args);

// Client harvests queued or running at once; more are refused as busy (each
// holds a private copy of a kernel of up to kMaxKernelBytes).
inline constexpr int kMaxClientHarvests = 4;
// Bounds of timeout_ms (how long the harvest guest may take to boot).
inline constexpr std::chrono::milliseconds kMinHarvestTimeout{1000};
inline constexpr std::chrono::milliseconds kMaxHarvestTimeout{3600000};
// Longest kernel path a request may name (PATH_MAX).
inline constexpr size_t kMaxKernelPathBytes = 4096;

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_FORMATS_ARGS_H_
