// Files and functions stay readable at once: at most 800 lines per file and
// 120 lines per function in hostd/, shared/ and guest-agent/.
//
// Functions are found by reading the brace structure, not by line patterns:
// a signature that wraps over several lines, a constructor's initializer
// list or a body that starts with a lambda must not hide a function from the
// check (a column-0 "{" pattern missed five functions of 129 to 242 lines).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace fs = std::filesystem;

const fs::path kRoot = HVTRACE_SOURCE_DIR;
constexpr size_t kMaxFunctionLines = 120;
constexpr size_t kMaxFileLines = 800;

struct FunctionSpan {
  std::string name;       // "RegionStreamer::Feed", "TEST(Foo, Bar)".
  size_t first_line = 0;  // 1-based: where the signature starts.
  size_t lines = 0;       // Signature to closing brace, inclusive.
};

bool IsIdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The identifier (or number) that ends just before |end|.
std::string_view TokenBefore(std::string_view s, size_t end) {
  size_t start = end;
  while (start > 0 && (IsIdentChar(s[start - 1]) || s[start - 1] == '\'')) --start;
  return s.substr(start, end - start);
}

// Blanks [from, to) except newlines, so that line numbers survive.
void BlankRange(std::string& out, size_t from, size_t to) {
  for (size_t k = from; k < to && k < out.size(); ++k) {
    if (out[k] != '\n') out[k] = ' ';
  }
}

// Where the literal that opens with the quote |q| at |i| ends (one past its
// closing quote; a backslash escapes the next character).
size_t EndOfQuoted(std::string_view s, size_t i, char q) {
  size_t k = i + 1;
  while (k < s.size() && s[k] != q && s[k] != '\n') k += s[k] == '\\' ? 2 : 1;
  return std::min(k + 1, s.size());
}

// Where the raw string R"delim(...)delim" that opens at the quote |i| ends.
size_t EndOfRawString(std::string_view s, size_t i) {
  const size_t open = s.find('(', i);
  if (open == std::string_view::npos) return s.size();
  const std::string close = ")" + std::string(s.substr(i + 1, open - i - 1)) + "\"";
  const size_t end = s.find(close, open);
  return end == std::string_view::npos ? s.size() : end + close.size();
}

// The source with comments, string and character literals and preprocessor
// lines replaced by spaces: what is left of the braces is the code's own
// structure ("{" in a format string or a comment must not open a scope).
std::string Blank(std::string_view s) {
  std::string out(s);
  bool line_start = true;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    const char next = i + 1 < s.size() ? s[i + 1] : '\0';
    size_t end = i;
    if (c == '#' && line_start) {
      // A directive runs to the first newline not escaped by a backslash.
      end = i;
      while (end < s.size() && !(s[end] == '\n' && s[end - 1] != '\\')) ++end;
    } else if (c == '/' && next == '/') {
      end = std::min(s.find('\n', i), s.size());
    } else if (c == '/' && next == '*') {
      const size_t close = s.find("*/", i + 2);
      end = close == std::string_view::npos ? s.size() : close + 2;
    } else if (c == '"') {
      const std::string_view prefix = TokenBefore(s, i);
      const bool raw =
          prefix == "R" || prefix == "u8R" || prefix == "uR" || prefix == "UR" || prefix == "LR";
      end = raw ? EndOfRawString(s, i) : EndOfQuoted(s, i, '"');
    } else if (c == '\'') {
      // 1'000'000: a digit separator inside a number, not a character.
      const std::string_view token = TokenBefore(s, i);
      if (token.empty() || !std::isdigit(static_cast<unsigned char>(token[0]))) {
        end = EndOfQuoted(s, i, '\'');
      }
    }
    if (end > i) {
      BlankRange(out, i, end);
      i = end;
      continue;
    }
    if (c == '\n') line_start = true;
    if (!std::isspace(static_cast<unsigned char>(c))) line_start = false;
    ++i;
  }
  return out;
}

