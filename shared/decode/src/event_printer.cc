// Compiled printers (see event_printer.h).
//
// The compiler mirrors libtraceevent 1.7's pretty_print() step by step: the
// format string is cut into pieces the way parse_args() cuts it, numeric
// arguments are evaluated the way eval_num_arg() evaluates them (unsigned
// field reads, casts as masks, out-of-record fields read as 0), strings the
// way print_str_arg() prints them. Anything outside that subset (bprint,
// printk pointers, dynamic arrays in numbers, %pM/%pI/..., helper functions,
// symbolic names that need libtraceevent's tables) makes Compile() return
// null so libtraceevent prints the event. The golden test and the decoder
// test compare both paths on every record of real traces.
#include "event_printer.h"

#include <traceevent/event-parse.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "event_text.h"
#include "num_expr.h"
#include "number_text.h"
#include "sched_printer.h"

namespace hvtrace {
namespace {

using event_printer_internal::AtomValues;
using event_printer_internal::CompileNum;
using event_printer_internal::Expr;
using event_printer_internal::FindField;

// ---- printf pieces ----------------------------------------------------------

// A printf conversion "%[flags][width][.prec][len]conv" as written in the
// event's format, checked to be one we can reproduce natively.
struct Spec {
  std::string text;  // The conversion as libtraceevent passes it to printf.
  bool left = false, zero = false;
  int width = 0;
  bool native = false;  // Only '-', '0' and a width: formatted by us.
  char conv = 0;
};

Spec ParseSpec(const std::string& text) {
  Spec s;
  s.text = text;
  s.conv = text.back();
  size_t i = 1;
  bool ok = true;
  for (; i < text.size() && (text[i] == '-' || text[i] == '0'); ++i) {
    if (text[i] == '-') s.left = true;
    if (text[i] == '0') s.zero = true;
  }
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    s.width = s.width * 10 + (text[i] - '0');
    if (s.width > 1000) ok = false;
  }
  for (; i + 1 < text.size(); ++i) {
    char c = text[i];
    if (c != 'h' && c != 'l' && c != 'L' && c != 'z' && c != 'Z') ok = false;
  }
  s.native = ok;
  return s;
}

void Pad(std::string* out, size_t start, const Spec& spec, bool numeric_zero_ok) {
  size_t len = out->size() - start;
  if (static_cast<int>(len) >= spec.width) return;
  size_t pad = static_cast<size_t>(spec.width) - len;
  if (spec.left) {
    out->append(pad, ' ');
  } else if (spec.zero && numeric_zero_ok) {
    // Zeros go after the sign.
    size_t at = start + ((*out)[start] == '-' ? 1 : 0);
    out->insert(at, pad, '0');
  } else {
    out->insert(start, pad, ' ');
  }
}

void AppendFormattedString(std::string* out, const Spec& spec, int len_arg, const char* str) {
  if (len_arg < 0 && spec.text == "%s") {
    out->append(str);
    return;
  }
  if (len_arg < 0 && spec.native) {
    size_t start = out->size();
    out->append(str);
    Pad(out, start, spec, false);
    return;
  }
  char buf[512];
  int n = len_arg >= 0 ? std::snprintf(buf, sizeof(buf), spec.text.c_str(), len_arg, str)
                       : std::snprintf(buf, sizeof(buf), spec.text.c_str(), str);
  if (n < 0) return;
  if (static_cast<size_t>(n) < sizeof(buf)) {
    out->append(buf, static_cast<size_t>(n));
    return;
  }
  std::string big(static_cast<size_t>(n) + 1, '\0');
  if (len_arg >= 0) {
    std::snprintf(big.data(), big.size(), spec.text.c_str(), len_arg, str);
  } else {
    std::snprintf(big.data(), big.size(), spec.text.c_str(), str);
  }
  out->append(big.data(), static_cast<size_t>(n));
}

// ---- steps -------------------------------------------------------------------

// Bytes MakePrintableFrom leaves as they are in any context: printable
// ASCII, tab and newline.
bool PlainText(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return (c >= 0x20 && c < 0x7f) || c == '\n' || c == '\t'; });
}

