#include "hvtrace/format.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace hvtrace {
namespace {

std::string ReadFixture(const std::string& name) {
  std::ifstream in(std::string(HVTRACE_FIXTURES_DIR) + "/fuzz/format/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(FormatTest, ParsesRealSchedSwitch) {
  std::string text = ReadFixture("sched_sched_switch.format");
  ASSERT_FALSE(text.empty());
  auto ev = ParseEventFormat("sched", text);
  ASSERT_TRUE(ev.ok()) << ev.error().message;
  EXPECT_EQ(ev->system, "sched");
  EXPECT_EQ(ev->name, "sched_switch");
  ASSERT_EQ(ev->fields.size(), 11u);
  EXPECT_EQ(ev->fields[0].name, "common_type");
  EXPECT_EQ(ev->fields[0].type, "unsigned short");
  EXPECT_TRUE(ev->fields[0].is_common);
  EXPECT_FALSE(ev->fields[4].is_common);
  const FieldFormat* comm = ev->FindField("prev_comm");
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->type, "char[16]");
  EXPECT_EQ(comm->kind, FieldKind::kArray);
  EXPECT_EQ(comm->array_length, 16u);
  EXPECT_EQ(comm->offset, 8u);
  EXPECT_EQ(comm->size, 16u);
  const FieldFormat* pid = ev->FindField("prev_pid");
  ASSERT_NE(pid, nullptr);
  EXPECT_EQ(pid->type, "pid_t");
  EXPECT_TRUE(pid->is_signed);
  EXPECT_TRUE(ev->print_fmt.starts_with("\"prev_comm=%s prev_pid=%d"));
  EXPECT_TRUE(ev->print_fmt.ends_with("REC->next_prio"));
}

TEST(FormatTest, ParsesDynamicAndOpenArrays) {
  auto irq = ParseEventFormat("irq", ReadFixture("irq_irq_handler_entry.format"));
  ASSERT_TRUE(irq.ok()) << irq.error().message;
  const FieldFormat* name = irq->FindField("name");
  ASSERT_NE(name, nullptr);
  EXPECT_EQ(name->kind, FieldKind::kDataLoc);
  EXPECT_EQ(name->type, "__data_loc char[]");
  EXPECT_EQ(name->size, 4u);

  auto print = ParseEventFormat("ftrace", ReadFixture("ftrace_print.format"));
  ASSERT_TRUE(print.ok()) << print.error().message;
  const FieldFormat* buf = print->FindField("buf");
  ASSERT_NE(buf, nullptr);
  EXPECT_EQ(buf->kind, FieldKind::kArray);
  EXPECT_EQ(buf->array_length, 0u);
  EXPECT_EQ(buf->size, 0u);

  auto bprint = ParseEventFormat("ftrace", ReadFixture("ftrace_bprint.format"));
  ASSERT_TRUE(bprint.ok()) << bprint.error().message;
  EXPECT_EQ(bprint->FindField("fmt")->type, "const char *");
}

TEST(FormatTest, ParsesEveryFixture) {
  for (const char* f : {"ftrace_function.format", "irq_softirq_entry.format", "kmem_kmalloc.format",
                        "sched_sched_wakeup.format", "syscalls_sys_enter_openat.format",
                        "timer_hrtimer_start.format"}) {
    auto ev = ParseEventFormat("x", ReadFixture(f));
    EXPECT_TRUE(ev.ok()) << f << ": " << ev.error().message;
  }
}

// ScanEventFormatId gives, without parsing, the id ParseEventFormat gives
// whenever it succeeds (a decoder picks an event's format by it), on every
// format fixture, hostile ones included, and on texts cut at every line.
TEST(FormatTest, Malicious_ScannedIdIsTheParsedId) {
  const std::filesystem::path dir = std::string(HVTRACE_FIXTURES_DIR) + "/fuzz/format";
  size_t scanned = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string text = ReadFixture(entry.path().filename().string());
    std::vector<size_t> cuts = {text.size()};
    for (size_t nl = text.find('\n'); nl != std::string::npos; nl = text.find('\n', nl + 1))
      cuts.push_back(nl + 1);
    for (size_t cut : cuts) {
      const std::string_view part = std::string_view(text).substr(0, cut);
      auto ev = ParseEventFormat("x", part);
      std::optional<uint32_t> id = ScanEventFormatId(part);
      if (ev.ok()) {
        ASSERT_TRUE(id.has_value()) << entry.path() << " cut at " << cut;
        EXPECT_EQ(*id, ev->id) << entry.path() << " cut at " << cut;
        ++scanned;
      }
    }
  }
  EXPECT_GT(scanned, 10u);
}

