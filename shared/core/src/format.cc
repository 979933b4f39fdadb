// Parser for tracefs format files (see hvtrace/format.h for the grammar).
//
// Written by hand rather than through libtraceevent so that hostile text is
// rejected by small, fuzzed code with explicit limits before anything else
// (libtraceevent's own parser included) looks at it.
#include "hvtrace/format.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <unordered_set>

namespace hvtrace {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

bool IsIdentChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

bool IsIdentifier(std::string_view s) {
  if (s.empty() || s.size() > kMaxNameSize) return false;
  for (char c : s) {
    if (!IsIdentChar(c)) return false;
  }
  return true;
}

// Event and system names may contain more than identifiers (e.g. "9p",
// "sys_enter_openat", probes with dots); allow printable non-space ASCII but
// never path or control characters.
bool IsEventName(std::string_view s) {
  if (s.empty() || s.size() > kMaxNameSize) return false;
  for (char c : s) {
    if (c <= ' ' || c > '~' || c == '/') return false;
  }
  return true;
}

// Collapses runs of blanks into one space; the canonical type spelling that
// fingerprints hash.
std::string CollapseSpaces(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool in_space = false;
  for (char c : Trim(s)) {
    if (c == ' ' || c == '\t') {
      in_space = true;
      continue;
    }
    if (in_space && !out.empty()) out.push_back(' ');
    in_space = false;
    out.push_back(c);
  }
  return out;
}

bool ParseU32(std::string_view s, uint32_t max, uint32_t* out) {
  s = Trim(s);
  if (s.empty() || s.size() > 10) return false;
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v > max) return false;
  *out = static_cast<uint32_t>(v);
  return true;
}

// Splits |text| into lines without copying. A final line without '\n' counts.
class LineReader {
 public:
  explicit LineReader(std::string_view text) : text_(text) {}
  bool Next(std::string_view* line) {
    if (pos_ >= text_.size()) return false;
    size_t end = text_.find('\n', pos_);
    if (end == std::string_view::npos) end = text_.size();
    *line = text_.substr(pos_, end - pos_);
    pos_ = end + 1;
    ++line_no_;
    return true;
  }
  int line_no() const { return line_no_; }
  std::string_view rest() const {
    return pos_ >= text_.size() ? std::string_view() : text_.substr(pos_);
  }

 private:
  std::string_view text_;
  size_t pos_ = 0;
  int line_no_ = 0;
};

// Reads "key:value;" at the start of |s| (after blanks) and advances |s|.
bool TakeAttribute(std::string_view* s, std::string_view key, std::string_view* value) {
  std::string_view t = Trim(*s);
  if (t.substr(0, key.size()) != key || t.size() <= key.size() || t[key.size()] != ':') {
    return false;
  }
  t.remove_prefix(key.size() + 1);
  size_t semi = t.find(';');
  if (semi == std::string_view::npos) return false;
  *value = t.substr(0, semi);
  *s = t.substr(semi + 1);
  return true;
}

