#include "hvtrace/decoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "hvtrace/page.h"
#include "hvtrace/tracedat.h"
#include "test_support.h"

namespace hvtrace {
namespace {

const char* const kFixtures[] = {"real-v6.dat", "real-v7.dat", "real-v7-zstd.dat"};

std::string Fixture(const char* name) {
  return std::string(HVTRACE_FIXTURES_DIR) + "/tracedat/" + name;
}

// A 12-byte record of event |id| whose int field at offset 8 holds |value|
// (the small test formats' layout: the common fields, then "value").
std::vector<std::byte> IdValueRecord(uint8_t id, uint8_t value = 42) {
  std::vector<std::byte> p(12, std::byte{0});
  p[0] = std::byte{id};
  p[8] = std::byte{value};
  return p;
}

// Every record of every CPU of |path|, in file order per CPU.
struct Rec {
  uint32_t cpu;
  uint64_t ts;
  std::vector<std::byte> payload;
};
std::vector<Rec> ReadAll(const std::string& path) {
  std::vector<Rec> out;
  auto dat = TraceDat::Open(path);
  EXPECT_TRUE(dat.ok()) << (dat.ok() ? "" : dat.error().message);
  if (!dat.ok()) return out;
  auto layout = PageLayout::FromHeaderPage(dat->header_page(), dat->page_size());
  EXPECT_TRUE(layout.ok());
  if (!layout.ok()) return out;
  for (size_t i = 0; i < dat->cpus().size(); ++i) {
    uint32_t cpu = dat->cpus()[i].cpu;
    Status s = dat->ForEachPage(i, [&](std::span<const std::byte> page, uint64_t) {
      PageCursor cursor(page, *layout);
      RawRecord r;
      while (cursor.Next(&r))
        out.push_back({cpu, r.timestamp, {r.payload.begin(), r.payload.end()}});
      return true;
    });
    EXPECT_TRUE(s.ok());
  }
  return out;
}

// The compiled printers must print exactly what libtraceevent prints, on
// every record of the real fixtures.
TEST(DecoderTest, FastPathsMatchLibtraceeventOnEveryRecord) {
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    auto dat = TraceDat::Open(Fixture(name));
    ASSERT_TRUE(dat.ok()) << dat.error().message;
    TraceMetadata meta = TraceMetadataFrom(*dat);
    auto fast = EventDecoder::Create(meta);
    auto slow = EventDecoder::Create(meta);
    ASSERT_TRUE(fast.ok() && slow.ok());
    (*slow)->SetFastPathsEnabled(false);
    std::vector<Rec> recs = ReadAll(Fixture(name));
    ASSERT_GT(recs.size(), 1000u);
    size_t mismatches = 0, switches = 0, switches_fast = 0;
    for (const Rec& r : recs) {
      DecodedRecord d{r.cpu, r.ts, r.payload, 0};
      std::string a, b;
      const uint64_t fast_before = (*fast)->fast_path_count();
      (*fast)->AppendText(d, &a);
      (*slow)->AppendText(d, &b);
      if (a != b && ++mismatches <= 5) ADD_FAILURE() << "fast: " << a << "slow: " << b;
      if (a.find(" sched_switch: ") != std::string::npos) {
        ++switches;
        switches_fast += (*fast)->fast_path_count() - fast_before;
      }
    }
    EXPECT_EQ(mismatches, 0u);
    // sched_switch's printer takes its state letters from the installed
    // plugin (libtraceevent 1.7 and 1.8 differ); one it could not read would
    // leave every sched_switch to libtraceevent.
    EXPECT_GT(switches, 0u);
    EXPECT_EQ(switches_fast, switches);
    EXPECT_EQ((*slow)->fast_path_count(), 0u);
    // Most events of these traces (kmem, sched, syscalls, irq, timer) take
    // the compiled path; if this drops, a printer stopped compiling.
    EXPECT_GT((*fast)->fast_path_count(), recs.size() / 2)
        << "fast " << (*fast)->fast_path_count() << " of " << recs.size();
  }
}

// A follower (a parallel report's printing thread) takes the leader's parsed
// formats as it meets their events, not all at its making, and prints each
// record as the leader does; with the leader's symbols refused (a kallsyms
// TepSymbols does not read), it parses them the way the leader did.
TEST(DecoderTest, AFollowerTakesTheLeadersFormatsOnFirstUseAndPrintsTheSame) {
  for (const char* name : kFixtures) {
    for (const char* prefix : {"", " 0000000000001000 A refused\n"}) {
      SCOPED_TRACE(std::string(name) + " +" + prefix);
      auto dat = TraceDat::Open(Fixture(name));
      ASSERT_TRUE(dat.ok()) << dat.error().message;
      TraceMetadata meta = TraceMetadataFrom(*dat);
      meta.kallsyms = prefix + meta.kallsyms;
      auto leader = EventDecoder::Create(meta);
      ASSERT_TRUE(leader.ok());
      auto follower = EventDecoder::CreateFollower(**leader, meta);
      ASSERT_TRUE(follower.ok());
      std::vector<Rec> recs = ReadAll(Fixture(name));
      ASSERT_GT(recs.size(), 1000u);
      auto id_of = [](const Rec& r) {
        return static_cast<uint32_t>(r.payload[0]) | static_cast<uint32_t>(r.payload[1]) << 8;
      };
      for (const Rec& r : recs) EXPECT_EQ((*follower)->FindFormat(id_of(r)), nullptr);
      std::set<uint32_t> printed, only_leader;
      size_t mismatches = 0, in_order = 0;
      for (const Rec& r : recs) {
        DecodedRecord d{r.cpu, r.ts, r.payload, 0};
        std::string a, b;
        if ((*leader)->PrepareText(&d)) {
          ++in_order;  // Printed by the leader only (ReportPrinter).
          only_leader.insert(id_of(r));
          (*leader)->AppendText(d, &a);
          continue;
        }
        printed.insert(id_of(r));
        (*leader)->AppendText(d, &a);
        (*follower)->AppendText(d, &b);
        if (a != b && ++mismatches <= 5) ADD_FAILURE() << "leader: " << a << "follower: " << b;
      }
      EXPECT_EQ(mismatches, 0u);
      EXPECT_LT(in_order, recs.size() / 2);
      for (uint32_t id : printed) {
        ASSERT_NE((*follower)->FindFormat(id), nullptr) << "id " << id;
        EXPECT_EQ((*follower)->FindFormat(id)->name, (*leader)->FindFormat(id)->name);
      }
      EXPECT_FALSE(only_leader.empty());  // sched_switch, whose printing names tasks.
      for (uint32_t id : only_leader) {
        if (!printed.contains(id)) {
          EXPECT_EQ((*follower)->FindFormat(id), nullptr) << "id " << id;
        }
      }
    }
  }
}

// The decoder hands the file's kallsyms to libtraceevent as a resolver
// (TepSymbols), and evaluates print-format atoms that name symbols itself
// (mm_page_alloc's vmemmap_base). Every record must print as libtraceevent
// prints it with its own tep_parse_kallsyms: the reference decoder gets a
// text TepSymbols refuses (a leading space) but libtraceevent reads the
// same (it drops the absolute symbol), and prints without compiled printers.
TEST(DecoderTest, SymbolsAndSymbolAtomsPrintAsWithLibtraceeventsOwnKallsyms) {
  for (const char* name : kFixtures) {
    for (const char* extra : {"", "ffffffff81200000 D vmemmap_base\n"}) {
      SCOPED_TRACE(std::string(name) + " +" + extra);
      auto dat = TraceDat::Open(Fixture(name));
      ASSERT_TRUE(dat.ok()) << dat.error().message;
      TraceMetadata meta = TraceMetadataFrom(*dat);
      meta.kallsyms += extra;
      TraceMetadata reference_meta = meta;
      reference_meta.kallsyms = " 0000000000001000 A refused\n" + meta.kallsyms;
      auto ours = EventDecoder::Create(meta);
      auto reference = EventDecoder::Create(reference_meta);
      ASSERT_TRUE(ours.ok() && reference.ok());
      (*reference)->SetFastPathsEnabled(false);
      size_t mismatches = 0, page_events = 0;
      for (const Rec& r : ReadAll(Fixture(name))) {
        DecodedRecord d{r.cpu, r.ts, r.payload, 0};
        std::string a, b;
        (*ours)->AppendText(d, &a);
        (*reference)->AppendText(d, &b);
        if (a.find(" mm_page_") != std::string::npos) ++page_events;
        if (a != b && ++mismatches <= 5) ADD_FAILURE() << "ours: " << a << "libtraceevent: " << b;
      }
      EXPECT_EQ(mismatches, 0u);
      EXPECT_GT(page_events, 0u);
    }
  }
}

// The line prefix is cached per CPU (LinePrefix): every change of name,
// pid, CPU (two CPUs sharing a cache slot too) and second must still print
// trace-cmd's "%16s-%-5d [%03d] %5llu.%06llu:".
TEST(DecoderTest, LinePrefixFollowsEveryChange) {
  auto dat = TraceDat::Open(Fixture("real-v7.dat"));
  ASSERT_TRUE(dat.ok()) << dat.error().message;
  auto dec = EventDecoder::Create(TraceMetadataFrom(*dat));
  ASSERT_TRUE(dec.ok());
  std::vector<Rec> recs = ReadAll(Fixture("real-v7.dat"));
  ASSERT_FALSE(recs.empty());
  std::vector<std::byte> payload = recs[0].payload;
  const std::string long_name(70, 'x');
  struct Case {
    const char* comm;
    int pid;
    uint32_t cpu;
    uint64_t ts;
  };
  const Case cases[] = {
      {"bash", 1, 0, 1'000'000'000},         {"bash", 1, 0, 1'000'000'499},
      {"bash", 1, 0, 1'999'999'500},         {"bash", 2, 0, 2'000'000'000},
      {"bashful", 2, 0, 2'000'000'000},      {"bash", 2, 1, 2'000'000'000},
      {"bash", 2, 65, 2'000'000'000},        {"bash", 2, 1, 2'000'000'000},
      {"sixteen_chars_xx", 123456, 999, 0},  {long_name.c_str(), -7, 3, 123'456'789'012'345},
      {"", 0, 0, 99'999'999'999'999'999ull}, {"bash", 2, 1, 2'000'000'000},
  };
  for (const Case& c : cases) {
    // The pid field of the record is what the prefix prints.
    std::memcpy(payload.data() + 4, &c.pid, 4);
    DecodedRecord d{c.cpu, c.ts, payload, 0};
    d.comm = c.comm;
    std::string line;
    (*dec)->AppendText(d, &line);
    const unsigned long long t = (c.ts + 500) / 1000;
    char task[160], time[64];
    std::snprintf(task, sizeof(task), "%16s-%-5d [%03d]", c.comm, c.pid, c.cpu);
    std::snprintf(time, sizeof(time), " %5llu.%06llu:", t / 1000000, t % 1000000);
    ASSERT_EQ(line.substr(0, std::strlen(task)), task);
    // Built for Debian 13, the latency column of trace-cmd 3.3 comes between.
    std::string rest = line.substr(std::strlen(task));
    static const std::regex kLatency(R"(^ [^ ]{5,6}(?= ))");
    rest = std::regex_replace(rest, kLatency, "", std::regex_constants::format_first_only);
    EXPECT_EQ(rest.substr(0, std::strlen(time)), time) << line;
  }
}

// Padded numbers (widths, '0' and '-' flags, signs, every base) are
// formatted by the compiled printer itself; they must match libtraceevent.
TEST(DecoderTest, PaddedNumbersPrintAsLibtraceevent) {
  auto dat = TraceDat::Open(Fixture("real-v7.dat"));
  ASSERT_TRUE(dat.ok()) << dat.error().message;
  TraceMetadata meta = TraceMetadataFrom(*dat);
  meta.formats.push_back(
      {"test",
       "name: padded\nID: 60000\nformat:\n"
       "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
       "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
       "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
       "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
       "\tfield:int a;\toffset:8;\tsize:4;\tsigned:1;\n"
       "\tfield:unsigned long b;\toffset:16;\tsize:8;\tsigned:0;\n\n"
       "print fmt: \"[%08d|%-8d|%8d|%2d|%08x|%-6u|%05o|%8X|%08lx|%-3lx|%lu]\", REC->a, REC->a, "
       "REC->a, REC->a, REC->a, REC->a, REC->a, REC->a, ((unsigned long)(REC->b)), REC->b, "
       "REC->b\n"});
  auto fast = EventDecoder::Create(meta);
  auto slow = EventDecoder::Create(meta);
  ASSERT_TRUE(fast.ok() && slow.ok());
  (*slow)->SetFastPathsEnabled(false);
  for (int64_t a :
       {0ll, 1ll, -1ll, 42ll, -42ll, 123456789ll, -123456789ll, INT32_MIN + 0ll, INT32_MAX + 0ll}) {
    for (uint64_t b : {0ull, 7ull, 0xdeadbeefull, ~0ull}) {
      std::vector<std::byte> payload(24);
      const uint16_t id = 60000;
      const int32_t a32 = static_cast<int32_t>(a);
      std::memcpy(payload.data(), &id, 2);
      std::memcpy(payload.data() + 8, &a32, 4);
      std::memcpy(payload.data() + 16, &b, 8);
      DecodedRecord d{0, 1, payload, 0};
      std::string x, y;
      (*fast)->AppendText(d, &x);
      (*slow)->AppendText(d, &y);
      EXPECT_EQ(x, y);
    }
  }
  EXPECT_GT((*fast)->fast_path_count(), 0u);
}

TEST(DecoderTest, JsonLinesParseAndCarryFields) {
  auto dat = TraceDat::Open(Fixture("real-v7.dat"));
  ASSERT_TRUE(dat.ok()) << dat.error().message;
  auto dec = EventDecoder::Create(TraceMetadataFrom(*dat));
  ASSERT_TRUE(dec.ok());
  std::vector<Rec> recs = ReadAll(Fixture("real-v7.dat"));
  size_t switches = 0;
  for (const Rec& r : recs) {
    std::string line;
    (*dec)->AppendJson(DecodedRecord{r.cpu, r.ts, r.payload, 0}, &line);
    ASSERT_EQ(line.back(), '\n');
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded()) << line;
    EXPECT_EQ(j["cpu"], r.cpu);
    EXPECT_EQ(j["ts_ns"], r.ts);
    if (j["event"] == "sched_switch") {
      ++switches;
      EXPECT_EQ(j["system"], "sched");
      EXPECT_TRUE(j["fields"]["prev_comm"].is_string());
      EXPECT_TRUE(j["fields"]["next_pid"].is_number_integer());
    }
  }
  EXPECT_GT(switches, 0u);
}

