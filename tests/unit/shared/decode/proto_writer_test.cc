#include "hvtrace/proto_writer.h"

#include <gtest/gtest.h>

#include <string>

#include "shared/decode/perfetto_reader.h"

namespace hvtrace {
namespace {

TEST(ProtoWriter, VarintsAsTheEncodingGuideWritesThem) {
  ProtoBuffer out;
  ProtoWriter w(&out);
  w.Varint(1, 150);  // The guide's example: 08 96 01.
  EXPECT_EQ(out.view(), std::string("\x08\x96\x01", 3));
  out.clear();
  w.Signed(2, -1);  // int32/int64 -1: ten bytes, all 0xff but the last 0x01.
  EXPECT_EQ(out.view(), std::string("\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11));
  out.clear();
  w.Varint(327, 0);  // A key above 15 takes two bytes: (327 << 3) | 0 = 2616.
  EXPECT_EQ(out.view(), std::string("\xb8\x14\x00", 3));
}

TEST(ProtoWriter, NestedMessagesAreBackPatchedAndParse) {
  ProtoBuffer out;
  ProtoWriter w(&out);
  const size_t outer = w.BeginNested(1);
  w.Bytes(2, "abc");
  const size_t inner = w.BeginNested(3);
  w.Varint(4, 300);
  ASSERT_TRUE(w.EndNested(inner));
  ASSERT_TRUE(w.EndNested(outer));
  auto top = test::ParseWire(out.view());
  ASSERT_TRUE(top.has_value());
  ASSERT_EQ(top->size(), 1u);
  auto fields = test::ParseWire((*top)[0].bytes);
  ASSERT_TRUE(fields.has_value());
  ASSERT_EQ(fields->size(), 2u);
  EXPECT_EQ((*fields)[0].bytes, "abc");
  auto in = test::ParseWire((*fields)[1].bytes);
  ASSERT_TRUE(in.has_value());
  ASSERT_EQ(in->size(), 1u);
  EXPECT_EQ((*in)[0].number, 4u);
  EXPECT_EQ((*in)[0].value, 300u);
}

TEST(ProtoWriter, CompactLengthsTakeTheFewestBytes) {
  ProtoBuffer out;
  ProtoWriter w(&out);
  size_t m = w.BeginCompact(1);
  w.Varint(2, 1);
  w.EndCompact(m);
  EXPECT_EQ(out.view(), std::string("\x0a\x02\x10\x01", 4));
  // 203 bytes of body (an inner message of 156, a string of 47): the length
  // (cb 01) needs a second byte, so the body moves by one; so does the
  // inner message's (153 bytes).
  out.clear();
  m = w.BeginCompact(1);
  const size_t inner = w.BeginCompact(3);
  w.Bytes(4, std::string(150, 'x'));
  w.EndCompact(inner);
  w.Bytes(5, std::string(45, 'y'));
  w.EndCompact(m);
  ASSERT_EQ(out.size(), 1 + 2 + 203u);
  EXPECT_EQ(out.view().substr(0, 3), std::string("\x0a\xcb\x01", 3));
  auto top = test::ParseWire(out.view());
  ASSERT_TRUE(top.has_value());
  ASSERT_EQ(top->size(), 1u);
  auto fields = test::ParseWire((*top)[0].bytes);
  ASSERT_TRUE(fields.has_value());
  ASSERT_EQ(fields->size(), 2u);
  EXPECT_EQ((*fields)[1].bytes, std::string(45, 'y'));
  auto in = test::ParseWire((*fields)[0].bytes);
  ASSERT_TRUE(in.has_value());
  ASSERT_EQ(in->size(), 1u);
  EXPECT_EQ((*in)[0].bytes, std::string(150, 'x'));
}

TEST(ProtoWriter, Malicious_InvalidUtf8IsReplaced) {
  EXPECT_EQ(ValidUtf8("ok \xc3\xa9"), "ok \xc3\xa9");
  EXPECT_EQ(ValidUtf8("\xff"), "\xef\xbf\xbd");
  EXPECT_EQ(ValidUtf8("\xc0\x80"), "\xef\xbf\xbd\xef\xbf\xbd");                  // Overlong NUL.
  EXPECT_EQ(ValidUtf8("\xed\xa0\x80"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // A surrogate.
  EXPECT_EQ(ValidUtf8("a\xe2\x82"), "a\xef\xbf\xbd\xef\xbf\xbd");                // Cut short.
  ProtoBuffer out;
  ProtoWriter w(&out);
  w.String(1, "\x80x");
  EXPECT_EQ(out.view(), std::string("\x0a\x04\xef\xbf\xbdx", 6));
}

}  // namespace
}  // namespace hvtrace
