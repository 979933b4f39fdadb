#include "parsed_formats.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace hvtrace::hostd {
namespace {

std::string Format(const char* name, int id) {
  return std::string("name: ") + name + "\nID: " + std::to_string(id) +
         "\nformat:\n"
         "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
         "\tfield:int value;\toffset:8;\tsize:4;\tsigned:1;\n\n"
         "print fmt: \"%d\", REC->value\n";
}

KernelFormats Loaded() {
  KernelFormats f;
  f.events.push_back({"probe", "a", 10, Format("a", 10), {}, false});
  f.events.push_back({"probe", "b", 11, "name: b\nID: x\n", {}, false});
  f.parsed = std::make_shared<const ParsedFormats>(f);
  return f;
}

TEST(ParsedFormatsTest, ParsesEachFormatOnceForEveryCaller) {
  const KernelFormats f = Loaded();
  const ParsedFormat first = ParsedFormatOf(f, f.events[0]);
  ASSERT_TRUE(first->ok());
  EXPECT_EQ((*first)->name, "a");
  EXPECT_EQ((*first)->id, 10u);
  EXPECT_EQ(ParsedFormatOf(f, f.events[0]).get(), first.get());
  // A refusal is kept as well, with the parser's message.
  const ParsedFormat bad = ParsedFormatOf(f, f.events[1]);
  EXPECT_FALSE(bad->ok());
  EXPECT_EQ(ParsedFormatOf(f, f.events[1]).get(), bad.get());
}

TEST(ParsedFormatsTest, ThreadsShareOneParse) {
  const KernelFormats f = Loaded();
  std::vector<const Result<EventFormat>*> seen(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < seen.size(); ++i) {
    threads.emplace_back([&, i] { seen[i] = ParsedFormatOf(f, f.events[0]).get(); });
  }
  for (std::thread& t : threads) t.join();
  for (const auto* p : seen) EXPECT_EQ(p, seen[0]);
}

TEST(ParsedFormatsTest, ACopyOrFormatsWithoutATableParseTheirOwn) {
  const KernelFormats f = Loaded();
  KernelFormats copy = f;  // Its vector moved: the table is not for it.
  copy.events[0].text = Format("c", 12);
  const ParsedFormat parsed = ParsedFormatOf(copy, copy.events[0]);
  ASSERT_TRUE(parsed->ok());
  EXPECT_EQ((*parsed)->name, "c");
  KernelFormats bare;
  bare.events.push_back({"probe", "d", 13, Format("d", 13), {}, false});
  EXPECT_EQ((*ParsedFormatOf(bare, bare.events[0]))->id, 13u);
}

}  // namespace
}  // namespace hvtrace::hostd
