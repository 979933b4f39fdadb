// Print format checks (see print_format.h): the shape check that keeps
// libtraceevent's parser away from formats it would crash on, and the sorting
// of divisors and length arguments that its printer takes on trust.
#include "print_format.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <utility>
#include <vector>

namespace hvtrace::format_internal {
namespace {

// Index of the quote that closes the string or char literal opening at
// |open| (escapes skipped), or past the end when it is unterminated.
size_t LiteralEnd(std::string_view s, size_t open) {
  size_t j = open + 1;
  while (j < s.size() && s[j] != s[open]) j += s[j] == '\\' ? 2 : 1;
  return j;
}

// Index just past the bracket that closes the one at |open|, skipping string
// and char literals; npos when unbalanced (CheckPrintFormat rules that out).
size_t SkipBrackets(std::string_view fmt, size_t open) {
  int depth = 0;
  for (size_t i = open; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '"' || c == '\'') {
      i = LiteralEnd(fmt, i);
    } else if (c == '(' || c == '[' || c == '{') {
      ++depth;
    } else if (c == ')' || c == ']' || c == '}') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

size_t SkipBlanks(std::string_view fmt, size_t i) {
  while (i < fmt.size() && (fmt[i] == ' ' || fmt[i] == '\t' || fmt[i] == '\n' || fmt[i] == '\r'))
    ++i;
  return i;
}

// A C integer literal (hex, octal or decimal, suffixes allowed).
bool ParseIntLiteral(std::string_view tok, uint64_t* value) {
  tok = Trim(tok);
  while (!tok.empty() && std::strchr("uUlL", tok.back()) != nullptr) tok.remove_suffix(1);
  int base = 10;
  if (tok.size() > 2 && tok[0] == '0' && (tok[1] == 'x' || tok[1] == 'X')) {
    base = 16;
    tok.remove_prefix(2);
  } else if (tok.size() > 1 && tok[0] == '0') {
    base = 8;
  }
  if (tok.empty()) return false;
  auto [ptr, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), *value, base);
  return ec == std::errc() && ptr == tok.data() + tok.size();
}

// A C integer literal that is not 0 (floats and overflow are not literals).
bool IsNonzeroLiteral(std::string_view tok) {
  uint64_t value = 0;
  return ParseIntLiteral(tok, &value) && value != 0;
}

enum class DivisorKind { kSafe, kField, kUnchecked };

// Sorts the operand of a '/' or '%' that starts at |i| (the operator binds
// tighter than anything but unary operators, casts and postfix, so the
// operand is one primary expression). Only shapes whose value we can vouch
// for are anything but kUnchecked: a unary operator or cast can turn a
// nonzero value into 0.
DivisorKind ClassifyDivisor(std::string_view fmt, size_t i, const EventFormat& ev,
                            std::string* field, size_t* end_out) {
  i = SkipBlanks(fmt, i);
  if (i >= fmt.size()) return DivisorKind::kUnchecked;
  size_t end;
  DivisorKind kind;
  if (fmt[i] == '(') {
    // "(REC->x)" and "(1000)" are their content; a cast ("(u32)REC->x") or
    // an expression ("(a + b)") is not one whole operand, so it is unchecked.
    end = SkipBrackets(fmt, i);
    if (end == std::string_view::npos) return DivisorKind::kUnchecked;
    std::string_view inner = fmt.substr(i + 1, end - i - 2);
    size_t inner_end = 0;
    kind = ClassifyDivisor(inner, 0, ev, field, &inner_end);
    if (SkipBlanks(inner, inner_end) != inner.size()) kind = DivisorKind::kUnchecked;
  } else if (fmt[i] >= '0' && fmt[i] <= '9') {
    end = i;
    while (end < fmt.size() && (IsIdentChar(fmt[end]) || fmt[end] == '.')) ++end;
    kind = IsNonzeroLiteral(fmt.substr(i, end - i)) ? DivisorKind::kSafe : DivisorKind::kUnchecked;
  } else if (fmt.substr(i, 5) == "REC->") {
    end = i + 5;
    while (end < fmt.size() && IsIdentChar(fmt[end])) ++end;
    *field = std::string(fmt.substr(i + 5, end - i - 5));
    const FieldFormat* f = ev.FindField(*field);
    // Only a scalar of at most 8 bytes is zero exactly when its bytes are.
    kind = f != nullptr && f->kind == FieldKind::kScalar && f->size >= 1 && f->size <= 8
               ? DivisorKind::kField
               : DivisorKind::kUnchecked;
  } else if (fmt.substr(i, 6) == "sizeof" && (i + 6 == fmt.size() || !IsIdentChar(fmt[i + 6]))) {
    size_t open = SkipBlanks(fmt, i + 6);
    if (open >= fmt.size() || fmt[open] != '(') return DivisorKind::kUnchecked;
    end = SkipBrackets(fmt, open);
    if (end == std::string_view::npos) return DivisorKind::kUnchecked;
    // sizeof(REC->f) is the field's size, which may be 0; libtraceevent
    // refuses to parse sizeof of a type it does not know.
    std::string_view inner = Trim(fmt.substr(open + 1, end - open - 2));
    bool of_field = inner.starts_with("REC->");
    const FieldFormat* f = of_field ? ev.FindField(inner.substr(5)) : nullptr;
    kind =
        of_field && (f == nullptr || f->size == 0) ? DivisorKind::kUnchecked : DivisorKind::kSafe;
  } else {
    return DivisorKind::kUnchecked;  // A unary operator, a call, a macro.
  }
  // Postfix ("REC->a[1]", "x.y", "f(...)") makes it another value.
  size_t next = SkipBlanks(fmt, end);
  if (next < fmt.size() &&
      (fmt[next] == '[' || fmt[next] == '(' || fmt[next] == '.' || fmt.substr(next, 2) == "->")) {
    return DivisorKind::kUnchecked;
  }
  *end_out = end;
  return kind;
}

void AddOnce(std::vector<std::string>* names, std::string name) {
  if (std::find(names->begin(), names->end(), name) == names->end())
    names->push_back(std::move(name));
}

// The top-level comma-separated parts of |s| (brackets and literals kept
// whole).
std::vector<std::string_view> SplitArgs(std::string_view s) {
  std::vector<std::string_view> args;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '"' || c == '\'') {
      i = LiteralEnd(s, i);
    } else if (c == '(' || c == '[' || c == '{') {
      size_t end = SkipBrackets(s, i);
      if (end == std::string_view::npos) break;
      i = end - 1;
    } else if (c == ',') {
      args.push_back(Trim(s.substr(start, i - start)));
      start = i + 1;
    }
  }
  if (start <= s.size()) args.push_back(Trim(s.substr(start)));
  return args;
}