struct Step {
  virtual ~Step() = default;
  virtual void Run(const unsigned char* data, uint32_t size, std::string* out) const = 0;
  // Whether every text the step can print is PlainText, whatever the record.
  virtual bool Plain() const { return false; }
};

struct LiteralStep : Step {
  std::string text;
  void Run(const unsigned char*, uint32_t, std::string* out) const override { out->append(text); }
  bool Plain() const override { return PlainText(text); }
};

// print_arg_number(): the value cast to the length modifier's type, then
// printf'd with the format's conversion. The literal text before it, when
// short, is printed by the step too (FormatCompiler::Number, number_text.h).
struct NumberStep : Step {
  Spec spec;
  int ls = 0;
  std::unique_ptr<Expr> value;
  std::unique_ptr<Expr> len_arg;  // '*'
  NumberText native;              // Used when spec.native and no len_arg.

  // A number printed by d, i, u, x, X or o (what Number compiles) is signs,
  // digits, letters and spaces; the literal before it is the format's.
  bool Plain() const override {
    return PlainText(std::string_view(native.prefix, native.prefix_len));
  }

  void Run(const unsigned char* data, uint32_t size, std::string* out) const override {
    uint64_t v = value->EvalInline(data, size);
    int64_t sv;
    uint64_t uv;
    switch (ls) {
      case -2:
        sv = static_cast<signed char>(v);
        uv = static_cast<unsigned char>(v);
        break;
      case -1:
        sv = static_cast<short>(v);
        uv = static_cast<unsigned short>(v);
        break;
      case 0:
        sv = static_cast<int>(v);
        uv = static_cast<unsigned int>(v);
        break;
      default:
        sv = static_cast<int64_t>(v);
        uv = v;
        break;
    }
    if (spec.native && !len_arg) {
      native.Append(sv, uv, out);
      return;
    }
    out->append(native.prefix, native.prefix_len);
    AppendPrintf(v, data, size, out);
  }

  // printf itself, for the conversions NumberText does not reproduce.
  void AppendPrintf(uint64_t v, const unsigned char* data, uint32_t size, std::string* out) const {
    char buf[128];
    int n;
    int plen = len_arg ? static_cast<int>(len_arg->Eval(data, size)) : -1;
    const char* f = spec.text.c_str();
    // Same argument types as print_arg_number() passes.
    switch (ls) {
      case -2:
        n = plen >= 0 ? std::snprintf(buf, sizeof(buf), f, plen, static_cast<char>(v))
                      : std::snprintf(buf, sizeof(buf), f, static_cast<char>(v));
        break;
      case -1:
        n = plen >= 0 ? std::snprintf(buf, sizeof(buf), f, plen, static_cast<short>(v))
                      : std::snprintf(buf, sizeof(buf), f, static_cast<short>(v));
        break;
      case 0:
        n = plen >= 0 ? std::snprintf(buf, sizeof(buf), f, plen, static_cast<int>(v))
                      : std::snprintf(buf, sizeof(buf), f, static_cast<int>(v));
        break;
      case 1:
        n = plen >= 0 ? std::snprintf(buf, sizeof(buf), f, plen, static_cast<long>(v))
                      : std::snprintf(buf, sizeof(buf), f, static_cast<long>(v));
        break;
      default:
        n = plen >= 0 ? std::snprintf(buf, sizeof(buf), f, plen, static_cast<long long>(v))
                      : std::snprintf(buf, sizeof(buf), f, static_cast<long long>(v));
        break;
    }
    if (n > 0) out->append(buf, std::min(static_cast<size_t>(n), sizeof(buf) - 1));
  }

  static void AppendHex(std::string* out, uint64_t v, bool upper) {
    char buf[16];
    char* end = buf + sizeof(buf);
    char* p = FormatHexBackwards(v, end, upper);
    out->append(p, static_cast<size_t>(end - p));
  }
  static void AppendOctal(std::string* out, uint64_t v) {
    char buf[24];
    char* end = buf + sizeof(buf);
    char* p = end;
    do {
      *--p = static_cast<char>('0' + (v & 7));
      v >>= 3;
    } while (v);
    out->append(p, static_cast<size_t>(end - p));
  }
};

