#include "kernel_memory_direct.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

namespace hvtrace::hostd {
namespace {

// A guest's RAM in this process (GuestRam reads it with process_vm_readv as
// it reads QEMU's): 16 MiB at guest-physical 16 MiB, a kernel image at
// physical 20 MiB moved by KASLR 512 MiB, VMCOREINFO in a direct-map page.
constexpr uint64_t kRamGpa = 16ull << 20, kRamBytes = 16ull << 20;
constexpr uint64_t kImagePa = 20ull << 20;
constexpr uint64_t kText = 0xffffffff81000000ull;
constexpr int64_t kDelta = 0x20000000;
constexpr uint64_t kPageOffset = 0xff11000000000000ull;
constexpr uint64_t kVmcoreinfoPa = 28ull << 20;
constexpr const char* kBanner = "Linux version 6.12.0-test (hvtrace) #1 SMP\n";

class KernelMemoryDirectTest : public ::testing::Test {
 protected:
  KernelMemoryDirectTest() : ram_(kRamBytes) {
    symbols_.text = kText;
    symbols_.stext = kText + 0x200;
    symbols_.end = kText + 0x100000;
    symbols_.linux_banner = kText + 0x1000;
    symbols_.page_offset_base = kText + 0x2000;
    symbols_.vmcoreinfo_data = kText + 0x2008;
    symbols_.vmcoreinfo_size = kText + 0x2010;
    PutImage(kImagePa);
    const int64_t phys_base =
        static_cast<int64_t>(kImagePa) - static_cast<int64_t>(kText + kDelta - 0xffffffff80000000);
    PutVmcoreinfo("OSRELEASE=6.12.0-test\nSYMBOL(_stext)=" + Hex(kText + 0x200 + kDelta) +
                  "\nNUMBER(phys_base)=" + std::to_string(phys_base) + "\n");
  }

  static std::string Hex(uint64_t v) {
    char b[32];
    std::snprintf(b, sizeof b, "%llx", static_cast<unsigned long long>(v));
    return b;
  }
  unsigned char* At(uint64_t gpa) { return ram_.data() + (gpa - kRamGpa); }
  void Put64(uint64_t gpa, uint64_t v) { std::memcpy(At(gpa), &v, 8); }
  void PutImage(uint64_t pa) {
    std::memcpy(At(pa + 0x1000), kBanner, std::strlen(kBanner));
    Put64(pa + 0x2000, kPageOffset);
  }
  void PutVmcoreinfo(const std::string& text) {
    std::memcpy(At(kVmcoreinfoPa), text.data(), text.size());
    Put64(kImagePa + 0x2008, kPageOffset + kVmcoreinfoPa);
    Put64(kImagePa + 0x2010, text.size());
  }
  std::shared_ptr<const GuestRam> Ram() {
    return std::make_shared<const GuestRam>(
        ::getpid(),
        std::vector<GuestRamRange>{{kRamGpa, kRamBytes, reinterpret_cast<uint64_t>(ram_.data())}});
  }

  std::vector<unsigned char> ram_;
  KernelLogSymbols symbols_;
};

TEST_F(KernelMemoryDirectTest, FindsTheImageTheDirectMapAndTheKaslrOffset) {
  std::memcpy(At(kImagePa + 0x3000), "image", 5);
  std::memcpy(At(kVmcoreinfoPa + 0x1000), "dmap", 4);
  uint64_t fell_back_at = 0;
  auto direct = MapKernelMemory(Ram(), symbols_, kBanner,
                                [&](uint64_t va, size_t) -> Result<std::vector<std::byte>> {
                                  fell_back_at = va;
                                  return Error{"memsave"};
                                });
  ASSERT_TRUE(direct.ok()) << direct.error().message;
  EXPECT_EQ(direct->kaslr_delta, kDelta);
  EXPECT_EQ(direct->info["image_pa"], "0x1400000");
  EXPECT_TRUE(direct->info["phys_base_checked"].get<bool>());
  auto image = direct->read(kText + kDelta + 0x3000, 5);
  ASSERT_TRUE(image.ok()) << image.error().message;
  EXPECT_EQ(std::memcmp(image->data(), "image", 5), 0);
  auto dmap = direct->read(kPageOffset + kVmcoreinfoPa + 0x1000, 4);
  ASSERT_TRUE(dmap.ok()) << dmap.error().message;
  EXPECT_EQ(std::memcmp(dmap->data(), "dmap", 4), 0);
  // vmalloc space: neither map covers it.
  EXPECT_FALSE(direct->read(0xffffc90000000000ull, 8).ok());
  EXPECT_EQ(fell_back_at, 0xffffc90000000000ull);
}

TEST_F(KernelMemoryDirectTest, Malicious_ASecondImageWithTheSameBannerIsRefused) {
  PutImage(kImagePa + (4ull << 20));
  auto direct = MapKernelMemory(Ram(), symbols_, kBanner, nullptr);
  ASSERT_FALSE(direct.ok());
  EXPECT_NE(direct.error().message.find("more than one of the 2 MiB steps"), std::string::npos)
      << direct.error().message;
}

TEST_F(KernelMemoryDirectTest, Malicious_AnImageWherePhysBaseSaysNoKernelRunsIsRefused) {
  PutVmcoreinfo("SYMBOL(_stext)=" + Hex(kText + 0x200 + kDelta) + "\nNUMBER(phys_base)=0\n");
  auto direct = MapKernelMemory(Ram(), symbols_, kBanner, nullptr);
  ASSERT_FALSE(direct.ok());
  EXPECT_NE(direct.error().message.find("phys_base"), std::string::npos) << direct.error().message;
}

TEST_F(KernelMemoryDirectTest, Malicious_VmcoreinfoPointersAndSizesTheGuestWroteAreBounded) {
  Put64(kImagePa + 0x2010, 1ull << 40);
  EXPECT_FALSE(MapKernelMemory(Ram(), symbols_, kBanner, nullptr).ok());
  Put64(kImagePa + 0x2010, 64);
  Put64(kImagePa + 0x2008, 0x1000);  // Below the direct map.
  EXPECT_FALSE(MapKernelMemory(Ram(), symbols_, kBanner, nullptr).ok());
  Put64(kImagePa + 0x2008, kPageOffset + (1ull << 40));  // Beyond RAM.
  EXPECT_FALSE(MapKernelMemory(Ram(), symbols_, kBanner, nullptr).ok());
  Put64(kImagePa + 0x2000, 0x1234);  // No direct map base.
  EXPECT_FALSE(MapKernelMemory(Ram(), symbols_, kBanner, nullptr).ok());
}

TEST_F(KernelMemoryDirectTest, NoBannerOrMissingSymbolsAreErrors) {
  EXPECT_FALSE(MapKernelMemory(Ram(), symbols_, "Linux version 7.3.0-other\n", nullptr).ok());
  KernelLogSymbols none;
  EXPECT_FALSE(MapKernelMemory(Ram(), none, kBanner, nullptr).ok());
  EXPECT_FALSE(MapKernelMemory(nullptr, symbols_, kBanner, nullptr).ok());
}

}  // namespace
}  // namespace hvtrace::hostd