std::string_view StripParens(std::string_view s) {
  s = Trim(s);
  while (s.size() >= 2 && s.front() == '(' && SkipBrackets(s, 0) == s.size())
    s = Trim(s.substr(1, s.size() - 2));
  return s;
}

// Sorts a length argument (see format.h): "REC->len" is checked per record;
// a literal up to kMaxPrintLength, sizeof(...) and
// "__get_dynamic_array_len(x)" (optionally divided by a nonzero literal or a
// sizeof) are bounded; nothing else is.
DivisorKind ClassifyLength(std::string_view arg, const EventFormat& ev, std::string* field) {
  arg = StripParens(arg);
  // A cast to an integer type ("(int) REC->len", "(int)8 * 2"): a length
  // that passes the checks below fits any of them.
  if (!arg.empty() && arg[0] == '(') {
    size_t close = SkipBrackets(arg, 0);
    std::string_view type = close == std::string_view::npos ? "" : Trim(arg.substr(1, close - 2));
    bool is_type = !type.empty() && !(type[0] >= '0' && type[0] <= '9');
    for (char c : type) is_type = is_type && (IsIdentChar(c) || c == ' ');
    if (is_type && type.find("REC") == std::string_view::npos) arg = Trim(arg.substr(close));
  }
  // "8 * 2": a product of two literals.
  if (size_t star = arg.find('*'); star != std::string_view::npos) {
    uint64_t a = 0, b = 0;
    return ParseIntLiteral(arg.substr(0, star), &a) && ParseIntLiteral(arg.substr(star + 1), &b) &&
                   a <= kMaxPrintLength && b <= kMaxPrintLength && a * b <= kMaxPrintLength
               ? DivisorKind::kSafe
               : DivisorKind::kUnchecked;
  }
  if (arg.starts_with("REC->") && IsIdentifier(arg.substr(5))) {
    *field = std::string(arg.substr(5));
    const FieldFormat* f = ev.FindField(*field);
    return f != nullptr && f->kind == FieldKind::kScalar && f->size >= 1 && f->size <= 8
               ? DivisorKind::kField
               : DivisorKind::kUnchecked;
  }
  if (!arg.empty() && arg[0] >= '0' && arg[0] <= '9') {
    uint64_t value = 0;
    return ParseIntLiteral(arg, &value) && value <= kMaxPrintLength ? DivisorKind::kSafe
                                                                    : DivisorKind::kUnchecked;
  }
  if (arg.starts_with("sizeof") && arg.size() > 6 && !IsIdentChar(arg[6])) {
    size_t open = SkipBlanks(arg, 6);
    bool whole = open < arg.size() && arg[open] == '(' && SkipBrackets(arg, open) == arg.size();
    return whole ? DivisorKind::kSafe : DivisorKind::kUnchecked;
  }
  if (arg.starts_with("__get_dynamic_array_len") ||
      arg.starts_with("__get_rel_dynamic_array_len")) {
    size_t open = arg.find('(');
    size_t end = open == std::string_view::npos ? open : SkipBrackets(arg, open);
    if (end == std::string_view::npos) return DivisorKind::kUnchecked;
    std::string_view rest = Trim(arg.substr(end));
    if (rest.empty()) return DivisorKind::kSafe;
    std::string unused;
    size_t divisor_end = 0;
    if (rest[0] == '/' &&
        ClassifyDivisor(rest, 1, ev, &unused, &divisor_end) == DivisorKind::kSafe &&
        SkipBlanks(rest, divisor_end) == rest.size()) {
      return DivisorKind::kSafe;
    }
  }
  return DivisorKind::kUnchecked;
}

