#include "kallsyms_subset.h"

#include <gtest/gtest.h>

#include <cstring>
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
  KallsymsSubset subset(text, delta, KallsymsTable::Parse(text));
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

}  // namespace
}  // namespace hvtrace::hostd
