#include "hvtrace/kernel_log.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace hvtrace {
namespace {

// dmesg's "[%5lu.%06lu]", written by hand: compared with snprintf's over
// the widths the seconds take, and a DmesgLine.
TEST(AppendDmesgStamp, PrintsAsSnprintfWould) {
  for (uint64_t ts : {uint64_t{0}, uint64_t{999}, uint64_t{1000}, uint64_t{2000},
                      uint64_t{123456789012}, uint64_t{99999999999999}, uint64_t{100000000000000},
                      uint64_t{1234567000000999}, ~uint64_t{0}}) {
    char want[64];
    std::snprintf(want, sizeof want, "[%5llu.%06llu]",
                  static_cast<unsigned long long>(ts / 1000000000),
                  static_cast<unsigned long long>(ts % 1000000000 / 1000));
    std::string got = "x";
    AppendDmesgStamp(ts, &got);
    EXPECT_EQ(got, std::string("x") + want) << ts;
  }
  KernelLogRecord r;
  r.ts_ns = 2500000;
  r.text = "sysrq: \x1b[2J";
  EXPECT_EQ(DmesgLine(r), "[    0.002500] sysrq: \\x1b[2J");
}

TEST(PrintableLogText, PrintableAsciiAndUtf8PassUnchanged) {
  EXPECT_EQ(PrintableLogText("Kernel panic - not syncing: sysrq triggered crash"),
            "Kernel panic - not syncing: sysrq triggered crash");
  // é (2 bytes), € (3 bytes), 😀 (4 bytes).
  EXPECT_EQ(PrintableLogText("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
}

TEST(PrintableLogText, Malicious_TerminalEscapesAreNeverRaw) {
  // ESC [ 2 J clears a screen; ESC ] 0 ; sets a title; BEL, CR, tab, DEL.
  EXPECT_EQ(PrintableLogText("\x1b[2Jx\x1b]0;pwned\x07\r\t\x7f"),
            "\\x1b[2Jx\\x1b]0;pwned\\x07\\x0d\\x09\\x7f");
  // The 8-bit CSI, alone and UTF-8 encoded (U+009B): both escaped.
  EXPECT_EQ(PrintableLogText("\x9b"
                             "31m"),
            "\\x9b31m");
  EXPECT_EQ(PrintableLogText("\xc2\x9b"
                             "31m"),
            "\\xc2\\x9b31m");
  EXPECT_EQ(PrintableLogText(std::string("a\0b", 3)), "a\\x00b");
}

TEST(PrintableLogText, Malicious_InvalidUtf8IsEscapedBytewise) {
  // Overlong '/', a lone continuation byte, a surrogate, a truncated
  // sequence at the end, and a code point past U+10FFFF.
  EXPECT_EQ(PrintableLogText("\xc0\xaf"), "\\xc0\\xaf");
  EXPECT_EQ(PrintableLogText("\x80x"), "\\x80x");
  EXPECT_EQ(PrintableLogText("\xed\xa0\x80"), "\\xed\\xa0\\x80");
  EXPECT_EQ(PrintableLogText("ok\xe2\x82"), "ok\\xe2\\x82");
  EXPECT_EQ(PrintableLogText("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");
}

// An event line: only the part from |from| on is touched, newlines and
// tabs stay (multi-line events), everything a terminal would obey is \xNN.
TEST(MakePrintableFrom, Malicious_EscapesTheTailKeepingNewlinesAndTabs) {
  std::string text = "\x1bkept before; ";
  const size_t from = text.size();
  text += "sh-1 [000] 1.0: print: a\x1b[2Jb\tc\x07\n => d\xc2\x9b\xe2\x82\xac\n";
  MakePrintableFrom(&text, from);
  EXPECT_EQ(text,
            "\x1bkept before; sh-1 [000] 1.0: print: a\\x1b[2Jb\tc\\x07\n => "
            "d\\xc2\\x9b\xe2\x82\xac\n");
  std::string plain = "sh-1 [000] 1.0: print: hello\n";
  const std::string before = plain;
  MakePrintableFrom(&plain, 0);
  EXPECT_EQ(plain, before);
}

// The scan reads sixteen bytes at a time and a line's last partial block as
// the sixteen bytes that end it: every byte value, at every position of
// lines that fill no block, one, one and a bit, and several, is found and
// escaped exactly as the byte-wise rule says (a lone byte >= 0x80 is
// invalid UTF-8, so it is escaped too); the line's own '\n' at its end.
TEST(MakePrintableFrom, Malicious_EveryByteAtEveryPositionOfTheWordScan) {
  for (size_t length : {1u, 8u, 15u, 16u, 17u, 31u, 32u, 33u, 47u}) {
    for (size_t at = 0; at < length; ++at) {
      for (int value = 0; value < 256; ++value) {
        std::string text = "xyz" + std::string(length, 'a') + "\n";
        text[3 + at] = static_cast<char>(value);
        MakePrintableFrom(&text, 3);
        const bool kept = (value >= 0x20 && value < 0x7f) || value == '\n' || value == '\t';
        char escaped[16];
        std::snprintf(escaped, sizeof escaped, "\\x%02x", value);
        const std::string want = "xyz" + std::string(at, 'a') +
                                 (kept ? std::string(1, static_cast<char>(value)) : escaped) +
                                 std::string(length - at - 1, 'a') + "\n";
        ASSERT_EQ(text, want) << "length " << length << ", byte 0x" << std::hex << value << " at "
                              << std::dec << at;
      }
    }
  }
}

}  // namespace
}  // namespace hvtrace