// ftrace:print ends in a flexible `char buf[]` (size 0): JSON carries the
// marker text to the end of the record, as the text line does.
TEST(DecoderTest, JsonCarriesTheTextOfAFlexibleCharArray) {
  TraceMetadata meta;
  meta.source = "print";
  meta.formats.push_back({"ftrace",
                          "name: print\nID: 5\nformat:\n"
                          "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
                          "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
                          "\tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;\n"
                          "\tfield:char buf[];\toffset:16;\tsize:0;\tsigned:0;\n\n"
                          "print fmt: \"%s\", REC->buf\n"});
  auto dec = EventDecoder::Create(meta);
  ASSERT_TRUE(dec.ok()) << dec.error().message;
  const std::string marker = "HVT-JSON-MARK 7\n";
  std::vector<std::byte> p(16 + marker.size() + 4, std::byte{0});  // NUL + padding.
  p[0] = std::byte{5};
  std::memcpy(p.data() + 16, marker.data(), marker.size());
  for (bool fast : {true, false}) {
    (*dec)->SetFastPathsEnabled(fast);
    std::string line, text;
    (*dec)->AppendJson(DecodedRecord{0, 1, p, 0}, &line);
    (*dec)->AppendText(DecodedRecord{0, 1, p, 0}, &text);
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded()) << line;
    EXPECT_EQ(j["fields"]["buf"], marker) << line;
    EXPECT_NE(text.find("HVT-JSON-MARK 7"), std::string::npos) << text;
  }
}