// print_arg_pointer(): %p, %pS/%ps/%pF/%pf.
struct PointerStep : Step {
  SymbolCache* symbols = nullptr;
  char kind = 0;  // 0 plain %p, else 'S','s','F','f'.
  std::unique_ptr<Expr> value;

  void Run(const unsigned char* data, uint32_t size, std::string* out) const override {
    uint64_t v = value->Eval(data, size);
    if (kind == 0) {
      // glibc's "%p".
      if (v == 0) {
        out->append("(nil)");
      } else {
        out->append("0x");
        NumberStep::AppendHex(out, v, false);
      }
      return;
    }
    uint64_t start = 0;
    const char* func = symbols->Find(v, &start);
    if (func != nullptr) {
      out->append(func);
      if (kind == 'F' || kind == 'S') {
        out->append("+0x");
        NumberStep::AppendHex(out, v - start, false);
      }
    } else {
      out->append("0x");
      NumberStep::AppendHex(out, v, false);
    }
  }
};

// print_str_arg() for the argument kinds we support, as a tree.
struct StrNode {
  enum Kind {
    kNothing,
    kLiteral,
    kCharField,
    kDynString,
    kFlags,
    kSymbol,
    kTernary
  } kind = kNothing;
  std::string literal;
  uint32_t offset = 0, len = 0;  // kCharField: bytes; kDynString: the u32 locator.
  bool relative = false;         // kDynString with __rel_loc.
  std::unique_ptr<Expr> value;   // kFlags/kSymbol: the value; kTernary: condition.
  std::vector<std::pair<int64_t, std::string>> table;
  std::string delim;
  bool has_delim = false;
  std::unique_ptr<StrNode> yes, no;
};

std::unique_ptr<StrNode> CompileStr(tep_handle* tep, tep_event* event, tep_print_arg* arg,
                                    const AtomValues* atoms) {
  auto n = std::make_unique<StrNode>();
  if (arg == nullptr) return nullptr;
  switch (arg->type) {
    case TEP_PRINT_NULL:
    case TEP_PRINT_TYPE:
      return n;
    case TEP_PRINT_ATOM:
      n->kind = StrNode::kLiteral;
      n->literal = arg->atom.atom;
      return n;
    case TEP_PRINT_BSTRING:
      n->kind = StrNode::kLiteral;
      n->literal = arg->string.string;
      return n;
    case TEP_PRINT_FIELD: {
      tep_format_field* f = FindField(event, arg);
      if (f == nullptr || f->offset < 0 || f->size <= 0) return nullptr;
      // A long-sized non-array is printed as a printk pointer: not ours.
      if (!(f->flags & TEP_FIELD_IS_ARRAY) && f->size == tep_get_long_size(tep)) return nullptr;
      n->kind = StrNode::kCharField;
      n->offset = static_cast<uint32_t>(f->offset);
      n->len = static_cast<uint32_t>(f->size);
      return n;
    }
    case TEP_PRINT_STRING: {
      tep_format_field* f = arg->string.field;
      if (f == nullptr) f = tep_find_any_field(event, arg->string.string);
      if (f == nullptr || f->offset < 0 || (f->size != 4 && f->size != 2)) return nullptr;
      if (f->size != 4) return nullptr;
      n->kind = StrNode::kDynString;
      n->offset = static_cast<uint32_t>(f->offset);
      n->len = static_cast<uint32_t>(f->size);
      n->relative = (f->flags & TEP_FIELD_IS_RELATIVE) != 0;
      return n;
    }
    case TEP_PRINT_FLAGS:
    case TEP_PRINT_SYMBOL: {
      bool flags = arg->type == TEP_PRINT_FLAGS;
      n->kind = flags ? StrNode::kFlags : StrNode::kSymbol;
      n->value = CompileNum(event, flags ? arg->flags.field : arg->symbol.field, atoms);
      if (!n->value) return nullptr;
      for (tep_print_flag_sym* f = flags ? arg->flags.flags : arg->symbol.symbols; f; f = f->next) {
        // eval_flag(): numbers only; names need libtraceevent's table.
        if (!std::isdigit(static_cast<unsigned char>(f->value[0]))) return nullptr;
        n->table.emplace_back(static_cast<int64_t>(std::strtoull(f->value, nullptr, 0)), f->str);
      }
      if (flags && arg->flags.delim != nullptr) {
        n->has_delim = true;
        n->delim = arg->flags.delim;
      }
      return n;
    }
    case TEP_PRINT_OP: {
      if (arg->op.op[0] != '?') return n;  // Prints nothing, as print_str_arg does.
      tep_print_arg* colon = arg->op.right;
      if (colon == nullptr || colon->type != TEP_PRINT_OP) return nullptr;
      n->kind = StrNode::kTernary;
      n->value = CompileNum(event, arg->op.left, atoms);
      n->yes = CompileStr(tep, event, colon->op.left, atoms);
      n->no = CompileStr(tep, event, colon->op.right, atoms);
      return n->value && n->yes && n->no ? std::move(n) : nullptr;
    }
    default:
      return nullptr;
  }
}

