// The region's text areas (hvtrace/region_text.h): geometry, the guest's
// writes, and the host's checks against a guest that lies about them.
#include "hvtrace/region_text.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "hvtrace/region_writer.h"

namespace hvtrace {
namespace {

const char kSymbols[] =
    "ffffffff81000000 T _text\n"
    "ffffffff81000000 T _stext\n"
    "ffffffff811a2b30 t tracing_mark_write\n"
    "ffffffffc0200000 t virtio_dev_probe\t[virtio]\n";
const char kComms[] = "1 init\n242 sh\n4242 kworker/0:1 x\n";

TEST(RegionTextGeometry, AreasSizedByTheHostOnlyWhenTheRegionIsLargeEnough) {
  auto small = PlanRegion(1 << 20, RegionPlanOptions{});
  ASSERT_TRUE(small.ok()) << small.error().message;
  EXPECT_EQ(small->symbol_size, 0u);
  EXPECT_EQ(small->comm_size, 0u);

  RegionPlanOptions opt;
  opt.max_cpus = 2;
  auto g = PlanRegion(16 << 20, opt);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ(g->symbol_size, 1u << 20);  // region/16
  EXPECT_EQ(g->comm_size, 32u << 10);
  EXPECT_GE(g->symbol_offset, g->FormatTextOffset() + g->format_text_size);
  EXPECT_EQ(g->comm_offset, g->symbol_offset + g->symbol_size);
  EXPECT_GE(g->cpu_offset, g->comm_offset + g->comm_size);
  auto big = PlanRegion(256ull << 20, opt);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->symbol_size, 4u << 20);  // capped

  // The geometry survives the header, and a 1.0 header (zeros) means none.
  std::vector<std::byte> mem(g->region_size);
  ASSERT_TRUE(InitRegionHeader(mem, *g, 1).ok());
  auto back = GeometryFromHeader(std::span(mem).first(256), mem.size());
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, *g);
  auto* h = reinterpret_cast<region::HostHeader*>(mem.data());
  EXPECT_EQ(h->version_minor, 1);
  h->symbol_offset = h->symbol_size = h->comm_offset = h->comm_size = 0;
  auto v10 = GeometryFromHeader(std::span(mem).first(256), mem.size());
  ASSERT_TRUE(v10.ok()) << v10.error().message;
  EXPECT_EQ(v10->symbol_size, 0u);
}

TEST(RegionTextGeometry, Malicious_OverlappingOrOversizedAreasAreRefused) {
  RegionPlanOptions opt;
  auto g = PlanRegion(16 << 20, opt);
  ASSERT_TRUE(g.ok());
  RegionGeometry bad = *g;
  bad.symbol_offset = g->format_offset;  // On top of the format table.
  EXPECT_FALSE(ValidateGeometry(bad).ok());
  bad = *g;
  bad.comm_offset = g->symbol_offset;  // Overlaps the symbol area.
  EXPECT_FALSE(ValidateGeometry(bad).ok());
  bad = *g;
  bad.comm_size = 0xfffff000u;  // Past the region.
  EXPECT_FALSE(ValidateGeometry(bad).ok());
  bad = *g;
  bad.symbol_size = 0;  // An offset without a size.
  EXPECT_FALSE(ValidateGeometry(bad).ok());
  bad = *g;
  bad.cpu_offset = g->comm_offset;  // CPU rings over the comm area.
  EXPECT_FALSE(ValidateGeometry(bad).ok());
}

TEST(RegionText, TextSymbolsKeepsFunctionLinesAsTheyAre) {
  const std::string kallsyms =
      "0000000000000000 A fixed_percpu_data\n"
      "ffffffff81000000 T _text\n"
      "ffffffff82000000 D some_data\n"
      "ffffffff811a2b20 t __pfx_tracing_mark_write\n"
      "ffffffff811a2b30 t tracing_mark_write\n"
      "ffffffffc01ffff0 t __pfx_virtio_dev_probe\t[virtio]\n"
      "ffffffffc01ffff8 t __cfi_virtio_dev_probe\t[virtio]\n"
      "ffffffffc0200000 t virtio_dev_probe\t[virtio]\n"
      "ffffffffc0201000 d virtio_data\t[virtio]\n";
  bool any = false;
  EXPECT_EQ(TextSymbolsOf(kallsyms, &any),
            "ffffffff81000000 T _text\nffffffff811a2b30 t tracing_mark_write\n"
            "ffffffffc0200000 t virtio_dev_probe\t[virtio]\n");
  EXPECT_TRUE(any);
  TextSymbolsOf("0000000000000000 T _text\n0000000000000000 t foo\n", &any);
  EXPECT_FALSE(any) << "kptr_restrict: only zero addresses";
  EXPECT_TRUE(CheckAreaText(TextAreaKind::kSymbols, kSymbols).ok());
  EXPECT_TRUE(CheckAreaText(TextAreaKind::kComms, kComms).ok());
}