// A counted array of size 0 ("vu a[3]; size:0", found by format_fuzzer):
// its JSON elements take their size from the type, not 0 / 3 (which looped
// forever).
TEST(DecoderTest, Malicious_CountedArrayOfSizeZeroEnds) {
  TraceMetadata meta;
  meta.source = "fuzz";
  meta.formats.push_back({"ftrace",
                          "name: bprint\nID: 6\nformat:\n"
                          "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
                          "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
                          "\tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;\n"
                          "\tfield:vu a[3];\toffset:16;\tsize:0;\tsigned:0;\n\n"
                          "print fmt: \"%lx\", REC->ip\n"});
  auto dec = EventDecoder::Create(meta);
  ASSERT_TRUE(dec.ok()) << dec.error().message;
  std::vector<std::byte> p(24, std::byte{1});
  p[0] = std::byte{6};
  p[1] = std::byte{0};
  std::string line;
  (*dec)->AppendJson(DecodedRecord{0, 1, p, 0}, &line);
  auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << line;
  EXPECT_EQ(j["fields"]["a"], nlohmann::json::array({16843009, 16843009})) << line;
}

// Hostile records: too short, unknown ids, dynamic strings pointing far
// outside the record. Nothing may crash (ASan runs this) and every call
// still yields its line(s), ending in a newline.
TEST(DecoderTest, Malicious_RecordsStayInsideTheScratchCopy) {
  auto dat = TraceDat::Open(Fixture("real-v7.dat"));
  ASSERT_TRUE(dat.ok()) << dat.error().message;
  auto dec = EventDecoder::Create(TraceMetadataFrom(*dat));
  ASSERT_TRUE(dec.ok());
  for (const FormatText& ft : dat->formats()) {
    auto ev = ParseEventFormat(ft.system, ft.text);
    if (!ev.ok()) continue;
    for (size_t len : {0u, 1u, 2u, 8u, 12u, 16u, 64u}) {
      std::vector<std::byte> payload(len, std::byte{0xff});
      if (len >= 2) {
        payload[0] = std::byte(ev->id & 0xff);
        payload[1] = std::byte(ev->id >> 8);
      }
      for (bool fast : {true, false}) {
        (*dec)->SetFastPathsEnabled(fast);
        std::string text, json;
        (*dec)->AppendText(DecodedRecord{0, 1, payload, 0}, &text);
        (*dec)->AppendJson(DecodedRecord{0, 1, payload, 0}, &json);
        // One line, except stack events whose print formats hold newlines.
        ASSERT_FALSE(text.empty());
        EXPECT_EQ(text.back(), '\n') << ev->name << " " << len;
        if (ev->print_fmt.find("\\n") == std::string::npos) {
          EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1)
              << ev->name << " " << len << ": " << text;
        }
        EXPECT_FALSE(nlohmann::json::parse(json, nullptr, false).is_discarded()) << json;
      }
    }
  }
  std::string text;
  std::vector<std::byte> unknown = {std::byte{0xfe}, std::byte{0xfe}, std::byte{0}, std::byte{0}};
  (*dec)->AppendText(DecodedRecord{3, 5, unknown, 0}, &text);
  EXPECT_EQ(text, "[UNKNOWN EVENT][UNKNOWN EVENT] (NULL):               [UNKNOWN EVENT]\n");
}