TEST(FormatTest, ScannedIdIsTheFirstBeforeFormatOrNone) {
  const std::string fields = "\tfield:int a;\toffset:0;\tsize:4;\tsigned:1;\n";
  EXPECT_EQ(ScanEventFormatId("name: a\nID: 12\nformat:\n" + fields), 12u);
  EXPECT_EQ(ScanEventFormatId("\n  ID: 7 \nname: a\nformat:\n" + fields), 7u);
  // ParseEventFormat refuses a second ID; the first is as good as any.
  EXPECT_EQ(ScanEventFormatId("name: a\nID: 3\nID: 4\nformat:\n"), 3u);
  // Only the parser can tell: after "format:", out of range, not a number.
  // (The fields end at their second blank line.)
  const std::string late =
      "name: a\nformat:\n" + fields +
      "\n\tfield:int b;\toffset:4;\tsize:4;\tsigned:1;\n\nID: 9\nprint fmt: \"\"\n";
  EXPECT_EQ(ScanEventFormatId(late), std::nullopt);
  EXPECT_EQ(ScanEventFormatId("name: a\nID: 65536\nformat:\n"), std::nullopt);
  EXPECT_EQ(ScanEventFormatId("name: a\nID: 1x\nformat:\n"), std::nullopt);
  EXPECT_EQ(ScanEventFormatId("name: a\nprint fmt: \"ID: 1\"\n"), std::nullopt);
  EXPECT_EQ(ScanEventFormatId(""), std::nullopt);
  // The id after the fields: ParseEventFormat takes it, the scan leaves it.
  auto parsed = ParseEventFormat("x", late);
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(parsed->id, 9u);
}

TEST(FormatTest, HeaderPageAndHeaderEvent) {
  auto page = ParseHeaderPage(ReadFixture("header_page"));
  ASSERT_TRUE(page.ok()) << page.error().message;
  ASSERT_GE(page->size(), 3u);
  EXPECT_EQ((*page)[0].name, "timestamp");
  EXPECT_EQ((*page)[0].type, "u64");
  EXPECT_EQ((*page)[1].name, "commit");
  EXPECT_EQ((*page)[1].offset, 8u);
  EXPECT_EQ(page->back().name, "data");
  EXPECT_EQ(page->back().offset, 16u);

  auto header = ParseHeaderEvent(ReadFixture("header_event"));
  ASSERT_TRUE(header.ok()) << header.error().message;
  EXPECT_EQ(header->type_len_bits, 5u);
  EXPECT_EQ(header->time_delta_bits, 27u);
  EXPECT_EQ(header->padding_type, 29u);
  EXPECT_EQ(header->time_extend_type, 30u);
  EXPECT_EQ(header->time_stamp_type, 31u);
  EXPECT_EQ(header->data_max_type_len, 28u);
}

constexpr char kSmall[] =
    "name: tiny\n"
    "ID: 7\n"
    "format:\n"
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\n"
    "\tfield:int value;\toffset:8;\tsize:4;\tsigned:1;\n"
    "\n"
    "print fmt: \"value=%d\", REC->value\n";

TEST(FormatTest, SmallFormatRoundTrip) {
  auto ev = ParseEventFormat("test", kSmall);
  ASSERT_TRUE(ev.ok()) << ev.error().message;
  EXPECT_EQ(ev->id, 7u);
  ASSERT_EQ(ev->fields.size(), 2u);
  EXPECT_EQ(ev->print_fmt, "\"value=%d\", REC->value");
}

// Two u64 fields and |print| as the print format's arguments.
std::string WithDivision(const std::string& args) {
  return "name: div\nID: 9\nformat:\n"
         "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\n"
         "\tfield:u64 a;\toffset:8;\tsize:8;\tsigned:0;\n"
         "\tfield:u32 b;\toffset:16;\tsize:4;\tsigned:0;\n"
         "\tfield:char s[4];\toffset:20;\tsize:4;\tsigned:0;\n\n"
         "print fmt: \"%llu %% / %c\", " +
         args + ", '/'\n";
}