// A 16 MiB region with an identity; the guest side writes the areas.
class RegionTextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RegionPlanOptions opt;
    opt.max_cpus = 2;
    auto g = PlanRegion(16 << 20, opt);
    ASSERT_TRUE(g.ok());
    geometry_ = *g;
    mem_.assign(geometry_.region_size, std::byte{0});
    ASSERT_TRUE(InitRegionHeader(mem_, geometry_, 1).ok());
    auto guest = GuestRegion::Attach(mem_.data(), mem_.size());
    ASSERT_TRUE(guest.ok());
    guest_.emplace(*guest);
    region::GuestIdentity id{};
    id.boot_generation = 2;
    id.nr_cpus = 2;
    id.page_size = 4096;
    guest_->WriteIdentity(id);
    ASSERT_TRUE(guest_->WriteTextArea(TextAreaKind::kSymbols, 2, EncodeText(kSymbols)).ok());
    ASSERT_TRUE(guest_->WriteTextArea(TextAreaKind::kComms, 2, EncodeText(kComms)).ok());
  }

  RegionSnapshot Read() {
    std::vector<std::byte> copy;
    CopyLiveRegion(mem_.data(), geometry_, &copy);
    auto s = ReadRegion(std::move(copy), geometry_);
    EXPECT_TRUE(s.ok());
    return std::move(*s);
  }
  region::TextAreaHeader* SymbolHeader() {
    return reinterpret_cast<region::TextAreaHeader*>(mem_.data() + geometry_.symbol_offset);
  }
  std::byte* SymbolBytes() {
    return mem_.data() + geometry_.symbol_offset + sizeof(region::TextAreaHeader);
  }
  // Replaces the symbol area's content with |stored| under the given header
  // values, as a lying guest would (seq kept even).
  void Lie(const std::vector<std::byte>& stored, uint32_t raw_size, uint32_t crc) {
    region::TextAreaHeader* h = SymbolHeader();
    std::memcpy(SymbolBytes(), stored.data(), stored.size());
    h->stored_size = static_cast<uint32_t>(stored.size());
    h->raw_size = raw_size;
    h->crc32 = crc;
    h->seq += 2;
  }
  static uint32_t Crc(const std::string& s) {
    return static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(s.data()), static_cast<uInt>(s.size())));
  }
  // The host's view after one snapshot: the symbols it would use, and the
  // issue it counted.
  std::string HostSymbols(RegionSnapshot* s) {
    RegionTextCache cache;
    cache.Update(s);
    return cache.Text(TextAreaKind::kSymbols, 2);
  }

  RegionGeometry geometry_;
  std::vector<std::byte> mem_;
  std::optional<GuestRegion> guest_;
};

TEST_F(RegionTextTest, WhatTheGuestPublishesTheHostReadsBack) {
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_total(), 0u);
  ASSERT_TRUE(s.symbols.present);
  EXPECT_EQ(s.symbols.boot_generation, 2u);
  EXPECT_EQ(s.symbols.lines, 4u);
  RegionTextCache cache;
  const std::vector<std::string> notes = cache.Update(&s);
  EXPECT_EQ(cache.Text(TextAreaKind::kSymbols, 2), kSymbols);
  EXPECT_EQ(cache.Text(TextAreaKind::kComms, 2), kComms);
  EXPECT_EQ(cache.Text(TextAreaKind::kSymbols, 1), "") << "another boot's symbols are not these";
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("symbols of generation 2: 4"), std::string::npos) << notes[0];
  EXPECT_EQ(guest_->TextArea(TextAreaKind::kSymbols).raw_size, sizeof(kSymbols) - 1);
}

TEST_F(RegionTextTest, TooLargeForTheAreaIsRefusedByTheWriter) {
  std::string huge;
  std::mt19937_64 rng(1);
  while (huge.size() < (4u << 20)) huge += std::to_string(rng()) + "\n";  // Barely compressible.
  const Status w = guest_->WriteTextArea(TextAreaKind::kSymbols, 2, EncodeText(huge));
  EXPECT_FALSE(w.ok());
  EXPECT_NE(w.error().message.find("do not fit"), std::string::npos) << w.error().message;
  RegionSnapshot s = Read();
  EXPECT_EQ(HostSymbols(&s), kSymbols) << "the area keeps what it had";
}