// Which arguments after the format string a '*' width or precision takes,
// counted from 0, and the largest width or precision written as a number
// (|*max_literal|); stops at the first conversion it cannot read.
std::vector<size_t> StarArguments(std::string_view literal, uint64_t* max_literal) {
  std::vector<size_t> stars;
  *max_literal = 0;
  size_t arg = 0;
  for (size_t i = 0; i < literal.size(); ++i) {
    if (literal[i] != '%') continue;
    if (++i < literal.size() && literal[i] == '%') continue;
    while (i < literal.size() && std::strchr("-+ #0", literal[i]) != nullptr) ++i;
    for (int part = 0; part < 2; ++part) {  // width, then precision
      if (part == 1) {
        if (i >= literal.size() || literal[i] != '.') break;
        ++i;
      }
      if (i < literal.size() && literal[i] == '*') {
        stars.push_back(arg++);
        ++i;
      } else {
        uint64_t n = 0;
        for (; i < literal.size() && literal[i] >= '0' && literal[i] <= '9'; ++i)
          n = std::min<uint64_t>(n * 10 + static_cast<uint64_t>(literal[i] - '0'), 1ull << 40);
        *max_literal = std::max(*max_literal, n);
      }
    }
    while (i < literal.size() && std::strchr("hlLqjzt", literal[i]) != nullptr) ++i;
    if (i >= literal.size()) break;
    ++arg;  // The conversion's own argument.
  }
  return stars;
}

}  // namespace