TEST(DecoderTest, Malicious_BadFormatsAreSkippedWithAWarning) {
  TraceMetadata meta;
  meta.source = "test.dat";
  meta.header_page = "garbage";
  meta.formats.push_back(
      {"sched", "name: x\nID: 1\nformat:\n\tfield:int a;\toffset:0;\tsize:9999999;\n"});
  meta.formats.push_back(
      {"sched",
       "name: y\nID: 2\nformat:\n\tfield:int a;\toffset:8;\tsize:4;\tsigned:1;\n\nprint fmt: "
       "\"%d\", REC->missing\n"});
  auto dec = EventDecoder::Create(meta);
  ASSERT_TRUE(dec.ok());
  EXPECT_EQ((*dec)->warnings().size(), 2u);
  for (const std::string& w : (*dec)->warnings())
    EXPECT_NE(w.find("test.dat"), std::string::npos) << w;
  EXPECT_EQ((*dec)->FindFormat(1), nullptr);
  // A print fmt naming no field keeps the event; its fields print raw.
  ASSERT_NE((*dec)->FindFormat(2), nullptr);
  EXPECT_EQ((*dec)->FindFormat(2)->unchecked_print,
            "print fmt refers to 'missing', which is no field");
}

// Formats are parsed on their event's first use (LazyFormats). What the
// decoder says stays what parsing them all in Create said: an id's event is
// its first format that parses, and the warnings name each bad format and
// each later duplicate in file order, after header_page's and before those
// of loading a format, whether or not an event used them, with the formats
// parsed on a background thread (100 more) or not.
TEST(DecoderTest, Malicious_LazilyParsedFormatsWarnAsBefore) {
  const std::string common =
      "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
      "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
      "\tfield:int value;\toffset:8;\tsize:4;\tsigned:1;\n\n";
  auto format = [&](const std::string& name, const std::string& id, const std::string& print) {
    return "name: " + name + "\nID: " + id + "\nformat:\n" + common + "print fmt: " + print + "\n";
  };
  const std::string bad5 = "name: bad5\nID: 5\nformat:\n\tfield:int a;\toffset:0;\tsize:9999999;\n";
  const std::string no_id = "name: noid\nformat:\n" + common + "print fmt: \"\"\n";
  const std::string bad9 =
      "name: bad9\nID: 9\nformat:\n\tfield:int a;\toffset:0;\tsize:99999999;\n";
  for (int fillers : {0, 100}) {
    SCOPED_TRACE(fillers);
    TraceMetadata meta;
    meta.source = "lazy";
    meta.header_page = "garbage";
    meta.formats.push_back({"t", bad5});
    meta.formats.push_back({"t", format("first5", "5", "\"first=%d\", REC->value")});
    meta.formats.push_back({"t", format("second5", "5", "\"second=%d\", REC->value")});
    // Its id after the fields, where only our parser finds it (libtraceevent
    // does not: its events print as unknown, as they did before).
    meta.formats.push_back(
        {"t", "name: late6\nformat:\n" + common + "ID: 6\nprint fmt: \"late=%d\", REC->value\n"});
    meta.formats.push_back({"t", format("raw7", "7", "\"%d\", REC->missing")});
    meta.formats.push_back({"t", no_id});
    meta.formats.push_back({"t", bad9});
    for (int i = 0; i < fillers; ++i) {
      meta.formats.push_back(
          {"t", format("fill" + std::to_string(i), std::to_string(100 + i), "\"%d\", REC->value")});
    }
    const std::vector<std::string> of_formats = {
        "lazy: " + ParseEventFormat("t", bad5).error().message,
        "lazy: event id 5 (t/second5) defined twice; keeping the first",
        "lazy: " + ParseEventFormat("t", no_id).error().message,
        "lazy: " + ParseEventFormat("t", bad9).error().message,
    };
    const std::string header = "lazy: " + ParseHeaderPage("garbage").error().message;

    // Asked at once: no format loaded, so no warning of loading one.
    auto idle = EventDecoder::Create(meta);
    ASSERT_TRUE(idle.ok()) << idle.error().message;
    std::vector<std::string> want = {header};
    want.insert(want.end(), of_formats.begin(), of_formats.end());
    EXPECT_EQ((*idle)->warnings(), want);
    ASSERT_NE((*idle)->FindFormat(6), nullptr);
    EXPECT_EQ((*idle)->FindFormat(6)->name, "late6");
    EXPECT_EQ((*idle)->FindFormat(9), nullptr);

    auto dec = EventDecoder::Create(meta);
    ASSERT_TRUE(dec.ok()) << dec.error().message;
    std::string out;
    for (uint8_t id : {5, 6, 7, 9}) {
      const std::vector<std::byte> payload = IdValueRecord(id);
      (*dec)->AppendText(DecodedRecord{0, 1000, payload, 0}, &out);
    }
    EXPECT_NE(out.find(" first5: "), std::string::npos) << out;
    EXPECT_NE(out.find("first=42\n"), std::string::npos) << out;
    EXPECT_EQ(out.find("late=42\n"), std::string::npos) << out;
    EXPECT_NE(out.find("[print fmt not used] value=42\n"), std::string::npos) << out;
    EXPECT_NE(out.find("[UNKNOWN EVENT]"), std::string::npos) << out;
    want.push_back("lazy: libtraceevent could not fully parse t/late6");
    want.push_back(
        "lazy: t/raw7: print fmt refers to 'missing', which is no field; its events print their "
        "fields raw");
    EXPECT_EQ((*dec)->warnings(), want);
  }
}