// Parses "field:DECL;\toffset:N;\tsize:N;\tsigned:N;". Returns an empty
// string on success, else what was wrong.
std::string ParseFieldLine(std::string_view line, bool strict_scalars, FieldFormat* field) {
  std::string_view rest = line;
  std::string_view decl;
  if (!TakeAttribute(&rest, "field", &decl)) return "expected 'field:<declaration>;'";
  decl = Trim(decl);
  if (decl.empty()) return "empty field declaration";
  // Every type the kernel prints is made of C identifiers, '*' and array
  // brackets; anything else is not a kernel format (and has been seen to
  // confuse libtraceevent's parser).
  for (char c : decl) {
    if (!IsIdentChar(c) && c != ' ' && c != '\t' && c != '*' && c != '[' && c != ']') {
      return "unexpected character in field declaration";
    }
  }

  std::string_view type_part;
  std::string_view array_part;  // "[16]" or "[]" when the name carries it.
  std::string_view name;
  std::string_view head = decl;
  if (head.back() == ']') {
    size_t open = head.rfind('[');
    if (open == std::string_view::npos) return "unbalanced ']' in field declaration";
    array_part = head.substr(open);
    head = Trim(head.substr(0, open));
  }
  size_t name_start = head.size();
  while (name_start > 0 && IsIdentChar(head[name_start - 1])) --name_start;
  name = head.substr(name_start);
  type_part = head.substr(0, name_start);
  if (!IsIdentifier(name)) return "bad field name";
  if (Trim(type_part).empty()) return "field '" + std::string(name) + "' has no type";

  field->name = std::string(name);
  field->type = CollapseSpaces(type_part);
  if (!array_part.empty()) {
    // The type text keeps the brackets so that "char[16]" and "char[32]"
    // differ in a fingerprint even when the size field says the same.
    field->type += CollapseSpaces(array_part);
  }
  if (field->type.starts_with("__data_loc")) {
    field->kind = FieldKind::kDataLoc;
  } else if (field->type.starts_with("__rel_loc")) {
    field->kind = FieldKind::kRelLoc;
  } else if (!array_part.empty()) {
    field->kind = FieldKind::kArray;
    std::string_view len = array_part.substr(1, array_part.size() - 2);
    uint32_t n = 0;
    field->array_length = (!Trim(len).empty() && ParseU32(len, kMaxFieldEnd, &n)) ? n : 0;
  } else {
    field->kind = FieldKind::kScalar;
  }

  std::string_view value;
  if (!TakeAttribute(&rest, "offset", &value) || !ParseU32(value, kMaxFieldEnd, &field->offset)) {
    return "bad offset of field '" + field->name + "'";
  }
  if (!TakeAttribute(&rest, "size", &value) || !ParseU32(value, kMaxFieldEnd, &field->size)) {
    return "bad size of field '" + field->name + "'";
  }
  if (static_cast<uint64_t>(field->offset) + field->size > kMaxFieldEnd) {
    return "field '" + field->name + "' ends past " + std::to_string(kMaxFieldEnd);
  }
  // Kernels before 2.6.36 have no "signed:"; treat as unsigned.
  field->is_signed = false;
  if (TakeAttribute(&rest, "signed", &value)) {
    uint32_t s = 0;
    if (!ParseU32(value, 1, &s)) return "bad signed flag of field '" + field->name + "'";
    field->is_signed = s != 0;
  }
  if (!Trim(rest).empty()) return "unexpected text after field '" + field->name + "'";
  if (strict_scalars && field->kind == FieldKind::kScalar && field->size > 8 &&
      field->size != 16) {
    // Scalars are 1, 2, 4 or 8 bytes (16 for __int128 / u128 fields).
    return "scalar field '" + field->name + "' has size " + std::to_string(field->size);
  }
  // The kernel's dynamic fields are a u32 (len << 16 | offset). libtraceevent
  // reads any other size past the record (format_fuzzer found a 2-byte one).
  if ((field->kind == FieldKind::kDataLoc || field->kind == FieldKind::kRelLoc) &&
      field->size != 4) {
    return "dynamic field '" + field->name + "' has size " + std::to_string(field->size);
  }
  return {};
}

// Index of the quote that closes the string or char literal opening at
// |open| (escapes skipped), or past the end when it is unterminated.
size_t LiteralEnd(std::string_view s, size_t open) {
  size_t j = open + 1;
  while (j < s.size() && s[j] != s[open]) j += s[j] == '\\' ? 2 : 1;
  return j;
}

// Checks that a print format is shaped like the kernel's: a string literal,
// then comma-separated C expressions made of literals, identifiers, calls,
// casts and operators, with balanced brackets and ternaries. libtraceevent's
// parser dereferences NULL on some malformed formats (format_fuzzer found
// several), so anything it could choke on is rejected here first. Returns an
// empty string when the format is acceptable.
std::string CheckPrintFormat(std::string_view fmt) {
  enum class Tok { kString, kChar, kNumber, kIdent, kOpen, kClose, kComma, kOp };
  std::vector<char> stack;      // Open brackets.
  std::vector<int> ternaries;   // Unmatched '?' per bracket level.
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
      if (have_prev && ((prev == Tok::kOp && prev_char != '*') || (prev == Tok::kComma && c != '}'))) {
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
  while (i < fmt.size() && (fmt[i] == ' ' || fmt[i] == '\t' || fmt[i] == '\n' || fmt[i] == '\r')) ++i;
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
    kind = of_field && (f == nullptr || f->size == 0) ? DivisorKind::kUnchecked : DivisorKind::kSafe;
  } else {
    return DivisorKind::kUnchecked;  // A unary operator, a call, a macro.
  }
  // Postfix ("REC->a[1]", "x.y", "f(...)") makes it another value.
  size_t next = SkipBlanks(fmt, end);
  if (next < fmt.size() && (fmt[next] == '[' || fmt[next] == '(' || fmt[next] == '.' ||
                            fmt.substr(next, 2) == "->")) {
    return DivisorKind::kUnchecked;
  }
  *end_out = end;
  return kind;
}

