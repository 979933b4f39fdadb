// A guest that raises its boot generation on every look, each time with a
// large symbol text: what a stream keeps stays bounded (region_stream.h,
// Memory; hvtrace/region_text.h), and a text that would pass the
// process-wide limit is refused with a note.
#include <gtest/gtest.h>

#include "hostd/decode/region_capture_fixture.h"

namespace hvtrace::hostd {
namespace {

// |bytes| of kallsyms-shaped text that compresses to almost nothing.
std::string LargeSymbols(size_t bytes) {
  const std::string line = "ffffffff81000000 T same_symbol_name_on_every_line\n";
  std::string text;
  text.reserve(bytes + line.size());
  while (text.size() < bytes) text += line;
  return text;
}

// This file's own suite name: the unit tests of hostd/ share one
// executable, and GoogleTest refuses one suite name for fixtures of
// different translation units.
using RegionStreamMemoryTest = RegionCaptureTest;

TEST_F(RegionStreamMemoryTest, Malicious_GenerationRaisedOnEveryLookKeepsTwoGenerations) {
  const std::string symbols = LargeSymbols(4u << 20);
  const EncodedText encoded = EncodeText(symbols);
  ASSERT_LT(encoded.stored.size(), geometry_.symbol_size);
  RegionStreamer st(geometry_, RegionStreamOptions{false, true, std::chrono::milliseconds(1000)});
  constexpr uint32_t kLooks = 120;
  size_t inflated = 0, most_decoders = 0, most_texts = 0;
  uint64_t most_held = 0, events = 0;
  for (uint32_t gen = 2; gen < 2 + kLooks; ++gen) {
    region::GuestIdentity id{};
    id.boot_generation = gen;
    std::strcpy(id.kernel_release, "6.12.9-test");
    id.nr_cpus = 2;
    id.trace_clock = region::kClockMono;
    id.page_size = 4096;
    guest_->WriteIdentity(id);
    ASSERT_TRUE(guest_->WriteTextArea(TextAreaKind::kSymbols, gen, encoded).ok());
    WriteDwPage(0, gen, 3, 1000 * gen, gen);
    RegionSnapshot s = Read();
    auto out = st.Feed(&s, T(static_cast<int>(gen) * 50), true);
    events += out.events;
    for (const std::string& note : out.notes) inflated += note.find("guest kernel symbols") == 0;
    most_decoders = std::max(most_decoders, st.decoders_kept());
    most_texts = std::max(most_texts, st.texts().generations_kept(TextAreaKind::kSymbols));
    most_held = std::max(most_held, st.texts().held_bytes());
  }
  std::printf(
      "[stream memory] %u generations, %zu MiB symbols each: %zu inflated, at most %zu "
      "decoders and %zu symbol texts (%.1f MiB) kept, %llu events printed\n",
      kLooks, symbols.size() >> 20, inflated, most_decoders, most_texts,
      static_cast<double>(most_held) / (1 << 20), static_cast<unsigned long long>(events));
  EXPECT_LE(most_decoders, RegionStreamer::kDecoderGenerationsKept);
  EXPECT_LE(most_texts, kTextGenerationsKept);
  EXPECT_LE(most_held, kTextGenerationsKept * (symbols.size() + (8u << 10)));
  // One inflate per pause (kSymbolRetryLooks looks), not one per look.
  EXPECT_GE(inflated, 1u);
  EXPECT_LE(inflated, kLooks / 20 + 1);
  EXPECT_GT(events, 0u) << "the stream still prints every generation's events";
}

TEST_F(RegionStreamMemoryTest, Malicious_TextsOfEveryCacheTogetherStayWithinTheProcessLimit) {
  const std::string symbols = LargeSymbols(16u << 20);
  const EncodedText encoded = EncodeText(symbols);
  ASSERT_LT(encoded.stored.size(), geometry_.symbol_size);
  ASSERT_TRUE(guest_->WriteTextArea(TextAreaKind::kSymbols, 1, encoded).ok());
  const uint64_t before = RegionTextCache::process_held_bytes();
  std::vector<std::unique_ptr<RegionTextCache>> caches;
  size_t kept = 0, refused = 0;
  std::string refusal;
  for (size_t i = 0; i < kMaxTextHeld / symbols.size() + 2; ++i) {
    caches.push_back(std::make_unique<RegionTextCache>());
    RegionSnapshot s = Read();
    for (const std::string& note : caches.back()->Update(&s)) {
      if (note.find("not kept") != std::string::npos) {
        ++refused;
        refusal = note;
      }
    }
    kept += !caches.back()->Text(TextAreaKind::kSymbols, 1).empty();
    EXPECT_LE(RegionTextCache::process_held_bytes(), kMaxTextHeld);
  }
  std::printf("[stream memory] %zu caches: %zu kept the %zu MiB text, %zu refused: %s\n",
              caches.size(), kept, symbols.size() >> 20, refused, refusal.c_str());
  EXPECT_GE(refused, 2u);
  EXPECT_NE(refusal.find("limit 256 MiB"), std::string::npos) << refusal;
  caches.clear();
  EXPECT_EQ(RegionTextCache::process_held_bytes(), before) << "every cache gives back what it held";
}

}  // namespace
}  // namespace hvtrace::hostd
