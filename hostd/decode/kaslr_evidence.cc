#include "kaslr_evidence.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/format.h"
#include "parsed_formats.h"

namespace hvtrace::hostd {
namespace {

using nlohmann::json;

// How a candidate delta is accepted, with the arithmetic.
//
// Candidates. x86_64 KASLR places the kernel image at a multiple of
// CONFIG_PHYSICAL_ALIGN inside the 1 GiB image area (0xffffffff80000000 ..
// 0xffffffffc0000000), so two boots differ by k * align with |k| <= 512.
// Debian's 6.12 and 6.1 configs (boot/config-* in the cached .debs) both set
// CONFIG_PHYSICAL_ALIGN=0x200000, the x86_64 minimum; a kernel with a larger
// alignment has a subset of these candidates, so 2 MiB is never wrong, only a
// little less selective. A value v lands in the harvest's text (16 MiB in
// 6.12.95, _stext.._etext) under at most text/align + 1 = 9 candidates; the
// candidates tried are those that put the first value of each kind in the
// text (a candidate that does not cannot explain every function pointer).
//
// Chance. The residue v mod 2 MiB is the same under every candidate, so a
// wrong candidate puts v at the same offset of another 2 MiB page of text.
// In the 6.12.95 harvest the text holds 52,677 function starts (t/T/w/W,
// without __pfx_/__cfi_ padding symbols) among 1,048,576 16-byte slots
// (CONFIG_FUNCTION_ALIGNMENT=16, and a function pointer is 16-aligned under
// any candidate): a wrong candidate lands one function pointer on a start
// with p = 0.050 (measured per harvest, never taken below kMinFunctionDensity).
// A print ip lands inside tracing_mark_write (0x280 bytes) under a wrong
// candidate with p = 0x280 / 2 MiB = 3e-4; a bprint fmt on one of the ~170
// printk_formats addresses with p = 170 / 2 MiB = 8e-5. The expected number
// of wrong candidates explaining what the best one explains is
//   E = (candidates - 1) * product of p over the distinct values it explains
// (8 other candidates: 1 function pointer E = 0.4, 2: 0.02, 3: 1e-3, 4: 5e-5;
// one marker ip alone 3e-4).
//
// Acceptance. The best candidate must contradict nothing (every function
// pointer in the image area on a function start, every ip inside the text),
// no other candidate without contradictions may explain as much, and
// E < kMaxExpectedFalse (1e-3: three distinct function pointers and anything
// else, four alone, or one trace_marker write). The meta's text_addr is an
// independent witness when it agrees (a stale one, from a wiped or earlier
// boot, agrees with a wrong candidate by chance with p ~ 1/512), so with its
// agreement E < kMaxExpectedFalseWithMeta (0.05: two function pointers).
// Never alone: no evidence, or evidence against it, prints raw.
constexpr uint64_t kAlign = 2ull << 20;
constexpr int64_t kMaxSteps = 512;  // 1 GiB / kAlign.
constexpr uint64_t kStartKernel = 0xffffffff81000000ull;
constexpr uint64_t kFunctionAlign = 16;
constexpr double kMinFunctionDensity = 0.02;
constexpr double kMaxExpectedFalse = 1e-3;
constexpr double kMaxExpectedFalseWithMeta = 0.05;
// A hostile boot can carry millions of distinct values; this many per kind
// decide as well as all of them.
constexpr size_t kMaxValuesPerKind = 4096;

enum Kind : uint8_t { kFunction, kPrintIp, kOtherIp, kFormat, kKinds };
constexpr std::array<const char*, kKinds> kKindNames = {"function_pointer", "marker_ip",
                                                        "ip_in_text", "printk_format"};

// Fields that hold exactly a function's start address (checked against the
// 6.12.95 formats: the kernel stores the callback pointer itself).
struct FieldRule {
  const char* system;
  const char* event;
  const char* field;
  Kind kind;
};
constexpr FieldRule kRules[] = {
    {"timer", "hrtimer_start", "function", kFunction},
    {"timer", "hrtimer_expire_entry", "function", kFunction},
    {"timer", "timer_start", "function", kFunction},
    {"timer", "timer_expire_entry", "function", kFunction},
    {"workqueue", "workqueue_queue_work", "function", kFunction},
    {"workqueue", "workqueue_activate_work", "function", kFunction},
    {"workqueue", "workqueue_execute_start", "function", kFunction},
    {"workqueue", "workqueue_execute_end", "function", kFunction},
    {"irq", "tasklet_entry", "func", kFunction},
    {"irq", "tasklet_exit", "func", kFunction},
    {"csd", "csd_queue_cpu", "func", kFunction},
    {"csd", "csd_function_entry", "func", kFunction},
    {"csd", "csd_function_exit", "func", kFunction},
    {"sched", "sched_kthread_work_queue_work", "function", kFunction},
    {"sched", "sched_kthread_work_execute_start", "function", kFunction},
    {"sched", "sched_kthread_work_execute_end", "function", kFunction},
    {"initcall", "initcall_start", "func", kFunction},
    {"initcall", "initcall_finish", "func", kFunction},
    {"ftrace", "print", "ip", kPrintIp},
    {"ftrace", "bprint", "ip", kOtherIp},
    {"ftrace", "bputs", "ip", kOtherIp},
    {"ftrace", "bprint", "fmt", kFormat},
    {"ftrace", "bputs", "str", kFormat},
};

// The harvest's symbols as the evidence needs them (indexed at load) and
// the chance that a wrong candidate lands a function pointer on a start.
struct SymbolIndex {
  std::shared_ptr<const KernelSymbols> symbols;
  const ImageSymbols& image;
  double function_density = kMinFunctionDensity;
};

SymbolIndex IndexSymbols(const KernelFormats& formats) {
  std::shared_ptr<const KernelSymbols> symbols = SymbolsOf(formats);
  const ImageSymbols& ix = symbols->image();
  SymbolIndex out{symbols, ix};
  if (ix.starts.empty()) return out;
  const auto in_text = std::lower_bound(ix.starts.begin(), ix.starts.end(), ix.text_hi) -
                       std::lower_bound(ix.starts.begin(), ix.starts.end(), ix.text_lo);
  const double slots = static_cast<double>(ix.text_hi - ix.text_lo) / kFunctionAlign;
  out.function_density = std::clamp(static_cast<double>(in_text) / slots, kMinFunctionDensity, 1.0);
  return out;
}

// Per kind: the distinct values, ascending.
using Values = std::array<std::vector<uint64_t>, kKinds>;

// One kind's values in record order, reduced to the first kMaxValuesPerKind
// distinct ones. While fewer than that many were seen at all, they are kept
// as they come and sorted once (a tree insert per value was 1.2 M of the
// KASLR step's 3.1 M instructions at a 6.12 panic, callgrind of hvtraced);
// past it, a set keeps the first distinct ones exactly as before.
class ValueCollector {
 public:
  void Add(uint64_t v) {
    if (!capped_) {
      seen_.push_back(v);
      if (seen_.size() > kMaxValuesPerKind) {
        capped_ = true;
        std::vector<uint64_t> in_order = std::move(seen_);
        seen_.clear();
        for (uint64_t u : in_order) Insert(u);
      }
      return;
    }
    Insert(v);
  }
  std::vector<uint64_t> Take() {
    if (capped_) return {set_.begin(), set_.end()};
    std::sort(seen_.begin(), seen_.end());
    seen_.erase(std::unique(seen_.begin(), seen_.end()), seen_.end());
    return std::move(seen_);
  }