TEST_F(RegionTextTest, Malicious_TornAreaIsNotUsed) {
  SymbolHeader()->seq |= 1;
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kSymbolsTorn), 1u);
  EXPECT_FALSE(s.symbols.present);
  EXPECT_EQ(HostSymbols(&s), "");
  EXPECT_EQ(s.issue_count(RegionIssue::kCommsTorn), 0u);
}

TEST_F(RegionTextTest, Malicious_SizesThatLieAreRefusedWithContext) {
  const EncodedText good = EncodeText(kSymbols);
  struct Case {
    const char* name;
    std::vector<std::byte> stored;
    uint32_t raw_size;
    uint32_t crc;
    const char* expect;
  };
  std::vector<std::byte> trailing = good.stored;
  trailing.resize(trailing.size() + 7, std::byte{0x55});
  std::vector<std::byte> cut(good.stored.begin(), good.stored.begin() + good.stored.size() / 2);
  std::vector<std::byte> garbage(200, std::byte{0x42});
  const Case cases[] = {
      {"raw size too large", good.stored, good.raw_size + 100, good.crc32, "inflates to"},
      {"raw size too small", good.stored, good.raw_size - 10, good.crc32, "more than the stated"},
      {"raw size past the cap", good.stored, kMaxSymbolText + 1, good.crc32, "accepted"},
      {"wrong crc", good.stored, good.raw_size, good.crc32 ^ 1, "CRC"},
      {"not zlib", garbage, 1000, 0, "not a zlib stream"},
      {"trailing bytes", trailing, good.raw_size, good.crc32, "before the stated compressed size"},
      {"cut stream", cut, good.raw_size, good.crc32, "ends early"},
  };
  for (const Case& c : cases) {
    Lie(c.stored, c.raw_size, c.crc);
    RegionSnapshot s = Read();
    EXPECT_EQ(HostSymbols(&s), "") << c.name;
    EXPECT_EQ(s.issue_count(RegionIssue::kSymbolsBad), 1u) << c.name;
    ASSERT_FALSE(s.problems.empty()) << c.name;
    const RegionProblem& p = s.problems.back();
    EXPECT_EQ(p.where, "symbol area") << c.name;
    EXPECT_EQ(p.offset, geometry_.symbol_offset) << c.name;
    EXPECT_NE(p.detail.find(c.expect), std::string::npos) << c.name << ": " << p.detail;
  }
  // Stated compressed size past the area: the reader refuses before inflating.
  SymbolHeader()->stored_size = geometry_.symbol_size;
  RegionSnapshot s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kSymbolsBad), 1u);
  EXPECT_FALSE(s.symbols.present);
  // A generation from the future, and an unknown encoding.
  Lie(good.stored, good.raw_size, good.crc32);
  SymbolHeader()->boot_generation = 3;
  s = Read();
  EXPECT_EQ(s.issue_count(RegionIssue::kSymbolsBad), 1u);
  SymbolHeader()->boot_generation = 2;
  SymbolHeader()->encoding = 7;
  s = Read();
  EXPECT_EQ(HostSymbols(&s), "");
  EXPECT_EQ(s.issue_count(RegionIssue::kSymbolsBad), 1u);
}

TEST_F(RegionTextTest, Malicious_TextThatIsNotSymbolsOrCommsIsRefused) {
  const std::string lies[] = {
      std::string("ffffffff81000000 T _text\n\x01\x02 binary\n", 36),
      "ffffffff81000000 D data_is_not_text\n",
      "ffffffff81000000 T name with spaces\n",
      "ffffffff81000000 T ok\nno newline at the end",
      "12345678901234567 T too_many_digits\n",
      "ffffffff81000000 t f\t[unclosed\n",
      std::string("ffffffff81000000 T \0nul\n", 24),
  };
  for (const std::string& text : lies) {
    const EncodedText e = EncodeText(text);
    Lie(e.stored, e.raw_size, e.crc32);
    RegionSnapshot s = Read();
    EXPECT_EQ(HostSymbols(&s), "") << text;
    EXPECT_EQ(s.issue_count(RegionIssue::kSymbolsBad), 1u) << text;
  }
  // Comms: a pid that is no number, a name with control bytes.
  for (const std::string& text :
       {std::string("x1 init\n"), std::string("1 in\x1bit\n"), std::string("1\n")}) {
    ASSERT_TRUE(guest_->WriteTextArea(TextAreaKind::kComms, 2, EncodeText(text)).ok());
    RegionSnapshot s = Read();
    RegionTextCache cache;
    cache.Update(&s);
    EXPECT_EQ(cache.Text(TextAreaKind::kComms, 2), "") << text;
    EXPECT_EQ(s.issue_count(RegionIssue::kCommsBad), 1u) << text;
  }
}