// The index of the "}" that closes the "{" at |open| (or the end).
size_t MatchingBrace(std::string_view s, size_t open) {
  int depth = 0;
  for (size_t k = open; k < s.size(); ++k) {
    if (s[k] == '{') ++depth;
    if (s[k] == '}' && --depth == 0) return k;
  }
  return s.size();
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string_view FirstWord(std::string_view s) {
  s = Trim(s);
  size_t k = 0;
  while (k < s.size() && IsIdentChar(s[k])) ++k;
  return s.substr(0, k);
}

// |head| without a leading "template <...>" (its default arguments may hold
// "=" and parentheses that say nothing about what the declaration is).
std::string_view StripTemplate(std::string_view head) {
  head = Trim(head);
  while (FirstWord(head) == "template") {
    size_t k = head.find('<');
    if (k == std::string_view::npos) return head;
    for (int depth = 0; k < head.size(); ++k) {
      depth += head[k] == '<' ? 1 : head[k] == '>' ? -1 : 0;
      if (depth == 0) break;
    }
    head = Trim(head.substr(std::min(k + 1, head.size())));
  }
  return head;
}

// The [begin, end) of each top-level parenthesised group of |head|
// ("operator()" and "operator==" are part of a name, not groups or "=").
// Sets |*assigns| when an "=" stands outside of all groups: the head is
// then a variable's initializer, as in "const auto kX = [] {".
std::vector<std::pair<size_t, size_t>> TopLevelGroups(std::string_view head, bool* assigns) {
  std::vector<std::pair<size_t, size_t>> groups;
  int depth = 0;
  size_t open = 0;
  for (size_t k = 0; k < head.size(); ++k) {
    const char c = head[k];
    if (depth == 0 && IsIdentChar(c) && (k == 0 || !IsIdentChar(head[k - 1])) &&
        head.substr(k, 8) == "operator" && (k + 8 >= head.size() || !IsIdentChar(head[k + 8]))) {
      k += 8;
      while (k < head.size() && head[k] == ' ') ++k;
      if (head.substr(k, 2) == "()") k += 2;
      while (k < head.size() &&
             std::string_view("+-*/%^&|~!=<>,[]").find(head[k]) != std::string_view::npos) {
        ++k;
      }
      --k;
      continue;
    }
    if (c == '(' || c == '[') {
      if (depth++ == 0) open = k;
    } else if ((c == ')' || c == ']') && depth > 0) {
      if (--depth == 0 && c == ')') groups.emplace_back(open, k + 1);
    } else if (c == '=' && depth == 0) {
      const char prev = k > 0 ? head[k - 1] : ' ';
      const char next = k + 1 < head.size() ? head[k + 1] : ' ';
      if (next != '=' && std::string_view("=!<>").find(prev) == std::string_view::npos) {
        *assigns = true;
      }
    }
  }
  return groups;
}

// Whether |tail|, what follows a parameter list, is only what may stand
// between it and a body: cv and ref qualifiers, noexcept, override, final,
// a trailing return type or a requires clause.
bool IsFunctionTail(std::string_view tail) {
  tail = Trim(tail);
  while (!tail.empty()) {
    if (tail.substr(0, 2) == "->" || FirstWord(tail) == "requires") return true;
    if (tail[0] == '&') {
      tail = Trim(tail.substr(1));
      continue;
    }
    const std::string_view word = FirstWord(tail);
    if (word != "const" && word != "volatile" && word != "noexcept" && word != "override" &&
        word != "final" && word != "mutable") {
      return false;
    }
    tail = Trim(tail.substr(word.size()));
  }
  return true;
}

enum class BraceKind {
  kScope,        // namespace, class, extern "C": declarations continue inside.
  kFunction,     // A function body.
  kInitializer,  // A member initializer inside a constructor's init list.
  kOther,        // enum, aggregate initializer, …: skipped whole.
};

// What the "{" that ends |raw_head| opens, and for a function its name.
BraceKind Classify(std::string_view raw_head, std::string* name) {
  const std::string_view head = StripTemplate(raw_head);
  bool assigns = false;
  const auto groups = TopLevelGroups(head, &assigns);
  if (assigns) return BraceKind::kOther;
  for (const auto& [begin, end] : groups) {
    const std::string_view tail = head.substr(end);
    const std::string_view trimmed = Trim(tail);
    const bool init_list = !trimmed.empty() && trimmed[0] == ':' && trimmed.substr(0, 2) != "::";
    if (!init_list && !IsFunctionTail(tail)) continue;
    size_t name_start = begin;
    while (name_start > 0 && head[name_start - 1] == ' ') --name_start;
    size_t k = name_start;
    while (k > 0 && head[k - 1] != ' ') --k;
    *name = std::string(head.substr(k, name_start - k));
    if (name->rfind("TEST", 0) == 0) {
      *name += std::string(head.substr(begin, end - begin));  // TEST(Suite, Name).
    }
    // In "Foo() : a_{x}, b_(y) {", the brace after a member's name is its
    // initializer; the body's brace follows a ")" or "}".
    const char last = trimmed.empty() ? ')' : trimmed.back();
    if (init_list && (IsIdentChar(last) || last == '>')) return BraceKind::kInitializer;
    return BraceKind::kFunction;
  }
  const std::string_view word = FirstWord(head);
  if (word == "namespace" || word == "inline" || word == "extern" || word == "class" ||
      word == "struct" || word == "union") {
    return BraceKind::kScope;
  }
  return BraceKind::kOther;
}

// Every function body defined at namespace or class scope of |source|, with
// its length from the first line of its signature to its closing brace.
// Lambdas and local classes are part of the function that holds them.
std::vector<FunctionSpan> FindFunctions(std::string_view source) {
  const std::string s = Blank(source);
  auto line_of = [&](size_t pos) {
    return static_cast<size_t>(std::count(s.begin(), s.begin() + pos, '\n')) + 1;
  };
  std::vector<FunctionSpan> found;
  std::string head;  // Since the last ";", "{" or "}" at declaration scope.
  size_t head_start = std::string::npos;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == ';' || c == '}') {
      head.clear();
      head_start = std::string::npos;
      continue;
    }
    if (c == ':' &&
        (FirstWord(head) == "public" || FirstWord(head) == "private" ||
         FirstWord(head) == "protected") &&
        Trim(head).size() == FirstWord(head).size()) {
      head.clear();  // An access specifier is not part of the next signature.
      head_start = std::string::npos;
      continue;
    }
    if (c != '{') {
      if (head_start == std::string::npos && !std::isspace(static_cast<unsigned char>(c))) {
        head_start = i;
      }
      head += std::isspace(static_cast<unsigned char>(c)) ? ' ' : c;
      continue;
    }
    std::string name;
    switch (Classify(head, &name)) {
      case BraceKind::kScope:
        head.clear();
        head_start = std::string::npos;
        break;  // Its "}" is met at this same level and clears the head.
      case BraceKind::kInitializer:
        i = MatchingBrace(s, i);
        head += "{}";
        break;
      case BraceKind::kFunction: {
        const size_t close = MatchingBrace(s, i);
        const size_t first = line_of(head_start == std::string::npos ? i : head_start);
        found.push_back({name, first, line_of(std::min(close, s.size() - 1)) - first + 1});
        i = close;
        head.clear();
        head_start = std::string::npos;
        break;
      }
      case BraceKind::kOther:
        i = MatchingBrace(s, i);
        head += "{}";  // "enum E {…} e;" and "int a[] {…};" end at their ";".
        break;
    }
  }
  return found;
}