void RunStr(const StrNode& n, const Spec& spec, int len_arg, const unsigned char* data,
            uint32_t size, std::string* out) {
  switch (n.kind) {
    case StrNode::kNothing:
      return;
    case StrNode::kLiteral:
      AppendFormattedString(out, spec, len_arg, n.literal.c_str());
      return;
    case StrNode::kCharField: {
      // print_str_arg copies the field's bytes and NUL-terminates them; the
      // scratch area is zero-padded so the copy never leaves our memory.
      char buf[256];
      if (n.len < sizeof(buf)) {
        std::memcpy(buf, data + n.offset, n.len);
        buf[n.len] = 0;
        AppendFormattedString(out, spec, len_arg, buf);
      } else {
        std::string s(reinterpret_cast<const char*>(data + n.offset), n.len);
        AppendFormattedString(out, spec, len_arg, s.c_str());
      }
      return;
    }
    case StrNode::kDynString: {
      // dynamic_offset_field().
      if (static_cast<uint64_t>(n.offset) + n.len > size) return;
      uint32_t loc;
      std::memcpy(&loc, data + n.offset, 4);
      uint32_t o = loc & 0xffff, l = loc >> 16;
      uint32_t off = o > size ? 0 : o;
      uint32_t len = o + l > size ? 0 : l;
      if (n.relative) off += n.offset + n.len;
      if (len == 0) return;
      AppendFormattedString(out, spec, len_arg, reinterpret_cast<const char*>(data + off));
      return;
    }
    case StrNode::kFlags: {
      int64_t val = static_cast<int64_t>(n.value->Eval(data, size));
      bool printed = false;
      for (const auto& [fval, str] : n.table) {
        if (!val && fval < 0) {
          AppendFormattedString(out, spec, len_arg, str.c_str());
          break;
        }
        if (fval > 0 && (val & fval) == fval) {
          if (printed && n.has_delim) out->append(n.delim);
          AppendFormattedString(out, spec, len_arg, str.c_str());
          printed = true;
          val &= ~fval;
        }
      }
      if (val) {
        if (printed && n.has_delim) out->append(n.delim);
        out->append("0x");
        NumberStep::AppendHex(out, static_cast<uint64_t>(val), false);
      }
      return;
    }
    case StrNode::kSymbol: {
      int64_t val = static_cast<int64_t>(n.value->Eval(data, size));
      for (const auto& [fval, str] : n.table) {
        if (val == fval) {
          AppendFormattedString(out, spec, len_arg, str.c_str());
          return;
        }
      }
      out->append("0x");
      NumberStep::AppendHex(out, static_cast<uint64_t>(val), false);
      return;
    }
    case StrNode::kTernary:
      RunStr(n.value->Eval(data, size) ? *n.yes : *n.no, spec, len_arg, data, size, out);
      return;
  }
}

