// TepSymbols must answer every lookup exactly as libtraceevent does when it
// parses the same kallsyms itself (tep_parse_kallsyms): these tests put the
// two side by side on the same text.
#include "hvtrace/tep_symbols.h"

#include <gtest/gtest.h>
#include <traceevent/event-parse.h>
#include <traceevent/trace-seq.h>

#include <cstdio>
#include <cstring>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "hvtrace/tracedat.h"

namespace hvtrace {
namespace {

struct Tep {
  tep_handle* tep = tep_alloc();
  ~Tep() { tep_free(tep); }
};

// Aliases at one address (in several numbers, so that bsearch's probes land
// on different ones), module symbols, the symbols libtraceevent drops ('$'
// names, absolute 'A'/'a'), a straggler out of address order, a name used
// at two addresses, and a last symbol (nothing past it is found).
const char kText[] =
    "ffffffff81000000 T _stext\n"
    "ffffffff81000000 T _text\n"
    "ffffffff81000000 t startup_64\n"
    "ffffffff81000100 t dup_name\n"
    "ffffffff81000200 T two_a\n"
    "ffffffff81000200 T two_b\n"
    "ffffffff81000300 t $x\n"
    "ffffffff81000400 T four_a\n"
    "ffffffff81000400 T four_b\n"
    "ffffffff81000400 W four_c\n"
    "ffffffff81000400 T four_d\n"
    "0000000000001000 A fixed_percpu_data\n"
    "ffffffff81000500 a local_abs\n"
    "ffffffff81000380 t straggler\n"
    "ffffffff81000600 t dup_name\n"
    "ffffffff81000700 D five_a\n"
    "ffffffff81000700 D five_b\n"
    "ffffffff81000700 D five_c\n"
    "ffffffff81000700 D five_d\n"
    "ffffffff81000700 D five_e\n"
    "ffffffffc0001000 t mod_fn\t[virtio_blk]\n"
    "ffffffffc0001000 t mod_alias\t[virtio_blk]\n"
    "ffffffffc0002000 T mod_last\t[kvm]\n";

// Every address worth asking about: each symbol's, one either side, and
// the ends of the address space.
std::vector<uint64_t> Probes(const std::string& text) {
  std::set<uint64_t> out = {0, 1, UINT64_MAX, UINT64_MAX - 1};
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    uint64_t addr = std::strtoull(text.substr(pos, 16).c_str(), nullptr, 16);
    for (uint64_t a : {addr - 1, addr, addr + 1, addr + 0x7f}) out.insert(a);
    pos = nl + 1;
  }
  return {out.begin(), out.end()};
}

void ExpectSameAnswers(const std::string& text) {
  Tep theirs, ours;
  ASSERT_EQ(tep_parse_kallsyms(theirs.tep, text.c_str()), 0);
  std::unique_ptr<TepSymbols> symbols = TepSymbols::Build(text);
  ASSERT_NE(symbols, nullptr);
  symbols->Install(ours.tep);
  for (uint64_t addr : Probes(text)) {
    SCOPED_TRACE(addr);
    const char* a = tep_find_function(theirs.tep, addr);
    const char* b = tep_find_function(ours.tep, addr);
    ASSERT_EQ(a == nullptr, b == nullptr) << (a ? a : "(null)") << " / " << (b ? b : "(null)");
    if (a == nullptr) continue;
    EXPECT_STREQ(a, b);
    EXPECT_EQ(tep_find_function_address(theirs.tep, addr),
              tep_find_function_address(ours.tep, addr));
    uint64_t start = 0;
    const char* mod = nullptr;
    EXPECT_STREQ(symbols->Find(addr, &start, &mod), a);
  }
}

TEST(TepSymbolsTest, FindsWhatLibtraceeventFinds) {
  ExpectSameAnswers(kText);
  // Without the newline at the end, and with empty lines (strtok_r skips
  // them).
  std::string text = kText;
  text.pop_back();
  ExpectSameAnswers(text);
  ExpectSameAnswers("\n\n" + std::string(kText) + "\n\n");
  // Aliases at the very first and last entries of the table.
  ExpectSameAnswers("0000000000000010 t a\n0000000000000010 t b\n0000000000000010 t c\n");
}

TEST(TepSymbolsTest, FindsWhatLibtraceeventFindsInRealKallsyms) {
  for (const char* name : {"real-v6.dat", "real-v7.dat", "real-v7-zstd.dat"}) {
    SCOPED_TRACE(name);
    auto dat = TraceDat::Open(std::string(HVTRACE_FIXTURES_DIR) + "/tracedat/" + name);
    ASSERT_TRUE(dat.ok()) << dat.error().message;
    ASSERT_FALSE(dat->kallsyms().empty());
    ExpectSameAnswers(dat->kallsyms());
  }
}

// Made-up texts (a fixed seed): few distinct addresses so that aliases are
// common, filtered names and types, modules, and now and then a line
// libtraceevent reads some other way. Whatever Build accepts must answer
// as libtraceevent does; whatever it refuses, libtraceevent parses itself.
TEST(TepSymbolsTest, RandomTextsAnswerAsLibtraceeventOrAreRefused) {
  std::mt19937 rng(20261125);
  const char* const bad_lines[] = {"garbage",  " 10 t x",    "10 t x y", "10  t x",
                                   "0x10 t x", "10 t x\t[m", "10 t\tx"};
  size_t accepted = 0;
  for (int round = 0; round < 300; ++round) {
    std::string text;
    const int lines = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < lines; ++i) {
      if (rng() % 50 == 0) {
        text += bad_lines[rng() % std::size(bad_lines)];
      } else {
        char line[96];
        const char type = "TtWwDdAaBbRr"[rng() % 12];
        std::snprintf(line, sizeof(line), "%llx %c %sf%u",
                      static_cast<unsigned long long>(0x1000 + (rng() % 12) * 0x10), type,
                      rng() % 10 == 0 ? "$" : "", static_cast<unsigned>(rng() % 16));
        text += line;
        if (rng() % 5 == 0) text += "\t[mod" + std::to_string(rng() % 3) + "]";
      }
      text += rng() % 10 == 0 ? "\n\n" : "\n";
    }
    SCOPED_TRACE(text);
    if (TepSymbols::Build(text) == nullptr) continue;
    ++accepted;
    ExpectSameAnswers(text);
    if (HasFailure()) return;
  }
  EXPECT_GT(accepted, 100u);
}