// A guest can publish a print format that divides by a field and then write
// a record where it is 0, one that divides by a constant 0 (libtraceevent
// dies of SIGFPE), or one whose __print_hex length reaches past the record
// (libtraceevent reads it). Such records print their fields raw.
TEST(DecoderTest, Malicious_UnsafePrintFormatsPrintRawInsteadOfCrashing) {
  auto format = [](int id, const char* args) {
    return "name: div" + std::to_string(id) + "\nID: " + std::to_string(id) +
           "\nformat:\n"
           "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
           "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
           "\tfield:u32 a;\toffset:8;\tsize:4;\tsigned:0;\n"
           "\tfield:u32 b;\toffset:12;\tsize:4;\tsigned:0;\n\n"
           "print fmt: \"q=%u\", " +
           std::string(args) + "\n";
  };
  TraceMetadata meta;
  meta.source = "hostile";
  meta.formats.push_back({"test", format(10, "REC->a / REC->b")});
  meta.formats.push_back({"test", format(11, "REC->a / (1 - 1)")});
  meta.formats.push_back({"test", format(12, "REC->a, __print_hex(REC->a, REC->b)")});
  // Linux 7.3's vmscan events print REC->ent.pid, no field of theirs.
  meta.formats.push_back({"test", format(13, "REC->a, REC->ent.pid")});
  auto dec = EventDecoder::Create(meta);
  ASSERT_TRUE(dec.ok()) << dec.error().message;
  auto record = [](int id, uint32_t a, uint32_t b) {
    std::vector<std::byte> p(16, std::byte{0});
    p[0] = std::byte(id);
    std::memcpy(p.data() + 8, &a, 4);
    std::memcpy(p.data() + 12, &b, 4);
    return p;
  };
  for (bool fast : {true, false}) {
    (*dec)->SetFastPathsEnabled(fast);
    std::string text;
    auto ok = record(10, 100, 4);
    auto zero = record(10, 100, 0);
    auto constant = record(11, 100, 4);
    (*dec)->AppendText(DecodedRecord{0, 1000, ok, 0}, &text);
    (*dec)->AppendText(DecodedRecord{0, 2000, zero, 0}, &text);
    (*dec)->AppendText(DecodedRecord{0, 3000, constant, 0}, &text);
    EXPECT_NE(text.find("q=25\n"), std::string::npos) << text;
    EXPECT_NE(text.find("[print fmt divides by zero] a=100 b=0\n"), std::string::npos) << text;
    EXPECT_NE(text.find("[print fmt not used] a=100 b=4\n"), std::string::npos) << text;
    // A length past what a record can hold is not handed to libtraceevent.
    auto long_hex = record(12, 7, 70000);
    auto short_hex = record(12, 7, 2);
    (*dec)->AppendText(DecodedRecord{0, 4000, long_hex, 0}, &text);
    (*dec)->AppendText(DecodedRecord{0, 5000, short_hex, 0}, &text);
    EXPECT_NE(text.find("[print fmt length too large] a=7 b=70000\n"), std::string::npos) << text;
    EXPECT_NE(text.find("q=7\n"), std::string::npos) << text;
    auto ent_pid = record(13, 5, 6);
    (*dec)->AppendText(DecodedRecord{0, 6000, ent_pid, 0}, &text);
    EXPECT_TRUE(std::regex_search(text, std::regex("div13: +\\[print fmt not used\\] a=5 b=6\n")))
        << text;
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 6) << text;
  }
  bool warned = false;
  for (const std::string& w : (*dec)->warnings())
    warned = warned || w.find("test/div11") != std::string::npos;
  EXPECT_TRUE(warned);
}