// print_arg_string(): the string argument through a helper seq, whose
// content is then added with trace_seq_puts (so it ends at a NUL).
struct StringStep : Step {
  Spec spec;
  std::unique_ptr<StrNode> node;
  std::unique_ptr<Expr> len_arg;
  void Run(const unsigned char* data, uint32_t size, std::string* out) const override {
    int plen = len_arg ? static_cast<int>(len_arg->Eval(data, size)) : -1;
    size_t start = out->size();
    RunStr(*node, spec, plen, data, size, out);
    size_t nul = out->find('\0', start);
    if (nul != std::string::npos) out->resize(nul);
  }
};

// ---- the format string (parse_args) -----------------------------------------

// Cuts a print format into steps as parse_args()/parse_arg_format()/
// parse_arg_string() do, consuming the event's print arguments in order.
// Every method returns false when a piece is outside what we reproduce.
class FormatCompiler {
 public:
  FormatCompiler(tep_handle* tep, tep_event* event, tep_print_arg* args, SymbolCache* symbols,
                 const AtomValues* atoms, std::vector<std::unique_ptr<Step>>* steps)
      : tep_(tep),
        event_(event),
        arg_(args),
        symbols_(symbols),
        atoms_(atoms),
        steps_(steps),
        long_size_(tep_get_long_size(tep)) {}

  bool Compile(const char* format) {
    const char* p = format;
    while (*p) {
      const bool ok = *p == '%' && p[1] != '%' ? Conversion(&p) : Literal(&p);
      if (!ok) return false;
    }
    return true;
  }

 private:
  // parse_arg_format(): the conversion starting at the '%' |*pp| points to.
  // Leaves |*pp| just past it.
  bool Conversion(const char** pp) {
    const char* p = *pp;
    const char* start = p;
    int ls = 0;
    tep_print_arg* len_arg = nullptr;
    ++p;
    bool done = false;
    for (; *p && !done; ++p) {
      char c = *p;
      switch (c) {
        case '#':  // Kept in the text; printf handles it (not natively).
          break;
        case 'h':
          ls--;
          break;
        case 'l':
          ls++;
          break;
        case 'L':
          ls = 2;
          break;
        case 'z':
        case 'Z':
          ls = 1;
          break;
        case '.':
        case '-':
          break;
        case '*':
          if (arg_ == nullptr || len_arg != nullptr) return false;
          len_arg = arg_;
          arg_ = arg_->next;
          break;
        case 'p':
          if (!Pointer(&p)) return false;
          done = true;
          break;
        case 'd':
        case 'u':
        case 'i':
        case 'x':
        case 'X':
        case 'o':
          if (!Number(std::string(start, static_cast<size_t>(p + 1 - start)), ls, len_arg))
            return false;
          done = true;
          break;
        case 's':
          if (!String(std::string(start, static_cast<size_t>(p + 1 - start)), len_arg))
            return false;
          done = true;
          break;
        default:
          if (c >= '0' && c <= '9') break;
          {
            // libtraceevent prints an unknown conversion as ">c<".
            auto lit = std::make_unique<LiteralStep>();
            lit->text = std::string(">") + c + "<";
            steps_->push_back(std::move(lit));
            done = true;
          }
          break;
      }
    }
    if (!done) return false;  // Ran off the end inside a conversion.
    *pp = p;
    return true;
  }

  // %p and %pS/%ps/%pF/%pf; |*pp| points at the 'p' and is moved onto the
  // kind letter when there is one.
  bool Pointer(const char** pp) {
    if (arg_ == nullptr) return false;
    char k = (*pp)[1];
    auto step = std::make_unique<PointerStep>();
    step->symbols = symbols_;
    if (arg_->type == TEP_PRINT_BSTRING) return false;
    if (k == 'F' || k == 'f' || k == 'S' || k == 's') {
      step->kind = k;
      ++*pp;
    } else if (k == 'M' || k == 'm' || k == 'I' || k == 'i' || k == 'U' || k == 'h') {
      return false;
    }
    step->value = CompileNum(event_, arg_, atoms_);
    if (!step->value) return false;
    arg_ = arg_->next;
    steps_->push_back(std::move(step));
    return true;
  }