void AddOnce(std::vector<std::string>* names, std::string name) {
  if (std::find(names->begin(), names->end(), name) == names->end()) names->push_back(std::move(name));
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
  while (s.size() >= 2 && s.front() == '(' && SkipBrackets(s, 0) == s.size()) s = Trim(s.substr(1, s.size() - 2));
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
    return f != nullptr && f->kind == FieldKind::kScalar && f->size >= 1 && f->size <= 8 ? DivisorKind::kField
                                                                                        : DivisorKind::kUnchecked;
  }
  if (!arg.empty() && arg[0] >= '0' && arg[0] <= '9') {
    uint64_t value = 0;
    return ParseIntLiteral(arg, &value) && value <= kMaxPrintLength ? DivisorKind::kSafe : DivisorKind::kUnchecked;
  }
  if (arg.starts_with("sizeof") && arg.size() > 6 && !IsIdentChar(arg[6])) {
    size_t open = SkipBlanks(arg, 6);
    bool whole = open < arg.size() && arg[open] == '(' && SkipBrackets(arg, open) == arg.size();
    return whole ? DivisorKind::kSafe : DivisorKind::kUnchecked;
  }
  if (arg.starts_with("__get_dynamic_array_len") || arg.starts_with("__get_rel_dynamic_array_len")) {
    size_t open = arg.find('(');
    size_t end = open == std::string_view::npos ? open : SkipBrackets(arg, open);
    if (end == std::string_view::npos) return DivisorKind::kUnchecked;
    std::string_view rest = Trim(arg.substr(end));
    if (rest.empty()) return DivisorKind::kSafe;
    std::string unused;
    size_t divisor_end = 0;
    if (rest[0] == '/' && ClassifyDivisor(rest, 1, ev, &unused, &divisor_end) == DivisorKind::kSafe &&
        SkipBlanks(rest, divisor_end) == rest.size()) {
      return DivisorKind::kSafe;
    }
  }
  return DivisorKind::kUnchecked;
}

// Which arguments after the format string a '*' width or precision takes,
// counted from 0; stops at the first conversion it cannot read.
std::vector<size_t> StarArguments(std::string_view literal) {
  std::vector<size_t> stars;
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
        while (i < literal.size() && literal[i] >= '0' && literal[i] <= '9') ++i;
      }
    }
    while (i < literal.size() && std::strchr("hlLqjzt", literal[i]) != nullptr) ++i;
    if (i >= literal.size()) break;
    ++arg;  // The conversion's own argument.
  }
  return stars;
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
          ev->unchecked_print = std::string(what) + " length '" + std::string(arg.substr(0, 64)) + "' is not bounded";
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
          for (size_t k = 1; k < args.size(); ++k) length(args[k], hex ? "__print_hex" : "__print_array");
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
          ev->unchecked_print = "divisor '" + std::string(Trim(fmt.substr(i + 1, 32))) + "' may be 0";
        }
        break;
    }
  }
  // '*' widths and precisions: the format string is the first argument.
  std::vector<std::string_view> args = SplitArgs(fmt);
  if (args.empty() || args[0].size() < 2 || args[0].front() != '"') return;
  for (size_t star : StarArguments(args[0].substr(1, args[0].size() - 2))) {
    if (star + 1 < args.size()) length(args[star + 1], "'*' width or precision");
  }
}

Error MakeError(std::string_view system, std::string_view name, int line, const std::string& what) {
  std::string where = std::string(system.empty() ? "?" : system) + "/" +
                      std::string(name.empty() ? "?" : name);
  return Error{"event format " + where + " line " + std::to_string(line) + ": " + what};
}

Status CheckText(std::string_view text, std::string_view what) {
  if (text.size() > kMaxFormatTextSize) {
    return Error{std::string(what) + ": " + std::to_string(text.size()) + " bytes exceeds the " +
                 std::to_string(kMaxFormatTextSize) + "-byte limit"};
  }
  if (text.find('\0') != std::string_view::npos) {
    return Error{std::string(what) + ": contains a NUL byte at offset " +
                 std::to_string(text.find('\0'))};
  }
  return {};
}

}  // namespace

const FieldFormat* EventFormat::FindField(std::string_view field_name) const {
  for (const FieldFormat& f : fields) {
    if (f.name == field_name) return &f;
  }
  return nullptr;
}