// A compiled printer of numbers and plain literals skips the escape scan
// (EventPrinter::plain); a control byte or a non-ASCII one in the print
// format's own text, next to a number or alone, is still escaped.
TEST(DecoderTest, Malicious_ControlBytesInAPrintFormatsLiteralsAreEscaped) {
  const std::string head =
      "format:\n"
      "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
      "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
      "\tfield:int value;\toffset:8;\tsize:4;\tsigned:1;\n\n";
  TraceMetadata meta;
  meta.source = "hostile";
  meta.formats.push_back(
      {"test", "name: plain\nID: 30\n" + head + "print fmt: \"v=0x%08x\\n\", REC->value\n"});
  meta.formats.push_back(
      {"test", "name: esc\nID: 31\n" + head + "print fmt: \"\x1b[2Jv=%d \x9b\", REC->value\n"});
  meta.formats.push_back({"test", "name: bell\nID: 32\n" + head + "print fmt: \"\a\xff\"\n"});
  auto dec = EventDecoder::Create(meta);
  ASSERT_TRUE(dec.ok()) << dec.error().message;
  std::string text;
  for (uint8_t id : {30, 31, 32}) {
    const std::vector<std::byte> p = IdValueRecord(id);
    (*dec)->AppendText(DecodedRecord{0, 1000, p, 0}, &text);
  }
  EXPECT_NE(text.find(" plain: "), std::string::npos) << text;
  EXPECT_NE(text.find("v=0x0000002a\n"), std::string::npos) << text;
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    EXPECT_TRUE((byte >= 0x20 && byte < 0x7f) || c == '\n') << static_cast<int>(byte);
  }
  EXPECT_GT((*dec)->fast_path_count(), 0u);
}

