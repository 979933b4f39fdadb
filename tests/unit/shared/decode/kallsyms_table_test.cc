#include "hvtrace/kallsyms_table.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace hvtrace {
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

}  // namespace
}  // namespace hvtrace
