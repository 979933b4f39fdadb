// The leaving handshake's payloads (kLeaving, kAck) and the frame decoder's
// direction rule, against a hostile guest (the host parses its notice) and a
// confused host (the agent parses its ack).
#include "hvtrace/meta_leaving.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hvtrace/meta_channel.h"

namespace hvtrace::meta {
namespace {

const BootId kBoot = *ParseBootId("0123abcd-4567-89ef-0123-456789abcdef");

std::string WithByte(std::string payload, size_t at, uint8_t value) {
  payload[at] = static_cast<char>(value);
  return payload;
}

TEST(MetaLeavingTest, NoticeAndAckRoundTripInSixteenBytes) {
  const std::string notice =
      EncodeLeaveNotice({LeaveReason::kStopSignal, 2000, 0x1122334455667788});
  ASSERT_EQ(notice.size(), kLeavePayloadSize);
  Result<LeaveNotice> n = ParseLeaveNotice(notice);
  ASSERT_TRUE(n.ok()) << n.error().message;
  EXPECT_EQ(n->reason, LeaveReason::kStopSignal);
  EXPECT_EQ(n->wait_ms, 2000u);
  EXPECT_EQ(n->nonce, 0x1122334455667788u);
  // Little-endian on the wire, whatever the host: version 1 first.
  EXPECT_EQ(notice[0], 1);
  EXPECT_EQ(notice[8], static_cast<char>(0x88));

  for (AckStatus status : {AckStatus::kCopied, AckStatus::kNotCopied}) {
    Result<LeaveAck> a = ParseLeaveAck(EncodeLeaveAck({status, 123, 42}));
    ASSERT_TRUE(a.ok()) << a.error().message;
    EXPECT_EQ(a->status, status);
    EXPECT_EQ(a->host_ms, 123u);
    EXPECT_EQ(a->nonce, 42u);
  }
}

TEST(MetaLeavingTest, Malicious_WrongSizesVersionsReasonsAndWaitsAreRefused) {
  const std::string good = EncodeLeaveNotice({LeaveReason::kStopSignal, 2000, 7});
  EXPECT_FALSE(ParseLeaveNotice("").ok());
  EXPECT_FALSE(ParseLeaveNotice(good.substr(0, 15)).ok());
  EXPECT_FALSE(ParseLeaveNotice(good + "x").ok());
  Result<LeaveNotice> version = ParseLeaveNotice(WithByte(good, 0, 2));
  ASSERT_FALSE(version.ok());
  EXPECT_NE(version.error().message.find("version 2 unknown"), std::string::npos);
  Result<LeaveNotice> reason = ParseLeaveNotice(WithByte(good, 2, 0xff));
  ASSERT_FALSE(reason.ok());
  EXPECT_NE(reason.error().message.find("reason 255 unknown"), std::string::npos);
  EXPECT_FALSE(ParseLeaveNotice(WithByte(good, 2, 0)).ok());
  // A guest asking the host to believe it waits for ever.
  Result<LeaveNotice> wait =
      ParseLeaveNotice(EncodeLeaveNotice({LeaveReason::kStopSignal, 0xffffffffu, 7}));
  ASSERT_FALSE(wait.ok());
  EXPECT_NE(wait.error().message.find("the most is 60000"), std::string::npos)
      << wait.error().message;
  EXPECT_TRUE(
      ParseLeaveNotice(EncodeLeaveNotice({LeaveReason::kStopSignal, kMaxLeaveWaitMs, 7})).ok());

  const std::string ack = EncodeLeaveAck({AckStatus::kCopied, 5, 7});
  EXPECT_FALSE(ParseLeaveAck(ack.substr(1)).ok());
  EXPECT_FALSE(ParseLeaveAck(WithByte(ack, 1, 1)).ok());  // Version 257.
  Result<LeaveAck> status = ParseLeaveAck(WithByte(ack, 2, 9));
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("status 9 unknown"), std::string::npos);
}

std::vector<Result<MetaFrame>> Decode(MetaDirection direction, const std::vector<std::byte>& in) {
  MetaDecoder d(direction);
  d.Feed(in);
  std::vector<Result<MetaFrame>> out;
  while (auto f = d.Next()) out.push_back(std::move(*f));
  return out;
}

// Each side takes only its direction's frames: a guest's ack is not parsed by
// the host, and a host cannot make the agent buffer a boot archive.
TEST(MetaLeavingTest, Malicious_EachDirectionRefusesTheOthersFrames) {
  const auto notice = EncodeMetaFrame(
      MetaType::kLeaving, kBoot, 3, EncodeLeaveNotice({LeaveReason::kStopSignal, 2000, 7}), false);
  const auto ack =
      EncodeMetaFrame(MetaType::kAck, kBoot, 0, EncodeLeaveAck({AckStatus::kCopied, 1, 7}), false);
  const auto boot = EncodeMetaFrame(MetaType::kBoot, kBoot, 0, "archive", true);

  auto to_host = Decode(MetaDirection::kToHost, notice);
  ASSERT_EQ(to_host.size(), 1u);
  ASSERT_TRUE(to_host[0].ok()) << to_host[0].error().message;
  EXPECT_EQ(to_host[0]->type, MetaType::kLeaving);
  auto ack_at_host = Decode(MetaDirection::kToHost, ack);
  ASSERT_FALSE(ack_at_host.empty());
  ASSERT_FALSE(ack_at_host[0].ok());
  EXPECT_NE(ack_at_host[0].error().message.find("type 5 goes to the guest"), std::string::npos)
      << ack_at_host[0].error().message;

  auto to_guest = Decode(MetaDirection::kToGuest, ack);
  ASSERT_EQ(to_guest.size(), 1u);
  ASSERT_TRUE(to_guest[0].ok()) << to_guest[0].error().message;
  for (const auto* wrong : {&notice, &boot}) {
    auto refused = Decode(MetaDirection::kToGuest, *wrong);
    ASSERT_FALSE(refused.empty());
    ASSERT_FALSE(refused[0].ok());
    EXPECT_NE(refused[0].error().message.find("goes to the host"), std::string::npos)
        << refused[0].error().message;
  }
}

// A notice that claims more than its 16 bytes is refused by its header,
// before anything is allocated for it.
TEST(MetaLeavingTest, Malicious_AnOversizedNoticeIsRefusedByItsHeader) {
  auto f = EncodeMetaFrame(MetaType::kLeaving, kBoot, 0, std::string(64, 'x'), false);
  auto frames = Decode(MetaDirection::kToHost, f);
  ASSERT_FALSE(frames.empty());
  ASSERT_FALSE(frames[0].ok());
  EXPECT_NE(frames[0].error().message.find("the limit is 16"), std::string::npos)
      << frames[0].error().message;
}

}  // namespace
}  // namespace hvtrace::meta