  // %d %u %i %x %X %o with length modifier |ls| ("%lu": 1), as |text|.
  bool Number(const std::string& text, int ls, tep_print_arg* len_arg) {
    if (arg_ == nullptr) return false;
    if (text.size() > 30) return false;
    if (ls < -2 || ls > 2) return false;
    if (long_size_ == 8 && ls == 1 && sizeof(long) != 8) return false;
    auto step = std::make_unique<NumberStep>();
    step->spec = ParseSpec(text);
    step->native.left = step->spec.left;
    step->native.zero = step->spec.zero;
    step->native.width = step->spec.width;
    step->native.conv = step->spec.conv;
    step->ls = ls;
    step->value = CompileNum(event_, arg_, atoms_);
    if (!step->value) return false;
    if (len_arg != nullptr) {
      step->len_arg = CompileNum(event_, len_arg, atoms_);
      if (!step->len_arg) return false;
    }
    arg_ = arg_->next;
    // The literal just before the number becomes the step's prefix.
    auto* lit = steps_->empty() ? nullptr : dynamic_cast<LiteralStep*>(steps_->back().get());
    if (lit != nullptr && step->native.SetPrefix(lit->text)) steps_->pop_back();
    steps_->push_back(std::move(step));
    return true;
  }

  // %s, as |text|.
  bool String(const std::string& text, tep_print_arg* len_arg) {
    if (arg_ == nullptr) return false;
    if (text.size() > 31) return false;
    auto step = std::make_unique<StringStep>();
    step->spec = ParseSpec(text);
    step->node = CompileStr(tep_, event_, arg_, atoms_);
    if (!step->node) return false;
    if (len_arg != nullptr) {
      step->len_arg = CompileNum(event_, len_arg, atoms_);
      if (!step->len_arg) return false;
    }
    arg_ = arg_->next;
    steps_->push_back(std::move(step));
    return true;
  }

  // parse_arg_string(): literal text from |*pp| up to the next lone '%'
  // (or the end), where it leaves |*pp|.
  bool Literal(const char** pp) {
    const char* p = *pp;
    auto lit = std::make_unique<LiteralStep>();
    for (; *p; ++p) {
      if (*p == '\\') {
        ++p;
        switch (*p) {
          case 'n':
            lit->text.push_back('\n');
            break;
          case 't':
            lit->text.push_back('\t');
            break;
          case 'r':
            lit->text.push_back('\r');
            break;
          case '\\':
            lit->text.push_back('\\');
            break;
          case '\0':
            return false;
          default:
            lit->text.push_back(*p);
            break;
        }
      } else if (*p == '%') {
        if (p[1] == '%') {
          lit->text.push_back('%');
          ++p;
        } else {
          break;
        }
      } else {
        lit->text.push_back(*p);
      }
    }
    steps_->push_back(std::move(lit));
    *pp = p;
    return true;
  }

  tep_handle* tep_;
  tep_event* event_;
  tep_print_arg* arg_;  // The next argument to consume.
  SymbolCache* symbols_;
  const AtomValues* atoms_;
  std::vector<std::unique_ptr<Step>>* steps_;
  int long_size_;
};

bool CompileFormat(tep_handle* tep, tep_event* event, const char* format, tep_print_arg* arg,
                   SymbolCache* symbols, const AtomValues* atoms,
                   std::vector<std::unique_ptr<Step>>* steps) {
  return FormatCompiler(tep, event, arg, symbols, atoms, steps).Compile(format);
}

// ---- printers ------------------------------------------------------------------

class FormatPrinter : public EventPrinter {
 public:
  std::vector<std::unique_ptr<Step>> steps;
  // plugin_kmem's call_site_handler runs first and prints "(func+0xoff) ".
  bool kmem_call_site = false;
  uint32_t call_site_offset = 0, call_site_size = 0;
  SymbolCache* symbols = nullptr;