Result<EventFormat> ParseEventFormat(std::string_view system, std::string_view text) {
  if (Status s = CheckText(text, "event format " + std::string(system.substr(0, 64)) + "/?"); !s) {
    return s.error();
  }
  if (!IsEventName(system)) {
    return MakeError(system.substr(0, 64), "", 0, "bad system name");
  }
  EventFormat ev;
  ev.system = std::string(system);
  LineReader lines(text);
  std::string_view line;
  bool have_name = false, have_id = false, in_fields = false, after_fields = false;
  bool common_section = true;
  std::unordered_set<std::string_view> seen;

  while (lines.Next(&line)) {
    std::string_view t = Trim(line);
    if (!in_fields || after_fields) {
      if (t.empty()) continue;
      if (t.starts_with("name:")) {
        if (have_name) return MakeError(system, ev.name, lines.line_no(), "second 'name:'");
        std::string_view n = Trim(t.substr(5));
        if (!IsEventName(n)) return MakeError(system, "", lines.line_no(), "bad event name");
        ev.name = std::string(n);
        have_name = true;
      } else if (t.starts_with("ID:")) {
        if (have_id) return MakeError(system, ev.name, lines.line_no(), "second 'ID:'");
        // trace_entry.type is a u16, so ids above 65535 cannot occur.
        if (!ParseU32(t.substr(3), 0xffff, &ev.id)) {
          return MakeError(system, ev.name, lines.line_no(), "bad ID");
        }
        have_id = true;
      } else if (t == "format:") {
        if (in_fields) return MakeError(system, ev.name, lines.line_no(), "second 'format:'");
        in_fields = true;
      } else if (t.starts_with("print fmt:")) {
        // The print format is the rest of the file (one line in practice).
        size_t start = static_cast<size_t>(t.data() - text.data()) + strlen("print fmt:");
        std::string_view fmt = Trim(text.substr(start));
        while (!fmt.empty() && (fmt.back() == '\n' || fmt.back() == '\r')) fmt.remove_suffix(1);
        ev.print_fmt = std::string(Trim(fmt));
        break;
      } else {
        return MakeError(system, ev.name, lines.line_no(), "unexpected line");
      }
      continue;
    }
    // Inside "format:": field lines; the first blank line ends the common
    // fields, a second one (or "print fmt:") ends the list.
    if (t.empty()) {
      if (common_section && !ev.fields.empty()) {
        common_section = false;
      } else if (!ev.fields.empty()) {
        after_fields = true;
      }
      continue;
    }
    if (t.starts_with("print fmt:")) {
      after_fields = true;
      size_t start = static_cast<size_t>(t.data() - text.data()) + strlen("print fmt:");
      std::string_view fmt = Trim(text.substr(start));
      while (!fmt.empty() && (fmt.back() == '\n' || fmt.back() == '\r')) fmt.remove_suffix(1);
      ev.print_fmt = std::string(Trim(fmt));
      break;
    }
    if (ev.fields.size() >= kMaxFields) {
      return MakeError(system, ev.name, lines.line_no(),
                       "more than " + std::to_string(kMaxFields) + " fields");
    }
    FieldFormat field;
    std::string what = ParseFieldLine(t, /*strict_scalars=*/true, &field);
    if (!what.empty()) return MakeError(system, ev.name, lines.line_no(), what);
    field.is_common = common_section;
    ev.fields.push_back(std::move(field));
  }
  // Names are checked for duplicates after the vector stops growing, so the
  // views stay valid.
  for (const FieldFormat& f : ev.fields) {
    if (!seen.insert(f.name).second) {
      return MakeError(system, ev.name, 0, "duplicate field '" + f.name + "'");
    }
  }
  // Every REC->field of the print format must be a field of the event:
  // libtraceevent 1.7's parser dereferences a NULL field otherwise (found by
  // format_fuzzer), and the kernel never writes such a format.
  for (size_t pos = ev.print_fmt.find("REC->"); pos != std::string::npos;
       pos = ev.print_fmt.find("REC->", pos + 1)) {
    size_t start = pos + 5, end = start;
    while (end < ev.print_fmt.size() && IsIdentChar(ev.print_fmt[end])) ++end;
    std::string_view ref(ev.print_fmt.data() + start, end - start);
    if (!seen.contains(ref)) {
      return MakeError(system, ev.name, 0,
                       "print fmt refers to unknown field '" + std::string(ref.substr(0, 64)) + "'");
    }
  }
  if (!ev.print_fmt.empty()) {
    std::string bad = CheckPrintFormat(ev.print_fmt);
    if (!bad.empty()) return MakeError(system, ev.name, 0, "print fmt: " + bad);
    FindPrintHazards(&ev);
  }
  if (!have_name) return MakeError(system, "", lines.line_no(), "missing 'name:'");
  if (!have_id) return MakeError(system, ev.name, lines.line_no(), "missing 'ID:'");
  if (!in_fields) return MakeError(system, ev.name, lines.line_no(), "missing 'format:'");
  return ev;
}

