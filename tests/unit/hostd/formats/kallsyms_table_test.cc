#include "kallsyms_table.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kallsyms_subset.h"

namespace hvtrace::hostd {
namespace {

TEST(KallsymsTableTest, ParsesWellFormedLinesInAddressOrder) {
  const std::string text =
      "ffffffff81000000 T _text\n"
      "ffffffff81002000 t b_func\n"
      "not a symbol line\n"
      "ffffffff81001000 T a_func\n"  // A straggler: sorted into place.
      "0000000000000000 A fixed_percpu_data\n"
      "ffffffffc0001000 t mod_fn\t[virtio_blk]\n"
      "ffffffff8100 T\n"          // Too short.
      "ffffffff81003000 t last";  // No newline at the end.
  auto table = KallsymsTable::Parse(text);
  std::vector<std::string> names;
  for (const KallsymsTable::Symbol& s : table->symbols())
    names.emplace_back(KallsymsTable::Name(text, s));
  EXPECT_EQ(names, (std::vector<std::string>{"fixed_percpu_data", "_text", "a_func", "b_func",
                                             "last", "mod_fn\t[virtio_blk]"}));
  const auto& mod = table->symbols().back();
  EXPECT_TRUE(mod.module);
  EXPECT_EQ(mod.type, 't');
  EXPECT_EQ(mod.addr, 0xffffffffc0001000ull);
  EXPECT_EQ(KallsymsTable::Line(text, table->symbols()[1]), "ffffffff81000000 T _text");
  EXPECT_FALSE(table->symbols()[1].module);
}

TEST(KallsymsTableTest, EmptyAndHostileTextGiveNoSymbols) {
  EXPECT_TRUE(KallsymsTable::Parse("")->symbols().empty());
  EXPECT_TRUE(KallsymsTable::Parse("\n\n\n")->symbols().empty());
  // More than 16 hex digits is not an address.
  EXPECT_TRUE(KallsymsTable::Parse("1ffffffff81000000 T x\n")->symbols().empty());
}

// The subset from a table made at load: a value keeps the symbol it falls
// in, the next one and their aliases; core symbols move by the delta, module
// symbols and '$' or absolute names do not take part.
TEST(KallsymsTableTest, SubsetKeepsTheSymbolsAValueNeeds) {
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
