#include "kernel_symbols.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace hvtrace::hostd {
namespace {

const std::string kKallsyms =
    "0000000000000000 A fixed_percpu_data\n"
    "ffffffff81000000 T _text\n"
    "ffffffff81000000 T _stext\n"
    "ffffffff81000000 t __pfx_first\n"
    "ffffffff81000010 T first\n"
    "ffffffff81000020 t first_alias\n"  // Its own start.
    "ffffffff81000040 T tracing_mark_write\n"
    "ffffffff81000300 W weak_fn\n"
    "ffffffff81000400 T _etext\n"
    "ffffffff81000500 D some_data\n"
    "ffffffff81000600 d rb_meta_init_text_addr\n"
    "ffffffff81000700 t $x\n"
    "ffffffffc0001000 t mod_fn\t[m]\n"
    "ffffffffc0002000 t _text\t[m]\n";  // A module's: not the image's _text.

TEST(KernelSymbolsTest, IndexesTheImageForTheKaslrEvidence) {
  auto symbols = KernelSymbols::Build(kKallsyms,
                                      "0xffffffff81000800 : \"fmt\\n\"\n"
                                      "0xffffffff81000800 : \"again\"\n"
                                      "0xffffffffc0000000 : \"module\"\n"
                                      "garbage\n");
  const ImageSymbols& im = symbols->image();
  EXPECT_EQ(im.starts, (std::vector<uint64_t>{0xffffffff81000000ull, 0xffffffff81000010ull,
                                              0xffffffff81000020ull, 0xffffffff81000040ull,
                                              0xffffffff81000300ull, 0xffffffff81000400ull,
                                              0xffffffff81000700ull}));
  EXPECT_EQ(im.formats, (std::vector<uint64_t>{0xffffffff81000800ull}));
  EXPECT_EQ(im.text_lo, 0xffffffff81000000ull);
  EXPECT_EQ(im.text_hi, 0xffffffff81000400ull);
  EXPECT_EQ(im.marker_lo, 0xffffffff81000040ull);
  EXPECT_EQ(im.marker_hi, 0xffffffff81000300ull);
  EXPECT_EQ(im.text, 0xffffffff81000000ull);
  EXPECT_EQ(im.meta_init_text_addr, 0xffffffff81000600ull);
}

TEST(KernelSymbolsTest, SplitsTheRegisteredSymbolsIntoMovableAndFixed) {
  auto symbols = KernelSymbols::Build(kKallsyms, "");
  const auto& table = symbols->table().symbols();
  std::vector<std::string> movable, fixed;
  for (uint32_t i : symbols->movable())
    movable.emplace_back(KallsymsTable::Name(kKallsyms, table[i]));
  for (uint32_t i : symbols->fixed()) fixed.emplace_back(KallsymsTable::Name(kKallsyms, table[i]));
  // No absolute or '$' symbols; modules stay where they are.
  EXPECT_EQ(movable, (std::vector<std::string>{"_text", "_stext", "__pfx_first", "first",
                                               "first_alias", "tracing_mark_write", "weak_fn",
                                               "_etext", "some_data", "rb_meta_init_text_addr"}));
  EXPECT_EQ(fixed, (std::vector<std::string>{"mod_fn\t[m]", "_text\t[m]"}));
}

TEST(KernelSymbolsTest, NotesWhereTheKernelLogReaderStarts) {
  auto symbols = KernelSymbols::Build(
      "ffffffff81000000 T _text\n"
      "ffffffff81000000 T _stext\n"
      "ffffffff82000000 D linux_banner\n"
      "ffffffff82000100 D page_offset_base\n"
      "ffffffff82000200 D vmcoreinfo_data\n"
      "ffffffff82000208 D vmcoreinfo_size\n"
      "ffffffff82000300 D vmcoreinfo_size\n"    // The last line of a name wins.
      "ffffffffc0001000 d linux_banner\t[m]\n"  // A module's: not the kernel's.
      "ffffffff83000000 B __bss_stop\n",
      "");
  const ImageSymbols& im = symbols->image();
  EXPECT_EQ(im.log.stext, 0xffffffff81000000ull);
  EXPECT_EQ(im.log.linux_banner, 0xffffffff82000000ull);
  EXPECT_EQ(im.log.page_offset_base, 0xffffffff82000100ull);
  EXPECT_EQ(im.log.vmcoreinfo_data, 0xffffffff82000200ull);
  EXPECT_EQ(im.log.vmcoreinfo_size, 0xffffffff82000300ull);
  EXPECT_FALSE(im.log.end);  // No _end line: the reader takes the highest image address.
  EXPECT_EQ(im.image_last, 0xffffffff83000000ull);
}

TEST(KernelSymbolsTest, NoSymbolsNoImage) {
  auto symbols = KernelSymbols::Build("0000000000000000 T _text\n0000000000000000 T _stext\n", "");
  EXPECT_TRUE(symbols->image().starts.empty());
  EXPECT_FALSE(symbols->image().text);
  EXPECT_TRUE(symbols->movable().empty());
  EXPECT_EQ(symbols->fixed().size(), 2u);
}

// The modules' text symbols and extents, for moving them to a boot's module
// bases (module_symbols.h): text only, non-zero, in the file's order; an
// extent ends where the next module's text starts, so a stale __init name of
// the first module at an address the second reused does not widen it.
TEST(KernelSymbolsTest, IndexesTheModulesTextAndExtents) {
  const std::string text =
      "ffffffff81000000 T _text\n"
      "ffffffffc0001000 t a_first\t[a]\n"
      "ffffffffc0001200 T a_second\t[a]\n"
      "ffffffffc0001800 d a_data\t[a]\n"
      "0000000000000000 t a_unknown\t[a]\n"
      "ffffffffc0003000 t b_first\t[b]\n"
      "ffffffffc0003100 t a_init_stale\t[a]\n"
      "ffffffffc0003400 W b_last\t[b]\n";
  auto symbols = KernelSymbols::Build(text, "");
  std::vector<std::string> names;
  for (const ModuleTextSymbol& m : symbols->module_text()) {
    // The table's name runs on to "\t[module]".
    const std::string_view name = KallsymsTable::Name(text, symbols->table().symbols()[m.index]);
    names.push_back(std::string(m.module) + ":" + std::string(name.substr(0, name.find('\t'))));
  }
  EXPECT_EQ(names, (std::vector<std::string>{"a:a_first", "a:a_second", "b:b_first",
                                             "a:a_init_stale", "b:b_last"}));
  const auto& extents = symbols->module_extents();
  ASSERT_EQ(extents.size(), 2u);
  const ModuleExtent& a = extents.at("a");
  EXPECT_EQ(a.low, 0xffffffffc0001000ull);
  EXPECT_EQ(a.high, 0xffffffffc0001200ull);
  EXPECT_EQ(a.limit, 0xffffffffc0003000ull);
  EXPECT_FALSE(a.Holds(0xffffffffc0003100ull));
  const ModuleExtent& b = extents.at("b");
  EXPECT_EQ(b.low, 0xffffffffc0003000ull);
  EXPECT_EQ(b.high, 0xffffffffc0003400ull);
  EXPECT_EQ(b.limit, UINT64_MAX);
}

}  // namespace
}  // namespace hvtrace::hostd
