// One boot's KASLR offset, established from what that boot's own events say.
//
// The harvested kallsyms and printk_formats were read from a boot of the
// kernel at some KASLR offset; a captured boot ran at its own. The 6.12
// meta's text_addr does not say which: it belongs to the boot that
// INITIALISED the buffer (later boots that append keep it, and a 6.12.95
// reset leaves the wiped boot's value), so after a kexec it names the wrong
// boot. Instead each boot's delta to the harvest is found from evidence in
// its records:
//   - function-pointer fields (timer:hrtimer_expire_entry.function, ...)
//     must land exactly on a function start of the harvest;
//   - ftrace:print ip inside tracing_mark_write (a trace_marker write), and
//     any print/bprint/bputs ip inside the kernel text;
//   - ftrace:bprint fmt exactly on a printk_formats address.
// x86_64 KASLR moves the kernel by multiples of CONFIG_PHYSICAL_ALIGN, so
// the candidates are few (see kaslr_evidence.cc for how one is accepted).
// Every value is hostile: it only ever scores a candidate; module and other
// non-image addresses are left out (they neither prove nor veto).
#ifndef HVTRACE_HOSTD_CAPTURE_KASLR_EVIDENCE_H_
#define HVTRACE_HOSTD_CAPTURE_KASLR_EVIDENCE_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "formats_cache.h"
#include "hvtrace/boot_map.h"

namespace hvtrace::hostd {

struct KaslrVerdict {
  // Print names: the boot's trace.dat gets the harvest's kallsyms (and
  // printk_formats) moved by |delta|. False: no kallsyms, raw addresses.
  bool use_symbols = false;
  int64_t delta = 0;
  // For the manifest (extra.boots[n].decoded_with.kaslr): {delta, source,
  // evidence: {kind: distinct values}, distinct, runner_up, meta_text_addr}
  // or {raw: true, why, ...}.
  nlohmann::json manifest;
};

// What the range itself says of a boot's kernel text address, as a delta to
// the harvest's kallsyms.
struct TextAddrDelta {
  int64_t delta = 0;
  // "meta_text_addr" (6.12: the meta's text_addr belongs to the boot that
  // initialised the buffer, any boot) or "scratch_text_addr" (6.15+: the
  // scratch area's _text, written by the boot that last wrote the range).
  const char* kind = "meta_text_addr";
  // The address is this boot's own: enough alone when no value of the boot
  // contradicts it.
  bool this_boots = false;
};

// The delta the range implies for boot |boot|: 6.12, text_addr - the
// harvest's rb_meta_init_text_addr (kaslr_addr - (_text - __START_KERNEL) for
// the 48-byte meta); 6.15+, the scratch area's _text - the harvest's _text,
// for the newest boot only. nullopt without a valid meta or the symbol.
std::optional<TextAddrDelta> MetaTextDelta(const BootMap& map, const ImageSymbols& symbols,
                                           uint32_t boot);

// Finds boot |boot|'s delta to |formats|' kallsyms from the records of that
// boot in |map|. |text_delta| (MetaTextDelta) is one more piece of evidence;
// it decides alone only when it is this boot's own and nothing contradicts
// it. |own_symbols|: |formats| is this boot's own metadata (the agent's): the
// delta must be 0, and evidence against it prints raw.
KaslrVerdict EstablishKaslr(const BootMap& map, uint32_t boot, const KernelFormats& formats,
                            std::optional<TextAddrDelta> text_delta, bool own_symbols);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CAPTURE_KASLR_EVIDENCE_H_