// libtraceevent divides without a zero check (SIGFPE at parse time for a
// constant 0, found by format_fuzzer; at print time for a field holding 0).
TEST(FormatTest, Malicious_DivisorsAreSorted) {
  struct Case {
    const char* args;
    std::vector<std::string> fields;
    bool unchecked;
  } cases[] = {
      // The kernel's own shapes (itimer_state, writeback, devfreq, dma).
      {"REC->a / 1000L", {}, false},
      {"(jiffies - REC->a) / 250", {}, false},
      {"REC->b == 0 ? 0 : (100 * REC->a) / REC->b", {"b"}, false},
      {"REC->a / sizeof(u64)", {}, false},
      {"REC->a % (REC->b)", {"b"}, false},
      {"REC->a / 0x10 + REC->a % 010", {}, false},
      // What would kill libtraceevent, or might.
      {"1 / 0", {}, true},
      {"1 % 0x0", {}, true},
      {"1 / (2 - 2)", {}, true},
      {"1 / 00UL", {}, true},
      {"1 / !5", {}, true},
      {"REC->a / (u8)REC->a", {}, true},
      {"REC->a / (REC->a - REC->b)", {}, true},
      {"REC->a / REC->s", {}, true},
      {"REC->a / sizeof(REC->s[0])", {}, true},
      {"REC->a / f(REC->b)", {}, true},
      {"REC->a / 1.5", {}, true},
  };
  for (const Case& c : cases) {
    auto ev = ParseEventFormat("test", WithDivision(c.args));
    ASSERT_TRUE(ev.ok()) << c.args << ": " << ev.error().message;
    EXPECT_EQ(ev->divisor_fields, c.fields) << c.args;
    EXPECT_EQ(!ev->unchecked_print.empty(), c.unchecked) << c.args << ": " << ev->unchecked_print;
  }
}

// libtraceevent reads as many bytes as a length argument says.
TEST(FormatTest, Malicious_LengthArgumentsAreSorted) {
  struct Case {
    const char* args;
    std::vector<std::string> fields;
    bool unchecked;
  } cases[] = {
      // The kernel's own shapes (cxl, dma, neigh, ras arm_event, i2c).
      {"__print_hex(REC->a, 0x20)", {}, false},
      {"__print_array(__get_dynamic_array(s), __get_dynamic_array_len(s) / sizeof(u64), "
       "sizeof(u64))",
       {},
       false},
      {"__print_hex_str(REC->s, REC->b)", {"b"}, false},
      {"__print_hex(__get_dynamic_array(s), (REC->b))", {"b"}, false},
      {"__print_array(REC->s, 4, 4)", {}, false},
      // Lengths nothing bounds.
      {"__print_hex(REC->s, 100000000)", {}, true},
      {"__print_hex(REC->s, REC->b * 2)", {}, true},
      {"__print_hex(REC->s, REC->s)", {}, true},
      {"__print_array(REC->s, 4)", {}, true},
      {"__print_array(REC->s, __get_dynamic_array_len(s) * 9, 1)", {}, true},
      {"__print_hex(REC->s, sizeof(u64) << 20)", {}, true},
      {"__print_hex(REC->s, 0x10000 * 0x10000)", {}, true},
      {"__print_hex(REC->s, (int) REC->b)", {"b"}, false},
      {"__print_hex(REC->s, (int)8 * 2)", {}, false},
  };
  for (const Case& c : cases) {
    auto ev = ParseEventFormat("test", WithDivision(c.args));
    ASSERT_TRUE(ev.ok()) << c.args << ": " << ev.error().message;
    EXPECT_EQ(ev->length_fields, c.fields) << c.args;
    EXPECT_EQ(!ev->unchecked_print.empty(), c.unchecked) << c.args << ": " << ev->unchecked_print;
  }
  // '*' takes the argument before its conversion's: here REC->b (width) and
  // REC->a (precision); "%%" takes none.
  auto star = ParseEventFormat("test",
                               "name: s\nID: 9\nformat:\n\tfield:unsigned short "
                               "common_type;\toffset:0;\tsize:2;\tsigned:0;\n\n"
                               "\tfield:u64 a;\toffset:8;\tsize:8;\tsigned:0;\n\tfield:u32 "
                               "b;\toffset:16;\tsize:4;\tsigned:0;\n"
                               "\tfield:char s[4];\toffset:20;\tsize:4;\tsigned:0;\n\n"
                               "print fmt: \"%% [%*phD] %.*s\", REC->b, REC->s, REC->a, REC->s\n");
  ASSERT_TRUE(star.ok()) << star.error().message;
  EXPECT_EQ(star->length_fields, (std::vector<std::string>{"b", "a"}));
  EXPECT_TRUE(star->unchecked_print.empty()) << star->unchecked_print;
}

