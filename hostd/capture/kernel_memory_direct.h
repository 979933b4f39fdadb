// The guest kernel's virtual memory read through guest RAM mapped from
// QEMU (guest_ram.h), without QEMU's help: what the kernel log step reads
// at a panic (kernel_log_step.h). x86_64 only, as the rest of the step.
//
// Two translations cover what that step reads: the kernel image (its
// symbols, the static printk ring) and the direct map (VMCOREINFO's page,
// a ring allocated for log_buf_len=). They are found in the guest's own
// memory:
//   - the image's physical place: KASLR puts it at a CONFIG_PHYSICAL_ALIGN
//     (2 MiB) step of RAM; the step where the kallsyms' `linux_banner`
//     offset holds /proc/version's text is it. One match or none: a second
//     (another copy of the same kernel, left by kexec) is refused.
//   - the direct map's base: the image's `page_offset_base` (randomized),
//     or the 4-level default when the kernel has no such symbol;
//   - the KASLR offset against the kallsyms (which hold the addresses of
//     the boot they were read in, not the link-time ones): VMCOREINFO's
//     SYMBOL(_stext) less the kallsyms' `_stext`.
// Anything else (vmalloc, a translation that lands outside RAM) goes to the
// fallback reader (QMP memsave through the vCPU's page tables). Every value
// read is the guest's, checked before use.
#ifndef HVTRACE_HOSTD_CAPTURE_KERNEL_MEMORY_DIRECT_H_
#define HVTRACE_HOSTD_CAPTURE_KERNEL_MEMORY_DIRECT_H_

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "guest_ram.h"
#include "hvtrace/printk_ring.h"
#include "hvtrace/result.h"
#include "kernel_symbols.h"

namespace hvtrace::hostd {

struct DirectKernelMemory {
  GuestMemoryRead read;  // Kernel virtual address -> bytes.
  int64_t kaslr_delta = 0;
  nlohmann::json info;  // What was found, for the manifest.
};

// Finds the image and the direct map in |ram| for the kernel whose
// /proc/version is |proc_version|; |fallback| reads what they do not cover
// (may be null). An error says which step failed.
Result<DirectKernelMemory> MapKernelMemory(std::shared_ptr<const GuestRam> ram,
                                           const KernelLogSymbols& symbols,
                                           std::string_view proc_version, GuestMemoryRead fallback);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CAPTURE_KERNEL_MEMORY_DIRECT_H_
