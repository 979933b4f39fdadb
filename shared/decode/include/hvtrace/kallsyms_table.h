// A kernel's /proc/kallsyms parsed into a table sorted by address, once per
// kernel: hvtraced parses a guest kernel's when its formats load
// (FormatCache::Load), not at panic time, where a 6.12 kernel's ~7 MB took
// 8-17 ms per parse (bench/README.md, capture_latency.sh).
//
// The table keeps offsets into the text it was parsed from, not a copy: the
// caller passes that same text to Line/Name (KernelFormats holds both).
#ifndef HVTRACE_SHARED_DECODE_KALLSYMS_TABLE_H_
#define HVTRACE_SHARED_DECODE_KALLSYMS_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace hvtrace {

class KallsymsTable {
 public:
  // One well-formed "ADDR TYPE NAME[\t[mod]]" line.
  struct Symbol {
    uint64_t addr = 0;
    uint32_t offset = 0;  // The line's start in the text.
    uint32_t length = 0;  // The line's length, newline excluded.
    uint8_t digits = 0;   // Hex digits of ADDR.
    char type = 0;        // 'T', 't', 'A', ...
    bool module = false;  // A module's symbol ("\t[mod]"), not the image's.
  };

  // Parses |kallsyms|; lines of any other shape are skipped. |threads| 2:
  // the second half of a large text is parsed on a thread of its own (the
  // table is the same).
  static std::shared_ptr<const KallsymsTable> Parse(std::string_view kallsyms,
                                                    unsigned threads = 1);

  // The symbols sorted by address (file order among equal addresses).
  std::span<const Symbol> symbols() const { return symbols_; }
  // The symbol's line (no newline) and name, in |kallsyms| (the parsed text).
  static std::string_view Line(std::string_view kallsyms, const Symbol& s) {
    return kallsyms.substr(s.offset, s.length);
  }
  static std::string_view Name(std::string_view kallsyms, const Symbol& s);
  // The text's lines but empty ones, well-formed or not.
  size_t lines() const { return lines_; }

 private:
  // Parses the lines of |text| in [|from|, |to|) (line starts) into |out|;
  // returns the count of lines but empty ones.
  static size_t ParseLines(std::string_view text, size_t from, size_t to, std::vector<Symbol>* out);

  std::vector<Symbol> symbols_;
  size_t lines_ = 0;
};

}  // namespace hvtrace

#endif  // HVTRACE_SHARED_DECODE_KALLSYMS_TABLE_H_