// A width or precision written in the format is a length too: libtraceevent
// pays O(width^2) for it, so one past kMaxPrintLength keeps the print fmt
// away from libtraceevent (format_fuzzer found "%3000000d" taking > 10 s).
TEST(FormatTest, HugeLiteralWidthIsUnchecked) {
  auto with = [](const std::string& conv) {
    return ParseEventFormat("test",
                            "name: w\nID: 9\nformat:\n\tfield:unsigned short "
                            "common_type;\toffset:0;\tsize:2;\tsigned:0;\n\n"
                            "\tfield:u32 b;\toffset:8;\tsize:4;\tsigned:0;\n\n"
                            "print fmt: \"b=" +
                                conv + "\", REC->b\n");
  };
  for (const char* ok : {"%65536u", "%-8.3u", "%08x", "%%3000000d%u"}) {
    auto ev = with(ok);
    ASSERT_TRUE(ev.ok()) << ok << ": " << ev.error().message;
    EXPECT_TRUE(ev->unchecked_print.empty()) << ok << ": " << ev->unchecked_print;
  }
  for (const char* huge : {"%65537u", "%.3000000u", "%99999999999999999999999u"}) {
    auto ev = with(huge);
    ASSERT_TRUE(ev.ok()) << huge << ": " << ev.error().message;
    EXPECT_NE(ev->unchecked_print.find("larger than 65536"), std::string::npos)
        << huge << ": " << ev->unchecked_print;
  }
}

// Hostile text: every rejection names the event and line.
TEST(FormatTest, Malicious_Rejected) {
  struct Case {
    const char* what;
    std::string text;
  } cases[] = {
      {"no name", "ID: 1\nformat:\n"},
      {"no id", "name: x\nformat:\n"},
      {"id too big", "name: x\nID: 70000\nformat:\n"},
      {"negative offset",
       "name: x\nID: 1\nformat:\n\tfield:int a;\toffset:-1;\tsize:4;\tsigned:1;\n"},
      {"huge size",
       "name: x\nID: 1\nformat:\n\tfield:char a[99];\toffset:0;\tsize:4294967295;\tsigned:0;\n"},
      {"offset + size past limit",
       "name: x\nID: 1\nformat:\n\tfield:char a[9];\toffset:1048570;\tsize:100;\tsigned:0;\n"},
      {"scalar of 3 kB",
       "name: x\nID: 1\nformat:\n\tfield:int a;\toffset:0;\tsize:3000;\tsigned:0;\n"},
      {"no semicolon", "name: x\nID: 1\nformat:\n\tfield:int a\toffset:0;\tsize:4;\n"},
      {"no field name", "name: x\nID: 1\nformat:\n\tfield:;\toffset:0;\tsize:4;\n"},
      {"type missing", "name: x\nID: 1\nformat:\n\tfield:a;\toffset:0;\tsize:4;\n"},
      {"duplicate field",
       "name: x\nID: 1\nformat:\n\tfield:int a;\toffset:0;\tsize:4;\n\tfield:int "
       "a;\toffset:4;\tsize:4;\n"},
      {"garbage line", "name: x\nID: 1\nhello\n"},
      {"nul byte", std::string("name: x\nID: 1\0\nformat:\n", 22)},
      {"name with slash", "name: ../x\nID: 1\nformat:\n"},
      {"signed 2", "name: x\nID: 1\nformat:\n\tfield:int a;\toffset:0;\tsize:4;\tsigned:2;\n"},
      {"data_loc of size 9",
       "name: x\nID: 1\nformat:\n\tfield:__data_loc char[] a;\toffset:0;\tsize:9;\tsigned:0;\n"},
      // libtraceevent reads a 2-byte one past the record (format_fuzzer).
      {"data_loc of size 2",
       "name: x\nID: 1\nformat:\n\tfield:__data_loc char[] a;\toffset:0;\tsize:2;\tsigned:0;\n"},
  };
  for (const Case& c : cases) {
    auto ev = ParseEventFormat("sys", c.text);
    EXPECT_FALSE(ev.ok()) << c.what;
    if (!ev.ok()) {
      EXPECT_NE(ev.error().message.find("sys/"), std::string::npos) << ev.error().message;
    }
  }
}

