// The metadata channel's frame codec against what a hostile guest sends:
// round trips, byte-at-a-time delivery, garbage between frames, corrupted
// headers and payloads, sizes over the caps, and zlib bombs.
#include "hvtrace/meta_channel.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <string>
#include <vector>

#include "test_support.h"

namespace hvtrace::meta {
namespace {

const BootId kBoot = *ParseBootId("0123abcd-4567-89ef-0123-456789abcdef");

std::vector<Result<MetaFrame>> DecodeAll(std::span<const std::byte> bytes, size_t chunk) {
  MetaDecoder d;
  std::vector<Result<MetaFrame>> out;
  for (size_t i = 0; i < bytes.size(); i += chunk) {
    d.Feed(bytes.subspan(i, std::min(chunk, bytes.size() - i)));
    while (auto f = d.Next()) out.push_back(std::move(*f));
  }
  return out;
}

using test_support::Bytes;

TEST(MetaChannelTest, BootIdRoundTripsAndRejectsMalformedText) {
  EXPECT_EQ(BootIdString(kBoot), "0123abcd-4567-89ef-0123-456789abcdef");
  EXPECT_TRUE(ParseBootId("0123abcd-4567-89ef-0123-456789abcdef\n").has_value());
  EXPECT_FALSE(ParseBootId("0123abcd-4567-89ef-0123-456789abcde").has_value());
  EXPECT_FALSE(ParseBootId("0123abcd_4567-89ef-0123-456789abcdef").has_value());
  EXPECT_FALSE(ParseBootId("0123ABCD-4567-89ef-0123-456789abcdef").has_value());
}

TEST(MetaChannelTest, FramesRoundTripWhetherWholeOrByteByByte) {
  std::string big(300000, 'k');
  for (size_t i = 0; i < big.size(); i += 7) big[i] = static_cast<char>('a' + i % 26);
  std::vector<std::byte> stream = EncodeMetaFrame(MetaType::kBoot, kBoot, 0, big, true);
  for (const auto& f : {EncodeMetaFrame(MetaType::kComms, kBoot, 1, "1 init\n2 kthreadd\n", false),
                        EncodeMetaFrame(MetaType::kClock, kBoot, 2, "{}", true)}) {
    stream.insert(stream.end(), f.begin(), f.end());
  }
  for (size_t chunk : {stream.size(), size_t{1}, size_t{4093}}) {
    auto frames = DecodeAll(stream, chunk);
    ASSERT_EQ(frames.size(), 3u) << "chunk " << chunk;
    for (const auto& f : frames) ASSERT_TRUE(f.ok()) << f.error().message;
    EXPECT_EQ(frames[0]->type, MetaType::kBoot);
    EXPECT_EQ(frames[0]->payload, big);
    EXPECT_EQ(frames[0]->boot_id, kBoot);
    EXPECT_EQ(frames[1]->payload, "1 init\n2 kthreadd\n");
    EXPECT_EQ(frames[1]->sequence, 1u);
    EXPECT_EQ(frames[2]->payload, "{}");
  }
}

TEST(MetaChannelTest, Malicious_GarbageAndACutFrameCostOnlyThemselves) {
  std::vector<std::byte> stream = Bytes("junk before HVT");
  // A frame cut in its payload (a guest rebooted mid-write); its header
  // claims the bytes of the frames after it, which must still decode.
  std::vector<std::byte> cut =
      EncodeMetaFrame(MetaType::kComms, kBoot, 1, std::string(100, 'x'), false);
  stream.insert(stream.end(), cut.begin(), cut.begin() + 60);
  for (uint32_t seq : {0u, 1u, 2u}) {
    std::vector<std::byte> f = EncodeMetaFrame(MetaType::kComms, kBoot, seq, "2 b\n", false);
    stream.insert(stream.end(), f.begin(), f.end());
  }
  auto frames = DecodeAll(stream, 7);
  std::vector<uint32_t> good;
  size_t bad = 0;
  for (const auto& f : frames) {
    if (!f.ok()) {
      ++bad;
      continue;
    }
    EXPECT_EQ(f->payload, "2 b\n");
    good.push_back(f->sequence);
  }
  EXPECT_EQ(good, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_GE(bad, 2u);  // The junk and the cut frame.
}

// Sets a header field and signs the header again, as a cunning guest would.
void Patch32(std::vector<std::byte>& frame, size_t off, uint32_t v) {
  std::memcpy(frame.data() + off, &v, 4);
  const uint32_t crc =
      static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(frame.data()), 44));
  std::memcpy(frame.data() + 44, &crc, 4);
}

std::string FirstError(const std::vector<std::byte>& frame) {
  auto frames = DecodeAll(frame, frame.size());
  if (frames.empty()) return "no frame";
  return frames[0].ok() ? "accepted" : frames[0].error().message;
}

TEST(MetaChannelTest, Malicious_AHeaderThatDoesNotMatchItsCrcIsSkipped) {
  std::vector<std::byte> f = EncodeMetaFrame(MetaType::kComms, kBoot, 0, "1 a\n", false);
  f[16] = std::byte{0x7f};
  EXPECT_NE(FirstError(f).find("header CRC"), std::string::npos) << FirstError(f);
}

TEST(MetaChannelTest, Malicious_SizesOverTheCapsAreRefusedBeforeAllocating) {
  std::vector<std::byte> f = EncodeMetaFrame(MetaType::kComms, kBoot, 0, "1 a\n", true);
  Patch32(f, 16, kMaxCommsRaw + 1);
  EXPECT_NE(FirstError(f).find("the limit is"), std::string::npos) << FirstError(f);
  std::vector<std::byte> g = EncodeMetaFrame(MetaType::kBoot, kBoot, 0, "x", true);
  Patch32(g, 12, kMaxStored + 1);
  EXPECT_NE(FirstError(g).find("too large"), std::string::npos) << FirstError(g);
  std::vector<std::byte> h = EncodeMetaFrame(MetaType::kBoot, kBoot, 0, "xy", false);
  Patch32(h, 16, 1);
  EXPECT_NE(FirstError(h).find("stored size != raw size"), std::string::npos) << FirstError(h);
}

TEST(MetaChannelTest, Malicious_AZlibBombInflatesNoFurtherThanItsStatedSize) {
  std::vector<std::byte> f =
      EncodeMetaFrame(MetaType::kBoot, kBoot, 0, std::string(64u << 20, '\0'), true);
  ASSERT_LT(f.size(), 1u << 20);
  Patch32(f, 16, 1024);
  EXPECT_NE(FirstError(f).find("more than the stated 1024"), std::string::npos) << FirstError(f);
}

TEST(MetaChannelTest, Malicious_APayloadThatDoesNotMatchItsCrcIsRefused) {
  std::vector<std::byte> f = EncodeMetaFrame(MetaType::kComms, kBoot, 0, "1 init\n", false);
  f.back() = std::byte{'X'};
  EXPECT_NE(FirstError(f).find("payload CRC"), std::string::npos) << FirstError(f);
}

TEST(MetaChannelTest, Malicious_UnknownTypeVersionAndFlagsAreRefused) {
  const std::vector<std::byte> f = EncodeMetaFrame(MetaType::kComms, kBoot, 0, "x", false);
  std::vector<std::byte> type = f, version = f, flags = f;
  Patch32(type, 4, kMetaFrameVersion | (99u << 16));
  EXPECT_NE(FirstError(type).find("type 99 unknown"), std::string::npos) << FirstError(type);
  Patch32(version, 4, 7u | (2u << 16));
  EXPECT_NE(FirstError(version).find("version 7"), std::string::npos) << FirstError(version);
  Patch32(flags, 8, 0x10);
  EXPECT_NE(FirstError(flags).find("unknown flags"), std::string::npos) << FirstError(flags);
}

}  // namespace
}  // namespace hvtrace::meta
