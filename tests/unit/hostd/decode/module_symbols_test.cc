#include "module_symbols.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kallsyms_subset.h"

namespace hvtrace::hostd {
namespace {

// A harvest's kallsyms: two modules loaded at its own addresses, one the
// captured boot did not have, data symbols that must not move.
const char kKallsyms[] =
    "ffffffff81000000 T _text\n"
    "ffffffff81001000 T start_kernel\n"
    "ffffffffc0740000 t __pfx_pvpanic_mmio_probe\t[pvpanic_mmio]\n"
    "ffffffffc0740010 t pvpanic_mmio_probe\t[pvpanic_mmio]\n"
    "ffffffffc0742000 d pvpanic_mmio_driver\t[pvpanic_mmio]\n"
    "ffffffffc0746010 t pvpanic_pci_probe\t[pvpanic_pci]\n"
    "ffffffffc0746200 t pvpanic_pci_remove\t[pvpanic_pci]\n"
    "ffffffffc0800010 t virtnet_poll\t[virtio_net]\n";

TEST(ModuleSymbolsTest, TextSymbolsMoveToWhereTheBootHadTheirModule) {
  auto symbols = KernelSymbols::Build(kKallsyms, {});
  const std::vector<BootMapModule> loaded = {{0xffffffffc1230000ull, "pvpanic_mmio"},
                                             {0xffffffffc0700000ull, "pvpanic_pci"},
                                             {0xffffffffc0900000ull, "hvt_beta"}};
  ModuleSymbols moved = MoveModuleSymbols(kKallsyms, *symbols, loaded);
  EXPECT_EQ(moved.modules_moved, 2u);
  EXPECT_EQ(moved.symbols, 4u);
  EXPECT_EQ(moved.not_harvested, std::vector<std::string>{"hvt_beta"});
  EXPECT_EQ(moved.kallsyms,
            "ffffffffc1230000 t __pfx_pvpanic_mmio_probe\t[pvpanic_mmio]\n"
            "ffffffffc1230010 t pvpanic_mmio_probe\t[pvpanic_mmio]\n"
            "ffffffffc0700010 t pvpanic_pci_probe\t[pvpanic_pci]\n"
            "ffffffffc0700200 t pvpanic_pci_remove\t[pvpanic_pci]\n");

  // A subset built from them names a pointer into the moved module; the
  // harvest's own module addresses are left out of the image's subset.
  KallsymsSubset image(kKallsyms, 0, symbols, /*with_modules=*/false);
  KallsymsSubset modules(moved.kallsyms, 0);
  uint64_t values[] = {0xffffffffc1230018ull, 0xffffffffc0740018ull};
  std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(values), sizeof values);
  image.AddPayload(payload);
  modules.AddPayload(payload);
  EXPECT_EQ(image.Text().find("[pvpanic_mmio]"), std::string::npos) << image.Text();
  EXPECT_NE(modules.Text().find("ffffffffc1230010 t pvpanic_mmio_probe"), std::string::npos)
      << modules.Text();
}

// rmmod + insmod: the kernel appends a second entry and keeps the first, so
// events from before the reload (the first base) and after it (the second)
// both name their function.
TEST(ModuleSymbolsTest, AModuleLoadedAgainIsPlacedAtBothBases) {
  auto symbols = KernelSymbols::Build(kKallsyms, {});
  const std::vector<BootMapModule> loaded = {{0xffffffffc0700000ull, "pvpanic_pci"},
                                             {0xffffffffc0a00000ull, "pvpanic_pci"}};
  ModuleSymbols moved = MoveModuleSymbols(kKallsyms, *symbols, loaded);
  EXPECT_EQ(moved.modules_moved, 1u);
  EXPECT_EQ(moved.symbols, 4u);
  EXPECT_TRUE(moved.superseded.empty());
  EXPECT_EQ(moved.kallsyms,
            "ffffffffc0700010 t pvpanic_pci_probe\t[pvpanic_pci]\n"
            "ffffffffc0a00010 t pvpanic_pci_probe\t[pvpanic_pci]\n"
            "ffffffffc0700200 t pvpanic_pci_remove\t[pvpanic_pci]\n"
            "ffffffffc0a00200 t pvpanic_pci_remove\t[pvpanic_pci]\n");
  // The same base twice (reloaded into the memory it had): placed once.
  const std::vector<BootMapModule> same = {{0xffffffffc0700000ull, "pvpanic_pci"},
                                           {0xffffffffc0700000ull, "pvpanic_pci"}};
  EXPECT_EQ(MoveModuleSymbols(kKallsyms, *symbols, same).symbols, 2u);
}

// Another module loaded later into memory an unloaded one had: an address
// there cannot be told apart, so the older entry is not placed at all.
TEST(ModuleSymbolsTest, Malicious_ALaterLoadIntoTheSameMemorySupersedesTheOlderEntry) {
  auto symbols = KernelSymbols::Build(kKallsyms, {});
  const std::vector<BootMapModule> loaded = {{0xffffffffc0700000ull, "pvpanic_pci"},
                                             {0xffffffffc0700000ull, "pvpanic_mmio"}};
  ModuleSymbols moved = MoveModuleSymbols(kKallsyms, *symbols, loaded);
  EXPECT_EQ(moved.superseded, std::vector<std::string>{"pvpanic_pci"});
  EXPECT_EQ(moved.modules_moved, 1u);
  EXPECT_EQ(moved.kallsyms.find("pvpanic_pci_probe"), std::string::npos) << moved.kallsyms;
  EXPECT_NE(moved.kallsyms.find("ffffffffc0700010 t pvpanic_mmio_probe"), std::string::npos);
}

// Debian 7.3.4's kallsyms keeps some __init functions of a module at the
// address its freed init text had, which the next module's core reused
// (`pvpanic_mmio_driver_init` at pvpanic_pci_probe's address). That symbol
// neither widens pvpanic_mmio's text over pvpanic_pci (which would mark the
// entry superseded) nor moves: it would name pvpanic_pci's code.
TEST(ModuleSymbolsTest, AStaleInitSymbolInTheNextModulesTextIsLeftOut) {
  const std::string kallsyms =
      std::string(kKallsyms) + "ffffffffc0746010 T pvpanic_mmio_driver_init\t[pvpanic_mmio]\n";
  auto symbols = KernelSymbols::Build(kallsyms, {});
  const std::vector<BootMapModule> loaded = {{0xffffffffc1230000ull, "pvpanic_mmio"},
                                             {0xffffffffc1236000ull, "pvpanic_pci"}};
  ModuleSymbols moved = MoveModuleSymbols(kallsyms, *symbols, loaded);
  EXPECT_TRUE(moved.superseded.empty());
  EXPECT_EQ(moved.modules_moved, 2u);
  EXPECT_EQ(moved.symbols, 4u);
  EXPECT_EQ(moved.kallsyms.find("pvpanic_mmio_driver_init"), std::string::npos) << moved.kallsyms;
}

TEST(ModuleSymbolsTest, Malicious_NothingLoadedOrNothingHarvestedMovesNothing) {
  auto symbols = KernelSymbols::Build(kKallsyms, {});
  EXPECT_TRUE(MoveModuleSymbols(kKallsyms, *symbols, {}).kallsyms.empty());
  const std::vector<BootMapModule> unknown = {{0xffffffffc0001000ull, "x"}};
  ModuleSymbols moved = MoveModuleSymbols(kKallsyms, *symbols, unknown);
  EXPECT_TRUE(moved.kallsyms.empty());
  EXPECT_EQ(moved.not_harvested.size(), 1u);
  // A module base near the top cannot wrap a symbol past zero unnoticed: the
  // address is kept as computed (a 64-bit move), never read out of bounds.
  const std::vector<BootMapModule> top = {{0xfffffffffffff000ull, "pvpanic_pci"}};
  EXPECT_EQ(MoveModuleSymbols(kKallsyms, *symbols, top).symbols, 2u);
}

}  // namespace
}  // namespace hvtrace::hostd