 private:
  void Insert(uint64_t v) {
    if (set_.size() < kMaxValuesPerKind) set_.insert(v);
  }
  bool capped_ = false;
  std::vector<uint64_t> seen_;
  std::set<uint64_t> set_;
};

// The distinct image-area values of the evidence fields in boot |boot|.
Values CollectValues(const BootMap& map, uint32_t boot, const KernelFormats& formats) {
  // By 16-bit id, flat (a tree lookup per record before): (offset, kind).
  // The rules by event name, in kRules' order: comparing each of a
  // kernel's ~1,800 formats with every rule was 1.5 M instructions a
  // capture; each evidence event's format is parsed once for all its rules.
  static const std::multimap<std::string_view, const FieldRule*> kRulesByEvent = [] {
    std::multimap<std::string_view, const FieldRule*> m;
    for (const FieldRule& rule : kRules) m.emplace(rule.event, &rule);
    return m;
  }();
  std::vector<std::vector<std::pair<uint32_t, Kind>>> by_id;
  for (const CachedEventFormat& ev : formats.events) {
    if (!ev.parse_error.empty()) continue;
    const auto [first, last] = kRulesByEvent.equal_range(ev.name);
    ParsedFormat parsed;
    for (auto it = first; it != last; ++it) {
      const FieldRule& rule = *it->second;
      if (ev.system != rule.system) continue;
      if (!parsed) parsed = ParsedFormatOf(formats, ev);
      if (!parsed->ok() || (*parsed)->id > 0xffff) break;  // No record has a wider id.
      const EventFormat& format = **parsed;
      const FieldFormat* f = format.FindField(rule.field);
      if (f != nullptr && f->size == 8 && f->kind == FieldKind::kScalar) {
        if (by_id.size() <= format.id) by_id.resize(format.id + 1);
        by_id[format.id].emplace_back(f->offset, rule.kind);
      }
    }
  }
  Values values;
  if (by_id.empty()) return values;
  std::array<ValueCollector, kKinds> collect;
  for (const BootMapCpu& cpu : map.cpu) {
    for (const BootMapRecord& rec : cpu.records) {
      if (rec.boot != boot || rec.payload.size() < 2) continue;
      uint16_t type = 0;
      std::memcpy(&type, rec.payload.data(), sizeof(type));
      if (type >= by_id.size()) continue;
      for (const auto& [offset, kind] : by_id[type]) {
        if (rec.payload.size() < 8 || offset > rec.payload.size() - 8) continue;
        uint64_t v = 0;
        std::memcpy(&v, rec.payload.data() + offset, sizeof(v));
        if (InKernelImage(v)) collect[kind].Add(v);
      }
    }
  }
  for (size_t k = 0; k < kKinds; ++k) values[k] = collect[k].Take();
  return values;
}

struct Score {
  int64_t delta = 0;
  std::array<size_t, kKinds> explained{};
  size_t contradicted = 0;
  double chance = 1;  // Product of p over the strong values explained.
  size_t strong() const { return explained[kFunction] + explained[kPrintIp] + explained[kFormat]; }
};

Score Evaluate(const SymbolIndex& ix, const Values& values, int64_t delta) {
  Score s;
  s.delta = delta;
  const double p_marker = static_cast<double>(ix.image.marker_hi - ix.image.marker_lo) / kAlign;
  const double p_format = std::min(1.0, static_cast<double>(ix.image.formats.size()) / kAlign);
  for (size_t k = 0; k < kKinds; ++k) {
    for (uint64_t v : values[k]) {
      const uint64_t a = v - static_cast<uint64_t>(delta);
      const bool in_text = a >= ix.image.text_lo && a < ix.image.text_hi;
      if (k == kFunction) {
        if (std::binary_search(ix.image.starts.begin(), ix.image.starts.end(), a)) {
          ++s.explained[k];
          s.chance *= ix.function_density;
        } else {
          ++s.contradicted;
        }
      } else if (k == kFormat) {
        if (std::binary_search(ix.image.formats.begin(), ix.image.formats.end(), a)) {
          ++s.explained[k];
          s.chance *= p_format;
        }  // Else a module's or a dynamic string: neither proof nor veto.
      } else if (!in_text) {
        ++s.contradicted;
      } else if (k == kPrintIp && ix.image.marker_lo != 0 && a >= ix.image.marker_lo &&
                 a < ix.image.marker_hi) {
        ++s.explained[k];
        s.chance *= p_marker;
      } else {
        ++s.explained[kOtherIp];  // Inside some function: consistent, proves little.
      }
    }
  }
  return s;
}

// Deltas (multiples of kAlign within 1 GiB) that put |v| in the text.
void AddCandidates(const SymbolIndex& ix, uint64_t v, std::set<int64_t>& out) {
  const int64_t from_lo = static_cast<int64_t>(v - ix.image.text_lo);  // Both in the image: fits.
  const int64_t from_hi = static_cast<int64_t>(v - ix.image.text_hi);
  auto floor_div = [](int64_t a, int64_t b) {
    return a / b - ((a % b != 0) && ((a < 0) != (b < 0)));
  };
  const int64_t align = static_cast<int64_t>(kAlign);
  const int64_t k_max = std::min(kMaxSteps, floor_div(from_lo, align));
  const int64_t k_min = std::max(-kMaxSteps, floor_div(from_hi, align) + 1);
  for (int64_t k = k_min; k <= k_max; ++k) out.insert(k * align);
}

json Counts(const Score& s) {
  json counts = json::object();
  for (size_t k = 0; k < kKinds; ++k) {
    if (s.explained[k] != 0) counts[kKindNames[k]] = s.explained[k];
  }
  return counts;
}

json Raw(std::string why, json extra = json::object()) {
  extra["raw"] = true;
  extra["why"] = std::move(why);
  return extra;
}

// Every delta worth scoring, best first: 0, the guest meta's, and those that
// put the first value of each kind in the text (a true delta puts all of
// them there). Best means no contradiction, then the least chance of a
// coincidence.
std::vector<Score> RankCandidates(const SymbolIndex& ix, const Values& values,
                                  std::optional<int64_t> meta_delta) {
  std::set<int64_t> candidates = {0};
  // From the guest's meta: any value (no std::abs, INT64_MIN is one).
  constexpr int64_t kMaxDelta = kMaxSteps * static_cast<int64_t>(kAlign);
  if (meta_delta && *meta_delta % static_cast<int64_t>(kAlign) == 0 && *meta_delta >= -kMaxDelta &&
      *meta_delta <= kMaxDelta) {
    candidates.insert(*meta_delta);
  }
  for (size_t k = 0; k < kKinds; ++k) {
    if (k != kFormat && !values[k].empty()) AddCandidates(ix, *values[k].begin(), candidates);
  }
  std::vector<Score> scores;
  for (int64_t d : candidates) scores.push_back(Evaluate(ix, values, d));
  std::sort(scores.begin(), scores.end(), [](const Score& a, const Score& b) {
    if ((a.contradicted == 0) != (b.contradicted == 0)) return a.contradicted == 0;
    if (a.chance != b.chance) return a.chance < b.chance;
    return a.contradicted < b.contradicted;
  });
  return scores;
}

// The agent's metadata is this boot's own: its symbols are used at delta 0
// unless a value contradicts them or the evidence proves another delta.
KaslrVerdict OwnSymbolsVerdict(const Score& zero, const Score& best, bool proven, size_t distinct,
                               json info) {
  KaslrVerdict out;
  info["evidence"] = Counts(zero);
  if (zero.contradicted != 0) {
    out.manifest = Raw(std::to_string(zero.contradicted) + " of " + std::to_string(distinct) +
                           " values contradict the agent's kallsyms for this boot",
                       std::move(info));
    return out;
  }
  if (proven && best.delta != 0) {
    out.manifest =
        Raw("the evidence says delta " + std::to_string(best.delta) + ", not the agent's own 0",
            std::move(info));
    return out;
  }
  info["delta"] = 0;
  info["source"] = "agent metadata";
  out.use_symbols = true;
  out.manifest = std::move(info);
  return out;
}

}  // namespace

std::optional<TextAddrDelta> MetaTextDelta(const BootMap& map, const ImageSymbols& symbols,
                                           uint32_t boot) {
  if (map.scratch.present) {
    // The scratch area is rewritten by each boot that records into the
    // range, so it speaks for the newest boot only.
    if (map.scratch.text_addr == 0 || !symbols.text || boot + 1 < std::max(map.boots, 1u)) {
      return std::nullopt;
    }
    return TextAddrDelta{static_cast<int64_t>(map.scratch.text_addr - *symbols.text),
                         "scratch_text_addr", true};
  }
  const BootMapCpu* meta = nullptr;
  for (const BootMapCpu& c : map.cpu) {
    if (c.meta_valid && c.text_addr != 0) {
      meta = &c;
      break;
    }
  }
  if (meta == nullptr) return std::nullopt;
  if (map.layout == "linux-6.12-kaslr") {
    if (!symbols.text) return std::nullopt;
    return TextAddrDelta{static_cast<int64_t>(meta->text_addr - (*symbols.text - kStartKernel))};
  }
  if (!symbols.meta_init_text_addr) return std::nullopt;
  return TextAddrDelta{static_cast<int64_t>(meta->text_addr - *symbols.meta_init_text_addr)};
}

KaslrVerdict EstablishKaslr(const BootMap& map, uint32_t boot, const KernelFormats& formats,
                            std::optional<TextAddrDelta> text_delta, bool own_symbols) {
  KaslrVerdict out;
  std::optional<int64_t> meta_delta;
  if (text_delta) meta_delta = text_delta->delta;
  const SymbolIndex ix = IndexSymbols(formats);
  if (ix.image.starts.empty()) {
    out.manifest = Raw("the kallsyms hold no kernel function (kptr_restrict or none harvested)");
    return out;
  }
  const Values values = CollectValues(map, boot, formats);
  const std::vector<Score> scores = RankCandidates(ix, values, meta_delta);
  size_t distinct = 0;
  for (const auto& v : values) distinct += v.size();
  const Score& best = scores.front();
  const double expected = static_cast<double>(std::max<size_t>(1, scores.size() - 1)) * best.chance;
  json info = {{"distinct", distinct}, {"candidates", scores.size()}};
  if (scores.size() > 1) {
    const Score& r = scores[1];
    info["runner_up"] = {
        {"delta", r.delta}, {"explained", Counts(r)}, {"contradicted", r.contradicted}};
  }
  // The meta's text_addr against the delta in use (own symbols: 0).
  const bool checked = own_symbols || (best.contradicted == 0 && best.strong() != 0);
  const int64_t chosen = own_symbols ? 0 : best.delta;
  if (meta_delta) {
    info[text_delta->kind] = !checked                ? "unchecked"
                             : *meta_delta == chosen ? "agrees"
                                                     : "disagrees (not this boot's)";
    info[std::string_view(text_delta->kind) == "meta_text_addr" ? "meta_delta" : "scratch_delta"] =
        *meta_delta;
  } else {
    info["meta_text_addr"] = "none";
  }
  // The agent's metadata is this boot's own: delta 0 unless evidence objects.
  const Score* zero = nullptr;
  for (const Score& s : scores) {
    if (s.delta == 0) zero = &s;
  }
  const bool unique =
      scores.size() < 2 || scores[1].contradicted != 0 || scores[1].strong() < best.strong();
  const bool meta_agrees = meta_delta && *meta_delta == best.delta;
  const bool proven = best.contradicted == 0 && best.strong() != 0 && unique &&
                      expected < (meta_agrees ? kMaxExpectedFalseWithMeta : kMaxExpectedFalse);
  if (own_symbols) return OwnSymbolsVerdict(*zero, best, proven, distinct, std::move(info));
  info["evidence"] = Counts(best);
  info["chance"] = expected;
  // 6.15+: the boot's own _text from the scratch area decides when no value
  // of the boot contradicts it (a guest that lies there can lie in its events
  // too; evidence that disagrees still wins).
  if (text_delta && text_delta->this_boots && !(proven && best.delta != text_delta->delta)) {
    for (const Score& sc : scores) {
      if (sc.delta != text_delta->delta || sc.contradicted != 0) continue;
      info["delta"] = sc.delta;
      info["source"] = text_delta->kind;
      info[text_delta->kind] = distinct == 0 ? "alone (no value to check it against)"
                                             : "agrees (no value contradicts it)";
      out.use_symbols = true;
      out.delta = sc.delta;
      out.manifest = std::move(info);
      return out;
    }
  }
  if (distinct == 0) {
    out.manifest =
        Raw("no evidence: the boot has no function-pointer, print ip or bprint fmt values in the "
            "kernel image (the meta's text_addr alone may be another boot's)",
            std::move(info));
    return out;
  }
  if (!proven) {
    std::string why = best.contradicted != 0
                          ? "no candidate offset explains every value (another kernel build?)"
                      : !unique            ? "ambiguous: two offsets explain the values equally"
                      : best.strong() == 0 ? "only weak evidence (ips inside some function)"
                                           : "too little evidence for a unique offset";
    out.manifest = Raw(std::move(why), std::move(info));
    return out;
  }
  info["delta"] = best.delta;
  info["source"] = "evidence";
  out.use_symbols = true;
  out.delta = best.delta;
  out.manifest = std::move(info);
  return out;
}

}  // namespace hvtrace::hostd