// Checks that a print format is shaped like the kernel's: a string literal,
// then comma-separated C expressions made of literals, identifiers, calls,
// casts and operators, with balanced brackets and ternaries. libtraceevent's
// parser dereferences NULL on some malformed formats (format_fuzzer found
// several), so anything it could choke on is rejected here first. Returns an
// empty string when the format is acceptable.
std::string CheckPrintFormat(std::string_view fmt) {
  enum class Tok { kString, kChar, kNumber, kIdent, kOpen, kClose, kComma, kOp };
  std::vector<char> stack;     // Open brackets.
  std::vector<int> ternaries;  // Unmatched '?' per bracket level.
  ternaries.push_back(0);
  size_t i = 0;
  bool first = true;
  bool have_prev = false;
  bool seen_comma = false;
  char prev_char = 0, prev_char_next = 0;
  Tok prev = Tok::kComma;
  auto operand_expected = [&]() {
    return have_prev && (prev == Tok::kOp || prev == Tok::kComma || prev == Tok::kOpen);
  };
  while (i < fmt.size()) {
    char c = fmt[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++i;
      continue;
    }
    Tok tok;
    if (c == '"' || c == '\'') {
      size_t j = LiteralEnd(fmt, i);
      if (j >= fmt.size()) return "unterminated literal";
      tok = c == '"' ? Tok::kString : Tok::kChar;
      i = j + 1;
    } else if (c >= '0' && c <= '9') {
      while (i < fmt.size() && (IsIdentChar(fmt[i]) || fmt[i] == '.')) ++i;
      tok = Tok::kNumber;
    } else if (IsIdentChar(c)) {
      while (i < fmt.size() && IsIdentChar(fmt[i])) ++i;
      tok = Tok::kIdent;
    } else if (c == '(' || c == '[' || c == '{') {
      if (stack.size() >= 64) return "nesting too deep";
      stack.push_back(c);
      ternaries.push_back(0);
      tok = Tok::kOpen;
      ++i;
    } else if (c == ')' || c == ']' || c == '}') {
      char open = c == ')' ? '(' : c == ']' ? '[' : '{';
      if (stack.empty() || stack.back() != open) return "unbalanced brackets";
      if (ternaries.back() != 0) return "'?' without ':'";
      // "f()" is fine; "(a +)" and "(a,)" are not.
      // A cast's '*' may close: "(void *)".
      if (have_prev &&
          ((prev == Tok::kOp && prev_char != '*') || (prev == Tok::kComma && c != '}'))) {
        return "missing operand";
      }
      stack.pop_back();
      ternaries.pop_back();
      tok = Tok::kClose;
      ++i;
    } else if (c == ';') {
      // Statement expressions: "({ int x = ...; x; })".
      if (stack.empty()) return "';' outside brackets";
      tok = Tok::kComma;
      ++i;
    } else if (c == ',') {
      if (operand_expected()) return "missing operand";
      if (ternaries.back() != 0) return "'?' without ':'";
      tok = Tok::kComma;
      ++i;
    } else if (std::strchr("+-*/%&|^!~<>=?:.", c) != nullptr) {
      static const char* const kTwoChar[] = {"->", "<<", ">>", "<=", ">=", "==", "!=", "&&", "||"};
      size_t len = 1;
      for (const char* two : kTwoChar) {
        if (fmt.substr(i, 2) == two) len = 2;
      }
      if (c == '?') ternaries.back()++;
      if (c == ':') {
        if (ternaries.back() == 0) return "':' without '?'";
        ternaries.back()--;
      }
      // Binary operators need a left operand; only unary ones may follow
      // another operator, a comma or an opening bracket.
      if (operand_expected() && (len == 2 || std::strchr("-+*&!~", c) == nullptr)) {
        return std::string("operator '") + std::string(fmt.substr(i, len)) + "' without operand";
      }
      tok = Tok::kOp;
      prev_char_next = len == 1 ? c : 0;
      i += len;
    } else {
      return std::string("unexpected character '") + c + "'";
    }
    if (first) {
      if (tok != Tok::kString) return "does not start with a string literal";
      first = false;
    } else if (!seen_comma && tok != Tok::kComma && tok != Tok::kString) {
      return "expected ',' after the format string";
    }
    if (tok == Tok::kComma && c == ',') seen_comma = true;
    prev_char = tok == Tok::kOp ? prev_char_next : 0;
    prev = tok;
    have_prev = true;
  }
  if (first) return "empty";
  if (!stack.empty()) return "unbalanced brackets";
  if (ternaries.back() != 0) return "'?' without ':'";
  if (prev == Tok::kOp || prev == Tok::kComma) return "ends with an operator";
  return {};
}

