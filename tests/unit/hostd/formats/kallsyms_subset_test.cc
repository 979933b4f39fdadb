#include "kallsyms_subset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace hvtrace::hostd {
namespace {

// The subset from a table made at load: a value keeps the symbol it falls
// in, the next one and their aliases; core symbols move by the delta, module
// symbols and '$' or absolute names do not take part.
TEST(KallsymsSubsetTest, KeepsTheSymbolsAValueNeeds) {
  const std::string text =
      "ffffffff81000000 T _text\n"
      "ffffffff81001000 T alpha\n"
      "ffffffff81001000 t alpha_alias\n"
      "ffffffff81001000 t $x\n"
      "ffffffff81002000 T beta\n"
      "ffffffff81003000 T gamma\n"
      "0000000000001000 A percpu_thing\n"
      "ffffffffc0000000 t mod_fn\t[m]\n"
      "ffffffffc0000100 t mod_next\t[m]\n";
  const int64_t delta = 0x200000;
  KallsymsSubset subset(text, delta, KernelSymbols::Build(text, ""));
  std::vector<std::byte> payload(16);
  const uint64_t in_alpha = 0xffffffff81001010ull + delta, in_mod = 0xffffffffc0000010ull;
  std::memcpy(payload.data(), &in_alpha, 8);
  std::memcpy(payload.data() + 8, &in_mod, 8);
  subset.AddPayload(payload);
  EXPECT_EQ(subset.Text(),
            "ffffffff81201000 T alpha\n"
            "ffffffff81201000 t alpha_alias\n"
            "ffffffff81202000 T beta\n"
            "ffffffffc0000000 t mod_fn\t[m]\n"
            "ffffffffc0000100 t mod_next\t[m]\n");
}

// One pass over a payload for two subsets (a boot's core symbols and its
// moved module symbols) marks in each what a pass of its own would.
TEST(KallsymsSubsetTest, APayloadOfferedToTwoSubsetsMarksEachAsItsOwnPassWould) {
  const std::string core =
      "ffffffff81000000 T _text\n"
      "ffffffff81001000 T alpha\n"
      "ffffffff81002000 T beta\n"
      "ffffffff81003000 T gamma\n";
  const std::string modules =
      "ffffffffc0100000 t mod_fn\t[m]\n"
      "ffffffffc0100100 t mod_next\t[m]\n"
      "ffffffffc0100200 t mod_last\t[m]\n";
  std::vector<std::byte> payload(24);
  const uint64_t values[] = {0xffffffff81002010ull, 0xffffffffc0100110ull, 0x1234};
  std::memcpy(payload.data(), values, sizeof values);
  KallsymsSubset both_core(core, 0, KernelSymbols::Build(core, "")), both_mod(modules, 0);
  both_core.AddPayload(payload, &both_mod);
  KallsymsSubset own_core(core, 0, KernelSymbols::Build(core, "")), own_mod(modules, 0);
  own_core.AddPayload(payload);
  own_mod.AddPayload(payload);
  EXPECT_EQ(both_core.Text(), own_core.Text());
  EXPECT_EQ(both_mod.Text(), own_mod.Text());
  EXPECT_EQ(both_mod.Text(),
            "ffffffffc0100100 t mod_next\t[m]\n"
            "ffffffffc0100200 t mod_last\t[m]\n");
  EXPECT_EQ(both_core.Text(),
            "ffffffff81002000 T beta\n"
            "ffffffff81003000 T gamma\n");
}

// The subset as it was computed before the symbols were indexed at load:
// every registered line copied, moved, sorted; kept lines expanded to their
// aliases. The indexed subset must print the same text (it also leaves out
// core symbols that a delta would move past either end).
std::string ReferenceSubset(const std::string& text, int64_t delta,
                            const std::vector<uint64_t>& values) {
  struct Line {
    uint64_t addr;
    std::string text;
    size_t digits;
    bool movable;
  };
  std::vector<Line> lines;
  auto table = KallsymsTable::Parse(text);
  for (const KallsymsTable::Symbol& s : table->symbols()) {
    if (s.type == 'A' || s.type == 'a' || KallsymsTable::Name(text, s).starts_with('$')) continue;
    Line k{s.addr, std::string(KallsymsTable::Line(text, s)), s.digits, s.addr != 0 && !s.module};
    if (k.movable) {
      // A move past either end of the address space names nothing: left out.
      const bool wraps = delta < 0 ? k.addr < 0 - static_cast<uint64_t>(delta)
                                   : k.addr > ~0ull - static_cast<uint64_t>(delta);
      if (wraps) continue;
      k.addr += static_cast<uint64_t>(delta);
    }
    lines.push_back(k);
  }
  std::stable_sort(lines.begin(), lines.end(),
                   [](const Line& a, const Line& b) { return a.addr < b.addr; });
  uint64_t lowest = 0;
  for (const Line& k : lines) {
    if (k.addr != 0) {
      lowest = k.addr;
      break;
    }
  }
  std::vector<int> keep(lines.size());
  for (uint64_t v : values) {
    if (lowest == 0 || v < lowest) continue;
    auto it = std::upper_bound(lines.begin(), lines.end(), v,
                               [](uint64_t x, const Line& k) { return x < k.addr; });
    size_t c = static_cast<size_t>(it - lines.begin()) - 1;
    keep[c] = 1;
    if (c + 1 < lines.size()) keep[c + 1] = 1;
  }
  std::string out;
  for (size_t i = 0; i < lines.size();) {
    size_t j = i;
    bool any = false;
    for (; j < lines.size() && lines[j].addr == lines[i].addr; ++j) any |= keep[j] != 0;
    for (; any && i < j; ++i) {
      const Line& k = lines[i];
      if (k.movable && delta != 0) {
        char hex[17];
        std::snprintf(hex, sizeof hex, "%0*llx", static_cast<int>(k.digits),
                      static_cast<unsigned long long>(k.addr));
        out += hex + k.text.substr(k.digits);
      } else {
        out += k.text;
      }
      out += '\n';
    }
    i = j;
  }
  return out;
}

// Core, module, zero and absolute symbols with aliases, moved both ways by
// KASLR-sized deltas, against values in and around them.
TEST(KallsymsSubsetTest, IndexedSubsetPrintsWhatTheWholeTableWould) {
  std::mt19937_64 rng(20261125);
  std::string text;
  const char* types = "TtWwDdBbRrAa";
  for (int i = 0; i < 3000; ++i) {
    uint64_t addr = 0;
    switch (rng() % 8) {
      case 0:
        addr = 0xffffffffc0000000ull + (rng() % 0x100000);  // Module.
        break;
      case 1:
        addr = rng() % 4 == 0 ? 0 : rng() % 0x40000;  // Zero or per-CPU-like.
        break;
      default:
        addr = 0xffffffff81000000ull + (rng() % 0x20000) * 16;
    }
    char line[96];
    const bool module = addr >= 0xffffffffc0000000ull;
    std::snprintf(line, sizeof line, "%016llx %c %s%d%s\n", static_cast<unsigned long long>(addr),
                  types[rng() % 12], rng() % 50 == 0 ? "$x" : "sym_", i, module ? "\t[mod]" : "");
    text += line;
    if (rng() % 10 == 0) {  // An alias at the same address.
      std::snprintf(line, sizeof line, "%016llx t alias_%d\n",
                    static_cast<unsigned long long>(addr), i);
      text += line;
    }
  }
  auto symbols = KernelSymbols::Build(text, "");
  for (int64_t delta : {int64_t{0}, int64_t{0x200000}, int64_t{-0x600000}, int64_t{0x3fe00000},
                        int64_t{-0x40000000}}) {
    std::vector<uint64_t> values;
    for (int i = 0; i < 400; ++i) {
      const uint64_t base = rng() % 3 == 0   ? 0xffffffffc0000000ull + rng() % 0x100000
                            : rng() % 5 == 0 ? rng() % 0x40000
                                             : 0xffffffff81000000ull + rng() % 0x200000;
      values.push_back(base + static_cast<uint64_t>(delta) * (rng() % 2));
    }
    values.push_back(~0ull);
    KallsymsSubset subset(text, delta, symbols);
    std::vector<std::byte> payload(values.size() * 8);
    std::memcpy(payload.data(), values.data(), payload.size());
    subset.AddPayload(payload);
    // The payload is read at every 4-byte offset: so is the reference.
    std::vector<uint64_t> read;
    for (size_t off = 0; off + 8 <= payload.size(); off += 4) {
      uint64_t v;
      std::memcpy(&v, payload.data() + off, 8);
      read.push_back(v);
    }
    EXPECT_EQ(subset.Text(), ReferenceSubset(text, delta, read)) << "delta " << delta;
  }
}

}  // namespace
}  // namespace hvtrace::hostd