// printk_formats from a hostile trace.dat: libtraceevent 1.7 reads before a
// format shorter than two characters and past a line without ':'
// (the perfetto_export fuzzer's find, caught by ASan). Those lines are left
// out; a well-formed one still names the string a pointer field points at.
TEST(DecoderTest, Malicious_ShortOrShapelessPrintkFormatsAreLeftOut) {
  TraceMetadata meta;
  meta.source = "hostile";
  meta.formats.push_back({"test",
                          "name: str\nID: 20\nformat:\n"
                          "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
                          "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
                          "\tfield:const char * msg;\toffset:8;\tsize:8;\tsigned:0;\n\n"
                          "print fmt: \"%s\", REC->msg\n"});
  meta.printk_formats =
      "0xffffffff81000000 : \"\"\n0xffffffff81000008 : \"x\"\n0x1 : \"\n0x2 :\n:\n"
      "zz : \"not hex\"\n0xffffffff81000010 : \"hello from printk_formats\\n\"\n\"";
  auto dec = EventDecoder::Create(meta);
  ASSERT_TRUE(dec.ok()) << dec.error().message;
  (*dec)->SetFastPathsEnabled(false);
  std::vector<std::byte> p(16, std::byte{0});
  p[0] = std::byte{20};
  const uint64_t addr = 0xffffffff81000010ull;
  std::memcpy(p.data() + 8, &addr, 8);
  std::string text;
  (*dec)->AppendText(DecodedRecord{0, 1000, p, 0}, &text);
  EXPECT_NE(text.find("hello from printk_formats"), std::string::npos) << text;
}

// A guest's string (here a trace_marker-like print) with terminal escapes:
// printed as \xNN on both paths, never raw.
TEST(DecoderTest, Malicious_EscapesInStringsAreNeverPrintedRaw) {
  TraceMetadata meta;
  meta.source = "hostile";
  meta.formats.push_back({"test",
                          "name: note\nID: 21\nformat:\n"
                          "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
                          "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
                          "\tfield:char buf[16];\toffset:8;\tsize:16;\tsigned:0;\n\n"
                          "print fmt: \"%s\", REC->buf\n"});
  auto dec = EventDecoder::Create(meta);
  ASSERT_TRUE(dec.ok()) << dec.error().message;
  std::vector<std::byte> p(24, std::byte{0});
  p[0] = std::byte{21};
  const char text[] =
      "x\x1b]0;t\x07\x9b"
      "2J";
  std::memcpy(p.data() + 8, text, sizeof text - 1);
  for (bool fast : {true, false}) {
    (*dec)->SetFastPathsEnabled(fast);
    std::string out;
    (*dec)->AppendText(DecodedRecord{0, 1000, p, 0}, &out);
    EXPECT_NE(out.find("x\\x1b]0;t\\x07\\x9b2J\n"), std::string::npos) << out;
    EXPECT_EQ(out.find_first_of("\x1b\x07\x9b"), std::string::npos) << out;
  }
}