Result<std::vector<FieldFormat>> ParseHeaderPage(std::string_view text) {
  if (Status s = CheckText(text, "header_page"); !s) return s.error();
  std::vector<FieldFormat> fields;
  LineReader lines(text);
  std::string_view line;
  while (lines.Next(&line)) {
    std::string_view t = Trim(line);
    if (t.empty()) continue;
    if (fields.size() >= kMaxFields) return Error{"header_page: too many fields"};
    // header_page declares "char data" with the size of the whole data area.
    FieldFormat field;
    std::string what = ParseFieldLine(t, /*strict_scalars=*/false, &field);
    if (!what.empty()) {
      return Error{"header_page line " + std::to_string(lines.line_no()) + ": " + what};
    }
    fields.push_back(std::move(field));
  }
  for (const char* required : {"timestamp", "commit", "data"}) {
    bool found = false;
    for (const FieldFormat& f : fields) found = found || f.name == required;
    if (!found) return Error{std::string("header_page: no '") + required + "' field"};
  }
  return fields;
}

Result<HeaderEventFormat> ParseHeaderEvent(std::string_view text) {
  if (Status s = CheckText(text, "header_event"); !s) return s.error();
  HeaderEventFormat h;
  LineReader lines(text);
  std::string_view line;
  bool have_type_len = false, have_delta = false;
  while (lines.Next(&line)) {
    std::string_view t = Trim(line);
    if (t.empty() || t.front() == '#') continue;
    if (t.starts_with("data max type_len")) {  // "data max type_len  == 28"
      size_t eq = t.find("==");
      uint32_t n = 0;
      if (eq == std::string_view::npos || !ParseU32(t.substr(eq + 2), 31, &n)) {
        return Error{"header_event line " + std::to_string(lines.line_no()) +
                     ": bad 'data max type_len'"};
      }
      h.data_max_type_len = n;
      continue;
    }
    size_t colon = t.find(':');
    if (colon == std::string_view::npos) {
      return Error{"header_event line " + std::to_string(lines.line_no()) + ": expected 'key : value'"};
    }
    std::string_view key = Trim(t.substr(0, colon));
    std::string_view value = Trim(t.substr(colon + 1));
    uint32_t n = 0;
    auto number_before = [&](std::string_view suffix) {
      if (!value.ends_with(suffix)) return false;
      return ParseU32(value.substr(0, value.size() - suffix.size()), 64, &n);
    };
    auto type_value = [&]() {
      // "type == 29"
      if (!value.starts_with("type ==")) return false;
      return ParseU32(value.substr(7), 31, &n);
    };
    bool ok = true;
    if (key == "type_len") {
      ok = number_before("bits") && n >= 1 && n <= 8;
      h.type_len_bits = n;
      have_type_len = ok;
    } else if (key == "time_delta") {
      ok = number_before("bits") && n >= 1 && n <= 32;
      h.time_delta_bits = n;
      have_delta = ok;
    } else if (key == "array") {
      ok = number_before("bits");
      h.array_bits = n;
    } else if (key == "padding") {
      ok = type_value();
      h.padding_type = n;
    } else if (key == "time_extend") {
      ok = type_value();
      h.time_extend_type = n;
    } else if (key == "time_stamp") {
      ok = type_value();
      h.time_stamp_type = n;
    }
    // Unknown keys are kept for forward compatibility: newer kernels may add
    // lines, and the values we rely on are checked below.
    if (!ok) {
      return Error{"header_event line " + std::to_string(lines.line_no()) + ": bad value for '" +
                   std::string(key) + "'"};
    }
  }
  if (!have_type_len || !have_delta) return Error{"header_event: missing type_len or time_delta"};
  if (h.type_len_bits + h.time_delta_bits != 32) {
    return Error{"header_event: type_len and time_delta do not add up to 32 bits"};
  }
  return h;
}

}  // namespace hvtrace