TEST(TepSymbolsTest, ModulesAreSplitOff) {
  auto symbols = TepSymbols::Build(kText);
  ASSERT_NE(symbols, nullptr);
  uint64_t start = 0;
  const char* mod = nullptr;
  EXPECT_STREQ(symbols->Find(0xffffffffc0002000, &start, &mod), "mod_last");
  EXPECT_EQ(start, 0xffffffffc0002000u);
  EXPECT_STREQ(mod, "kvm");
  // Past the last symbol: nothing, as in libtraceevent.
  EXPECT_EQ(symbols->Find(0xffffffffc0002010, &start, &mod), nullptr);
  // Inside an address with aliases: the one first in the file.
  EXPECT_STREQ(symbols->Find(0xffffffffc0001010, &start, &mod), "mod_fn");
  EXPECT_STREQ(mod, "virtio_blk");
  EXPECT_STREQ(symbols->Find(0xffffffff81000010, &start, &mod), "_stext");
  EXPECT_EQ(mod, nullptr);
}

// Lines tep_parse_kallsyms reads another way, or stops at: Build refuses
// the whole text and the decoder hands it to libtraceevent.
TEST(TepSymbolsTest, RefusesTextLibtraceeventMightReadDifferently) {
  for (const char* bad : {
           "0xffffffff81000000 T x\n",      // sscanf takes the 0x.
           " ffffffff81000000 T x\n",       // Leading space.
           "ffffffff81000000  T x\n",       // Two spaces.
           "ffffffff81000000 T  x\n",       // Two spaces before the name.
           "ffffffff81000000 T x y\n",      // A second word.
           "ffffffff81000000 T x\r\n",      // CR.
           "ffffffff81000000 T x\t[mod\n",  // No ']'.
           "ffffffff81000000 T x\t[]\n",    // Empty module.
           "1ffffffff81000000 T x\n",       // 17 digits.
           "ffffffff81000000 T x\nnot a symbol\nffffffff81000100 T y\n",
       }) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(TepSymbols::Build(bad), nullptr);
  }
  EXPECT_EQ(TepSymbols::Build(std::string("ffffffff81000000 T x\n\0ffff T y\n", 30)), nullptr);
  EXPECT_NE(TepSymbols::Build(""), nullptr);
}

// A print-format atom that is not a number is the address of the kernel
// symbol of that name (libtraceevent's test_for_symbol): the value before
// and after libtraceevent has sorted its table.
TEST(TepSymbolsTest, AtomValueIsTheSymbolLibtraceeventFindsByName) {
  const std::string fmt =
      "name: atom\nID: 1\nformat:\n"
      "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
      "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
      "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
      "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
      "\tfield:unsigned long pfn;\toffset:8;\tsize:8;\tsigned:0;\n\n"
      "print fmt: \"%lx\", ((unsigned long)SYM + REC->pfn)\n";
  auto symbols = TepSymbols::Build(kText);
  ASSERT_NE(symbols, nullptr);
  unsigned char rec_data[16] = {1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0};
  for (bool map_built : {false, true}) {
    for (const char* name : {"dup_name", "five_c", "mod_fn", "local_abs", "nothere"}) {
      SCOPED_TRACE(std::string(name) + (map_built ? " after a lookup" : " before"));
      Tep theirs;
      ASSERT_EQ(tep_parse_kallsyms(theirs.tep, kText), 0);
      if (map_built) tep_find_function(theirs.tep, 0);
      std::string text = fmt;
      text.replace(text.find("SYM"), 3, name);
      ASSERT_EQ(tep_parse_event(theirs.tep, text.data(), text.size(), "test"), 0);
      tep_record rec{};
      rec.data = rec_data;
      rec.size = sizeof(rec_data);
      trace_seq seq;
      trace_seq_init(&seq);
      tep_print_event(theirs.tep, &seq, &rec, "%s", TEP_PRINT_INFO);
      std::string printed(seq.buffer, seq.len);
      trace_seq_destroy(&seq);
      bool certain = false;
      uint64_t value = symbols->AtomValue(name, map_built, &certain);
      char want[32];
      std::snprintf(want, sizeof(want), "%lx", static_cast<unsigned long>(value + 5));
      EXPECT_EQ(printed, want);
      EXPECT_EQ(certain, std::string(name) != "dup_name");
    }
  }
}

}  // namespace
}  // namespace hvtrace