  bool plain() const override { return plain_; }
  // After the steps are made: a kmem call site is a symbol name (the
  // guest's kallsyms), anything else as its steps are.
  void SetPlain() {
    plain_ = !kmem_call_site &&
             std::all_of(steps.begin(), steps.end(), [](const auto& s) { return s->Plain(); });
  }

  void Print(const unsigned char* data, uint32_t size, std::string* out) override {
    if (kmem_call_site) {
      uint64_t val = ReadNumber(data + call_site_offset, call_site_size);
      uint64_t addr = 0;
      const char* func = symbols->Find(val, &addr);
      if (func != nullptr) {
        out->push_back('(');
        out->append(func);
        out->append("+0x");
        NumberStep::AppendHex(out, static_cast<unsigned int>(static_cast<int>(val - addr)), false);
        out->append(") ");
      }
    }
    for (const auto& s : steps) s->Run(data, size, out);
  }

  static uint64_t ReadNumber(const unsigned char* p, uint32_t size) {
    uint64_t v = 0;
    std::memcpy(&v, p, size);  // size is 1, 2, 4 or 8 (checked at compile).
    return v;
  }

 private:
  bool plain_ = false;
};

}  // namespace

const char* SymbolCache::Find(uint64_t addr, uint64_t* start) {
  Entry& e = entries_[(addr ^ (addr >> 12)) % kEntries];
  if (!e.valid || e.addr != addr) {
    e.addr = addr;
    e.name = tep_find_function(tep_, addr);
    e.start = e.name != nullptr ? tep_find_function_address(tep_, addr) : 0;
    e.valid = true;
  }
  *start = e.start;
  return e.name;
}

bool IsKmemCallSiteEvent(std::string_view sys, std::string_view name) {
  return sys == "kmem" && (name == "kfree" || name == "kmalloc" || name == "kmalloc_node" ||
                           name == "kmem_cache_alloc" || name == "kmem_cache_alloc_node" ||
                           name == "kmem_cache_free");
}

std::unique_ptr<EventPrinter> EventPrinter::Compile(tep_handle* tep, tep_event* event,
                                                    const EventFormat& format, SymbolCache* symbols,
                                                    const AtomValues* atoms) {
  if (event == nullptr || tep == nullptr) return nullptr;
  if (event->flags & (TEP_EVENT_FL_FAILED | TEP_EVENT_FL_ISBPRINT | TEP_EVENT_FL_PRINTRAW)) {
    return nullptr;
  }
  bool kmem = false;
  if (event->handler != nullptr && !(event->flags & TEP_EVENT_FL_NOHANDLE)) {
    // Only the plugin handlers we reproduce; identified by the event they
    // are registered for (as the plugins register them).
    std::string_view sys = format.system, name = format.name;
    if (sys == "sched" && name == "sched_switch") return CompileSchedPrinter(tep, event, true);
    if (sys == "sched" && (name == "sched_wakeup" || name == "sched_wakeup_new")) {
      return CompileSchedPrinter(tep, event, false);
    }
    kmem = IsKmemCallSiteEvent(sys, name);
    if (!kmem) return nullptr;
  }
  if (event->print_fmt.format == nullptr) return nullptr;
  auto printer = std::make_unique<FormatPrinter>();
  printer->symbols = symbols;
  if (kmem) {
    tep_format_field* f = tep_find_field(event, "call_site");
    if (f == nullptr || f->offset < 0 ||
        (f->size != 1 && f->size != 2 && f->size != 4 && f->size != 8)) {
      return nullptr;
    }
    printer->kmem_call_site = true;
    printer->call_site_offset = static_cast<uint32_t>(f->offset);
    printer->call_site_size = static_cast<uint32_t>(f->size);
  }
  if (!CompileFormat(tep, event, event->print_fmt.format, event->print_fmt.args, symbols, atoms,
                     &printer->steps)) {
    return nullptr;
  }
  printer->SetPlain();
  return printer;
}

}  // namespace hvtrace