// Print formats that crashed libtraceevent 1.7's parser (format_fuzzer
// findings) must be rejected before it sees them, or (a field that does not
// exist) kept from it.
TEST(FormatTest, Malicious_PrintFormatsLibtraceeventCannotParse) {
  const std::string head =
      "name: x\nID: 1\nformat:\n\tfield:int a;\toffset:8;\tsize:4;\tsigned:1;\n\nprint fmt: ";
  {
    // The format stays (its fields print raw); the print fmt is unchecked,
    // so the decoder never gives it to libtraceevent.
    auto ev = ParseEventFormat("s", head + "\"a=%d\", REC->b\n");
    ASSERT_TRUE(ev.ok()) << ev.error().message;
    EXPECT_EQ(ev->unchecked_print, "print fmt refers to 'b', which is no field");
  }
  const char* bad[] = {
      "\"a=%d\", (REC->a) ? __p:unsigned long a;",  // Cut-off expression.
      "\"a=%d\", REC->a)",                          // Unbalanced.
      "\"a=%d\", (REC->a",                          // Unclosed.
      "\"a=%d\", REC->a ? 1",                       // '?' without ':'.
      "\"a=%d\", REC->a : 1",                       // ':' without '?'.
      "\"a=%d\", REC->a +",                         // Dangling operator.
      "\"a=%d\", , REC->a",                         // Empty argument.
      "\"a=%d, REC->a",                             // Unterminated string.
      "REC->a",                                     // No format string.
      "\"a=%d\" REC->a",                            // No comma.
      "\"a=%d\", REC->a @ 2",                       // Not C.
  };
  for (const char* fmt : bad) {
    EXPECT_FALSE(ParseEventFormat("s", head + fmt + "\n").ok()) << fmt;
  }
  const char* good[] = {
      "\"a=%d\", REC->a",
      "\"a=%s\", REC->a ? \"yes\" : \"no\"",
      "\"%ps\", (void *)REC->a",
      "\"%s\", __print_flags(REC->a, \"|\", { 1, \"A\" }, { 2, \"B\" })",
      "\"%d\", ({ int x = REC->a; x; })",
      "\"%d\", -REC->a",
  };
  for (const char* fmt : good) {
    auto ev = ParseEventFormat("s", head + fmt + "\n");
    EXPECT_TRUE(ev.ok()) << fmt << ": " << (ev.ok() ? "" : ev.error().message);
  }
}

// Linux 7.3's vmscan events print the common header as a struct
// (REC->ent.pid): the event parses, its fields print raw.
TEST(FormatTest, Linux73VmscanEventWithEntPidParsesWithItsPrintUnchecked) {
  const std::string text =
      "name: mm_vmscan_direct_reclaim_end\nID: 512\nformat:\n"
      "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
      "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
      "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
      "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
      "\tfield:unsigned long nr_reclaimed;\toffset:8;\tsize:8;\tsigned:0;\n"
      "\tfield:u64 memcg_id;\toffset:16;\tsize:8;\tsigned:0;\n\n"
      "print fmt: \"nr_reclaimed=%lu pid=%d memcg_id=%llu\", REC->nr_reclaimed, REC->ent.pid, "
      "REC->memcg_id\n";
  auto ev = ParseEventFormat("vmscan", text);
  ASSERT_TRUE(ev.ok()) << ev.error().message;
  EXPECT_EQ(ev->fields.size(), 6u);
  EXPECT_EQ(ev->unchecked_print, "print fmt refers to 'ent', which is no field");
}

TEST(FormatTest, Malicious_TooManyFieldsAndTooLong) {
  std::string text = "name: x\nID: 1\nformat:\n";
  for (size_t i = 0; i <= kMaxFields; ++i) {
    text += "\tfield:int f" + std::to_string(i) + ";\toffset:0;\tsize:4;\tsigned:1;\n";
  }
  EXPECT_FALSE(ParseEventFormat("s", text).ok());
  std::string huge(kMaxFormatTextSize + 1, ' ');
  EXPECT_FALSE(ParseEventFormat("s", huge).ok());
  EXPECT_FALSE(ParseHeaderPage(huge).ok());
}

TEST(FormatTest, Malicious_HeaderEvent) {
  EXPECT_FALSE(ParseHeaderEvent("type_len : 5 bits\n").ok());  // No time_delta.
  EXPECT_FALSE(ParseHeaderEvent("type_len : 9 bits\ntime_delta : 23 bits\n").ok());
  EXPECT_FALSE(ParseHeaderEvent("type_len : 5 bits\ntime_delta : 26 bits\n").ok());
  EXPECT_FALSE(
      ParseHeaderEvent("type_len : 5 bits\ntime_delta : 27 bits\npadding : type == 99\n").ok());
  EXPECT_FALSE(ParseHeaderPage("\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n").ok());
}

}  // namespace
}  // namespace hvtrace