std::string Describe(const std::vector<FunctionSpan>& fs) {
  std::ostringstream out;
  for (const FunctionSpan& f : fs) out << f.name << "@" << f.first_line << "+" << f.lines << " ";
  return out.str();
}

TEST(FindFunctions, WrappedSignatureCountsFromItsFirstLine) {
  const auto fs = FindFunctions(
      "namespace a {\n"
      "Result<int> Long(const Something& s,\n"
      "                 int b) {\n"
      "  return 1;\n"
      "}\n"
      "}  // namespace a\n");
  EXPECT_EQ(Describe(fs), "Long@2+4 ");
}

TEST(FindFunctions, BracesInStringsCommentsAndCharsAreNotCode) {
  const auto fs = FindFunctions(
      "void F() {\n"
      "  const char* s = \"}\";  // }\n"
      "  char c = '}';\n"
      "  /* } */ auto raw = R\"x(\n"
      "  })x\";\n"
      "  int n = 1'000'000;\n"
      "}\n"
      "#define M {\n"
      "void G() { }\n");
  EXPECT_EQ(Describe(fs), "F@1+7 G@9+1 ");
}

TEST(FindFunctions, LambdasBelongToTheirFunctionAndInitializersAreNotFunctions) {
  const auto fs = FindFunctions(
      "const auto kTable = [] {\n"
      "  return 1;\n"
      "}();\n"
      "std::function<void()> cb = [](int x) { return x; };\n"
      "int H(int x = 2) {\n"
      "  auto f = [&](int y) {\n"
      "    return y;\n"
      "  };\n"
      "  return f(x);\n"
      "}\n");
  EXPECT_EQ(Describe(fs), "H@5+6 ");
}

TEST(FindFunctions, ClassesConstructorsAndOperators) {
  const auto fs = FindFunctions(
      "class Foo : public Bar<int> {\n"
      " public:\n"
      "  Foo(int a)\n"
      "      : a_{a}, b_(a) {}\n"
      "  bool operator==(const Foo& o) const { return a_ == o.a_; }\n"
      "  enum class E { kA, kB };\n"
      " private:\n"
      "  int a_ = 0;\n"
      "};\n"
      "template <typename T = int>\n"
      "auto Foo::Get() const -> T {\n"
      "  return T{};\n"
      "}\n"
      "TEST(Suite, Name) {\n"
      "}\n");
  EXPECT_EQ(Describe(fs), "Foo@3+2 operator==@5+1 Foo::Get@10+4 TEST(Suite, Name)@14+2 ");
}

std::vector<fs::path> ProductSources() {
  std::vector<fs::path> sources;
  for (const char* top : {"hostd", "shared", "guest-agent"}) {
    for (const auto& e : fs::recursive_directory_iterator(kRoot / top)) {
      const std::string ext = e.path().extension().string();
      if (e.is_regular_file() && (ext == ".cc" || ext == ".h")) sources.push_back(e.path());
    }
  }
  std::sort(sources.begin(), sources.end());
  return sources;
}

TEST(SourceShape, FilesAndFunctionsStaySmall) {
  size_t functions = 0;
  for (const fs::path& f : ProductSources()) {
    std::ifstream in(f);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string rel = fs::relative(f, kRoot).string();
    const size_t lines = static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
    EXPECT_LE(lines, kMaxFileLines) << rel << " has " << lines << " lines";
    for (const FunctionSpan& fn : FindFunctions(text)) {
      ++functions;
      EXPECT_LE(fn.lines, kMaxFunctionLines)
          << rel << ":" << fn.first_line << " " << fn.name << " is " << fn.lines << " lines";
    }
  }
  EXPECT_GT(functions, 1000u);
}

}  // namespace