// Terminal escapes in a task's name (the file's saved_cmdlines): printed as
// \xNN in every line of the task, the first (the line prefix's cache filled)
// and the later ones (its cache hit), also after another task's line on the
// same CPU. The scan may skip only a prefix known to be printable ASCII.
TEST(DecoderTest, Malicious_EscapesInTaskNamesAreNeverPrintedRaw) {
  TraceMetadata meta;
  meta.source = "hostile";
  meta.cmdlines = "42 ev\x1b[2Jil\n7 plain\n";
  meta.formats.push_back({"test",
                          "name: note\nID: 21\nformat:\n"
                          "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
                          "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
                          "\tfield:int v;\toffset:8;\tsize:4;\tsigned:1;\n\n"
                          "print fmt: \"v=%d\", REC->v\n"});
  auto dec = EventDecoder::Create(meta);
  ASSERT_TRUE(dec.ok()) << dec.error().message;
  auto record = [](int32_t pid) {
    std::vector<std::byte> p(12, std::byte{0});
    p[0] = std::byte{21};
    std::memcpy(p.data() + 4, &pid, 4);
    return p;
  };
  for (bool fast : {true, false}) {
    (*dec)->SetFastPathsEnabled(fast);
    std::string out;
    for (int32_t pid : {42, 42, 7, 42}) {
      const std::vector<std::byte> p = record(pid);
      (*dec)->AppendText(DecodedRecord{0, 1000, p, 0}, &out);
    }
    EXPECT_EQ(out.find('\x1b'), std::string::npos) << out;
    size_t escaped = 0;
    for (size_t at = 0; (at = out.find("ev\\x1b[2Jil-42", at)) != std::string::npos; ++at) {
      ++escaped;
    }
    EXPECT_EQ(escaped, 3u) << out;
    EXPECT_NE(out.find("plain-7 "), std::string::npos) << out;
  }
}

// A format that passes ParseEventFormat but crashes libtraceevent's parser
// (format_fuzzer found this one: a NULL dereference while it folds
// constants) costs a forked trial child, not the decoder.
TEST(DecoderTest, Malicious_FormatThatCrashesLibtraceeventsParserPrintsRaw) {
  const std::string text = test_support::ReadText(std::string(HVTRACE_FIXTURES_DIR) +
                                                  "/fuzz/format/parser_null_deref.format");
  ASSERT_FALSE(text.empty());
  ASSERT_TRUE(ParseEventFormat("sched", text).ok());
  TraceMetadata meta;
  meta.source = "hostile";
  meta.formats.push_back({"sched", text});
  auto dec = EventDecoder::Create(meta);
  ASSERT_TRUE(dec.ok()) << dec.error().message;
  std::vector<std::byte> payload(64, std::byte{0});
  payload[0] = std::byte(372 & 0xff);
  payload[1] = std::byte(372 >> 8);
  payload[8] = std::byte{'s'};
  payload[9] = std::byte{'h'};
  std::string out;
  (*dec)->AppendText(DecodedRecord{0, 1000, payload, 0}, &out);
  EXPECT_NE(out.find("[libtraceevent cannot parse this format] prev_comm=\"sh\" prev_pid=0"),
            std::string::npos)
      << out;
  bool warned = false;
  for (const std::string& w : (*dec)->warnings())
    warned = warned || w.find("in a trial run") != std::string::npos;
  EXPECT_TRUE(warned);
}

// TrialParseAll gives each format's verdict from one child without loading
// any; a format marked trial_passed then prints with no trial child at all,
// one that is not still gets its child (KeepTrialChild keeps it to be seen).
TEST(DecoderTest, Malicious_TrialParseAllVerdictsAndTrialPassedSkipsTheChild) {
  const std::string crasher = test_support::ReadText(std::string(HVTRACE_FIXTURES_DIR) +
                                                     "/fuzz/format/parser_null_deref.format");
  ASSERT_FALSE(crasher.empty());
  const std::string note =
      "name: note\nID: 21\nformat:\n"
      "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
      "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
      "\tfield:int value;\toffset:8;\tsize:4;\tsigned:1;\n\n"
      "print fmt: \"value=%d\", REC->value\n";
  TraceMetadata meta;
  meta.source = "trials";
  meta.formats.push_back({"sched", crasher});
  meta.formats.push_back({"test", note});
  auto all = EventDecoder::Create(meta);
  ASSERT_TRUE(all.ok()) << all.error().message;
  const std::vector<bool> want = {false, true};  // Indexed like meta.formats.
  EXPECT_EQ((*all)->TrialParseAll(), want);
  EXPECT_EQ(test_support::ChildProcesses(), 0u);

  const std::vector<std::byte> payload = IdValueRecord(21);
  for (bool passed : {true, false}) {
    SCOPED_TRACE(passed ? "trial_passed" : "not vetted");
    TraceMetadata one;
    one.source = "trials";
    one.formats.push_back({"test", note, passed});
    auto dec = EventDecoder::Create(one);
    ASSERT_TRUE(dec.ok()) << dec.error().message;
    (*dec)->KeepTrialChild(true);
    (*dec)->SetFastPathsEnabled(false);
    std::string out;
    (*dec)->AppendText(DecodedRecord{0, 1000, payload, 0}, &out);
    EXPECT_NE(out.find(" note: "), std::string::npos) << out;
    EXPECT_NE(out.find("value=42\n"), std::string::npos) << out;
    EXPECT_EQ(test_support::ChildProcesses(), passed ? 0u : 1u);
  }
  EXPECT_EQ(test_support::ChildProcesses(), 0u);
}

}  // namespace
}  // namespace hvtrace
