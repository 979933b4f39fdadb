// The region's text areas (hvtrace/region.h, TextAreaHeader): the guest
// kernel's text symbols and its saved_cmdlines, which the host needs to print
// what the guest's own trace file prints (function names for %ps/%pS, task
// names) for a VM whose kernel it never saw.
//
// The guest side compresses (EncodeText); the host side inflates into a hard
// cap and accepts a text only when its sizes, CRC and line syntax hold
// (DecodeTextArea). A bad area costs nothing but the names: the host prints
// hex and <...>, as without the area.
#ifndef HVTRACE_REGION_TEXT_H_
#define HVTRACE_REGION_TEXT_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/region_reader.h"
#include "hvtrace/result.h"

namespace hvtrace {

enum class TextAreaKind : uint8_t {
  kSymbols,  // /proc/kallsyms lines: "ffffffff81000000 T _text[\t[mod]]".
  kComms,    // saved_cmdlines lines: "pid comm".
};

// The most the host inflates: a distribution kernel's text symbols with its
// modules are ~8 MB; 1024 saved_cmdlines ~25 KB.
inline constexpr uint32_t kMaxSymbolText = 64u << 20;
inline constexpr uint32_t kMaxCommText = 1u << 20;

// What follows a TextAreaHeader, and the header's fields that describe it.
struct EncodedText {
  std::vector<std::byte> stored;
  uint32_t raw_size = 0;
  uint32_t crc32 = 0;
  uint64_t lines = 0;
};
EncodedText EncodeText(std::string_view text);

// The text symbols (types T and t, core kernel and modules) of /proc/kallsyms
// text, lines unchanged, less the __pfx_/__cfi_ padding symbols: what
// trace-cmd's kallsyms section needs to name functions. |any_address| says whether any address was
// non-zero (false: kptr_restrict hides them, and the lines are worthless).
std::string TextSymbolsOf(std::string_view kallsyms, bool* any_address);

// Checks every line of |text| against |kind|'s syntax (the error names the
// line and what is wrong).
Status CheckAreaText(TextAreaKind kind, std::string_view text);

// Inflates and checks a text area the region reader found present. The
// error says why it was refused (the caller adds which area and where).
Result<std::string> DecodeTextArea(TextAreaKind kind, const RegionTextArea& area);

// The text areas of one region followed across snapshots: an area is
// inflated only when its header changed, the last good text of each boot
// generation is kept (a torn or bad rewrite does not lose it), and a bad
// area is reported into the snapshot once. A boot's first good symbols are
// final, and after a refused symbol area the next kSymbolRetryLooks updates
// do not look at it: a guest rewriting it on every look costs one inflate
// per ~second of a live stream, not one per look.
//
// Bounded. The guest chooses its boot generation, and a 64 MiB symbol text
// compresses small enough to fit the area, so a guest raising its generation
// on every look must not make a reader keep a text per generation: a cache
// keeps the texts of its kTextGenerationsKept newest generations per kind
// (the current boot and the one before, whose pages a region still holds),
// a good symbol text also costs kSymbolRetryLooks looks before the next
// generation's is inflated, and all caches of the process together hold at
// most kMaxTextHeld bytes (a text that would pass it is refused with a note,
// and its names are not used).
inline constexpr size_t kTextGenerationsKept = 2;
inline constexpr uint64_t kMaxTextHeld = 256ull << 20;

class RegionTextCache {
 public:
  RegionTextCache() = default;
  ~RegionTextCache();
  // The process-wide count (kMaxTextHeld) follows each cache's texts.
  RegionTextCache(const RegionTextCache&) = delete;
  RegionTextCache& operator=(const RegionTextCache&) = delete;

  // Looks at |snapshot|'s areas: inflates those whose header changed,
  // reports a bad one into the snapshot (once per header) and returns notes
  // for a live reader: what was refused, and texts that became available.
  std::vector<std::string> Update(RegionSnapshot* snapshot);
  // The last good text of |kind| for boot |generation|, "" if none.
  const std::string& Text(TextAreaKind kind, uint64_t generation) const;
  // Generations with a text of |kind| kept now (at most kTextGenerationsKept).
  size_t generations_kept(TextAreaKind kind) const;
  // Bytes of text this cache holds; and all caches of the process.
  uint64_t held_bytes() const;
  static uint64_t process_held_bytes();

 private:
  struct Key {
    uint64_t seq = 0, generation = 0;
    uint32_t raw_size = 0, crc32 = 0;
    size_t stored = 0;
    bool operator==(const Key&) const = default;
  };
  static constexpr uint32_t kSymbolRetryLooks = 20;
  struct PerKind {
    Key last;  // Header of the area last looked at (good or bad).
    bool looked = false;
    uint32_t backoff = 0;  // Updates to skip before looking again.
    std::map<uint64_t, std::string> by_generation;
    std::vector<uint64_t> order;  // Generations in by_generation, oldest stored first.
  };
  // Stores |text| for |generation|, evicting the oldest beyond the bound.
  void Keep(PerKind& k, uint64_t generation, std::string text);
  PerKind kinds_[2];
};

}  // namespace hvtrace

#endif  // HVTRACE_REGION_TEXT_H_