TEST_F(RegionTextTest, Malicious_ZlibBombStopsAtTheStatedSize) {
  // 64 MiB of zeros compress to ~64 KB; the guest states 1000 bytes.
  const std::string zeros(64u << 20, '0');
  const EncodedText bomb = EncodeText(zeros);
  ASSERT_LT(bomb.stored.size(), geometry_.symbol_size - 64u);
  Lie(bomb.stored, 1000, bomb.crc32);
  const auto start = std::chrono::steady_clock::now();
  RegionSnapshot s = Read();
  EXPECT_EQ(HostSymbols(&s), "");
  EXPECT_EQ(s.issue_count(RegionIssue::kSymbolsBad), 1u);
  std::printf(
      "zlib bomb refused in %.2f ms\n",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
}

TEST_F(RegionTextTest, ABadRewriteKeepsTheLastGoodTextAndIsReportedOnce) {
  RegionTextCache cache;
  RegionSnapshot s = Read();
  cache.Update(&s);
  ASSERT_EQ(cache.Text(TextAreaKind::kComms, 2), kComms);
  auto* h = reinterpret_cast<region::TextAreaHeader*>(mem_.data() + geometry_.comm_offset);
  h->crc32 ^= 0xff;
  h->seq += 2;
  for (int i = 0; i < 3; ++i) {
    RegionSnapshot again = Read();
    const auto notes = cache.Update(&again);
    EXPECT_EQ(again.issue_count(RegionIssue::kCommsBad), i == 0 ? 1u : 0u) << "look " << i;
    EXPECT_EQ(notes.size(), i == 0 ? 1u : 0u);
    EXPECT_EQ(cache.Text(TextAreaKind::kComms, 2), kComms);
  }
  // A good rewrite replaces it.
  ASSERT_TRUE(guest_->WriteTextArea(TextAreaKind::kComms, 2, EncodeText("7 other\n")).ok());
  RegionSnapshot later = Read();
  cache.Update(&later);
  EXPECT_EQ(cache.Text(TextAreaKind::kComms, 2), "7 other\n");
}

TEST_F(RegionTextTest, Malicious_SymbolRewritesOnEveryLookAreNotInflatedEveryTime) {
  // A boot's first good symbols are final: a later rewrite is not looked at.
  RegionTextCache cache;
  RegionSnapshot s = Read();
  cache.Update(&s);
  const EncodedText good = EncodeText(kSymbols);
  Lie(good.stored, good.raw_size, good.crc32 ^ 1);
  RegionSnapshot s1 = Read();
  cache.Update(&s1);
  EXPECT_EQ(s1.issue_count(RegionIssue::kSymbolsBad), 0u);
  EXPECT_EQ(cache.Text(TextAreaKind::kSymbols, 2), kSymbols);
  // Without good ones, a refused area is looked at again only after a
  // pause, however often its header changes.
  RegionTextCache fresh;
  int refused = 0;
  for (int i = 0; i < 45; ++i) {
    Lie(good.stored, good.raw_size, good.crc32 ^ static_cast<uint32_t>(i + 1));
    RegionSnapshot again = Read();
    fresh.Update(&again);
    refused += static_cast<int>(again.issue_count(RegionIssue::kSymbolsBad));
  }
  EXPECT_EQ(refused, 3) << "looks 0, 21 and 42";
  // An honest publish after the pause is taken.
  Lie(good.stored, good.raw_size, good.crc32);
  for (int i = 0; i < 25 && fresh.Text(TextAreaKind::kSymbols, 2).empty(); ++i) {
    RegionSnapshot again = Read();
    fresh.Update(&again);
  }
  EXPECT_EQ(fresh.Text(TextAreaKind::kSymbols, 2), kSymbols);
}

TEST_F(RegionTextTest, Malicious_RandomHeadersAndBytesNeverCrash) {
  std::mt19937_64 rng(7);
  const EncodedText good = EncodeText(kSymbols);
  for (int i = 0; i < 300; ++i) {  // Each look copies the 16 MiB region.
    std::vector<std::byte> stored = good.stored;
    for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) {
      stored[rng() % stored.size()] = static_cast<std::byte>(rng());
    }
    const uint32_t raw = rng() % 3 == 0 ? static_cast<uint32_t>(rng()) : good.raw_size;
    Lie(stored, raw % (1u << 20), rng() % 2 ? good.crc32 : static_cast<uint32_t>(rng()));
    if (rng() % 5 == 0) SymbolHeader()->stored_size = static_cast<uint32_t>(rng());
    RegionSnapshot s = Read();
    const std::string text = HostSymbols(&s);
    if (!text.empty()) {
      EXPECT_TRUE(CheckAreaText(TextAreaKind::kSymbols, text).ok());
    }
  }
}

}  // namespace
}  // namespace hvtrace
