// Numeric print arguments of compiled printers (see event_printer.h): an
// argument tree of libtraceevent's parsed print format turned into an
// expression evaluated per record the way eval_num_arg() evaluates it
// (unsigned field reads, casts as masks, out-of-record fields read as 0).
#ifndef HVTRACE_SHARED_DECODE_SRC_NUM_EXPR_H_
#define HVTRACE_SHARED_DECODE_SRC_NUM_EXPR_H_

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

struct tep_event;
struct tep_format_field;
struct tep_print_arg;

namespace hvtrace::event_printer_internal {

struct Expr {
  enum Kind { kConst, kField, kMask, kTernary, kBinary, kNull } kind = kNull;
  uint64_t value = 0;             // kConst; kMask: the mask.
  uint32_t offset = 0, size = 0;  // kField.
  char op[3] = {0, 0, 0};         // kBinary.
  std::unique_ptr<Expr> a, b, c;  // Operands; kMask: a; kTernary: a ? b : c.

  // Eval with the commonest case, a field of 4 or 8 bytes inside the record
  // (every syscall event's arguments), read here: Eval is recursive and not
  // inlined, and its call and two switches were ~40 instructions per number
  // printed (callgrind, bench/large.dat: 105 M of 2,495 M).
  uint64_t EvalInline(const unsigned char* data, uint32_t record_size) const {
    if (kind == kField && static_cast<uint64_t>(offset) + size <= record_size) {
      if (size == 8) {
        uint64_t v;
        std::memcpy(&v, data + offset, 8);
        return v;
      }
      if (size == 4) {
        uint32_t v;
        std::memcpy(&v, data + offset, 4);
        return v;
      }
    }
    return Eval(data, record_size);
  }

  uint64_t Eval(const unsigned char* data, uint32_t record_size) const {
    switch (kind) {
      case kNull:
        return 0;
      case kConst:
        return value;
      case kField: {
        // check_data_offset_size(): a field past the record reads as 0.
        if (static_cast<uint64_t>(offset) + size > record_size) return 0;
        const unsigned char* p = data + offset;
        switch (size) {
          case 1:
            return p[0];
          case 2:
            return static_cast<uint64_t>(p[0] | p[1] << 8);
          case 4: {
            uint32_t v;
            std::memcpy(&v, p, 4);
            return v;
          }
          case 8: {
            uint64_t v;
            std::memcpy(&v, p, 8);
            return v;
          }
          default:
            return 0;
        }
      }
      case kMask:
        return a->Eval(data, record_size) & value;
      case kTernary:
        return a->Eval(data, record_size) ? b->Eval(data, record_size) : c->Eval(data, record_size);
      case kBinary: {
        uint64_t l = a->Eval(data, record_size);
        uint64_t r = b->Eval(data, record_size);
        switch (op[0]) {
          case '!':
            return op[1] == 0 ? !r : l != r;
          case '~':
            return ~r;
          case '|':
            return op[1] ? (l || r) : (l | r);
          case '&':
            return op[1] ? (l && r) : (l & r);
          case '<':
            return op[1] == 0 ? l < r : op[1] == '<' ? l << (r & 63) : l <= r;
          case '>':
            return op[1] == 0 ? l > r : op[1] == '>' ? l >> (r & 63) : l >= r;
          case '=':
            return l == r;
          case '-':
            return l - r;
          case '+':
            return l + r;
          // libtraceevent would divide by zero here; a hostile record
          // must not crash us, and the value is never printed by the kernel.
          case '/':
            return r ? l / r : 0;
          case '%':
            return r ? l % r : 0;
          case '*':
            return l * r;
        }
        return 0;
      }
    }
    return 0;
  }
};

// The field a TEP_PRINT_FIELD |arg| names (null if the event has none),
// looked up once and then cached in |arg|.
tep_format_field* FindField(tep_event* event, tep_print_arg* arg);

// What eval_num_arg() makes of an atom that is not a number: the address
// of the kernel symbol of that name (test_for_symbol), 0 for none. Only the
// names whose value is certain are listed (decoder.cc, TepSymbols::AtomValue).
using AtomValues = std::unordered_map<std::string, uint64_t>;

// The expression for |arg| (a kNull one for a null |arg|), or null when it
// holds something eval_num_arg() does differently from Expr (array indexing,
// symbol names not in |atoms|, helper functions).
std::unique_ptr<Expr> CompileNum(tep_event* event, tep_print_arg* arg,
                                 const AtomValues* atoms = nullptr);

// Calls |f| with every atom under |args| (a print format's argument list)
// that eval_num_arg() would look up as a symbol: not a number, not starting
// with a digit.
void ForEachSymbolAtom(tep_print_arg* args, const std::function<void(const char*)>& f);

}  // namespace hvtrace::event_printer_internal

#endif  // HVTRACE_SHARED_DECODE_SRC_NUM_EXPR_H_