// Fills the divisor, length and unchecked fields of |ev| (see format.h) from
// a print format that CheckPrintFormat accepted.
void FindPrintHazards(EventFormat* ev) {
  std::string_view fmt = ev->print_fmt;
  auto length = [&](std::string_view arg, const char* what) {
    std::string field;
    switch (ClassifyLength(arg, *ev, &field)) {
      case DivisorKind::kSafe:
        break;
      case DivisorKind::kField:
        AddOnce(&ev->length_fields, std::move(field));
        break;
      case DivisorKind::kUnchecked:
        if (ev->unchecked_print.empty()) {
          ev->unchecked_print =
              std::string(what) + " length '" + std::string(arg.substr(0, 64)) + "' is not bounded";
        }
        break;
    }
  };
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '"' || c == '\'') {
      i = LiteralEnd(fmt, i);
      continue;
    }
    if (IsIdentChar(c) && (i == 0 || !IsIdentChar(fmt[i - 1]))) {
      size_t end = i;
      while (end < fmt.size() && IsIdentChar(fmt[end])) ++end;
      std::string_view name = fmt.substr(i, end - i);
      size_t open = SkipBlanks(fmt, end);
      bool hex = name == "__print_hex" || name == "__print_hex_str";
      if ((hex || name == "__print_array") && open < fmt.size() && fmt[open] == '(') {
        size_t close = SkipBrackets(fmt, open);
        if (close == std::string_view::npos) return;
        std::vector<std::string_view> args = SplitArgs(fmt.substr(open + 1, close - open - 2));
        if (args.size() != (hex ? 2u : 3u)) {
          ev->unchecked_print = std::string(name) + " takes " + (hex ? "2" : "3") + " arguments";
        } else {
          for (size_t k = 1; k < args.size(); ++k)
            length(args[k], hex ? "__print_hex" : "__print_array");
        }
      }
      i = end - 1;
      continue;
    }
    if (c != '/' && c != '%') continue;
    std::string field;
    size_t end = 0;
    switch (ClassifyDivisor(fmt, i + 1, *ev, &field, &end)) {
      case DivisorKind::kSafe:
        break;
      case DivisorKind::kField:
        AddOnce(&ev->divisor_fields, std::move(field));
        break;
      case DivisorKind::kUnchecked:
        if (ev->unchecked_print.empty()) {
          ev->unchecked_print =
              "divisor '" + std::string(Trim(fmt.substr(i + 1, 32))) + "' may be 0";
        }
        break;
    }
  }
  // '*' widths and precisions: the format string is the first argument.
  std::vector<std::string_view> args = SplitArgs(fmt);
  if (args.empty() || args[0].size() < 2 || args[0].front() != '"') return;
  uint64_t max_literal = 0;
  for (size_t star : StarArguments(args[0].substr(1, args[0].size() - 2), &max_literal)) {
    if (star + 1 < args.size()) length(args[star + 1], "'*' width or precision");
  }
  // libtraceevent grows its output 4 KiB per vsnprintf retry, so a width of
  // N costs O(N^2 / 4096): "%3000000d" held the trial parse for over 10 s
  // (format_fuzzer's timeout in CI). No kernel format comes near this.
  if (max_literal > kMaxPrintLength && ev->unchecked_print.empty()) {
    ev->unchecked_print = "width or precision " + std::to_string(max_literal) + " is larger than " +
                          std::to_string(kMaxPrintLength);
  }
}

}  // namespace hvtrace::format_internal
