// Numeric print arguments (see num_expr.h).
#include "num_expr.h"

#include <traceevent/event-parse.h>

#include <cctype>
#include <cstdlib>
#include <string_view>

namespace hvtrace::event_printer_internal {
namespace {

// eval_type_str() with pointer == 0, as a mask (its signed cases mask too).
uint64_t TypeMask(const char* type) {
  size_t len = std::strlen(type);
  if (len < 2 || type[len - 1] == '*' || !std::strncmp(type, "struct", 6)) return ~0ULL;
  std::string_view t(type);
  if (t == "u8" || t == "s8") return 0xff;
  if (t == "u16" || t == "s16") return 0xffff;
  if (t == "u32" || t == "s32") return 0xffffffffULL;
  if (t == "u64" || t == "s64") return ~0ULL;
  if (t.starts_with("unsigned ")) t.remove_prefix(9);
  if (t == "char") return 0xff;
  if (t == "short") return 0xffff;
  if (t == "int") return 0xffffffffULL;
  return ~0ULL;
}

}  // namespace

tep_format_field* FindField(tep_event* event, tep_print_arg* arg) {
  if (arg->field.field == nullptr) arg->field.field = tep_find_any_field(event, arg->field.name);
  return arg->field.field;
}

std::unique_ptr<Expr> CompileNum(tep_event* event, tep_print_arg* arg, const AtomValues* atoms) {
  auto e = std::make_unique<Expr>();
  if (arg == nullptr) return e;  // kNull
  switch (arg->type) {
    case TEP_PRINT_NULL:
      return e;
    case TEP_PRINT_ATOM: {
      const char* atom = arg->atom.atom;
      e->kind = Expr::kConst;
      e->value = std::strtoull(atom, nullptr, 0);
      // A zero from a non-number is a symbol name (test_for_symbol).
      if (e->value == 0 && !std::isdigit(static_cast<unsigned char>(atom[0]))) {
        if (atoms == nullptr) return nullptr;
        auto it = atoms->find(atom);
        if (it == atoms->end()) return nullptr;
        e->value = it->second;
      }
      return e;
    }
    case TEP_PRINT_FIELD: {
      tep_format_field* f = FindField(event, arg);
      if (f == nullptr || f->offset < 0 || f->size < 0) return nullptr;
      e->kind = Expr::kField;
      e->offset = static_cast<uint32_t>(f->offset);
      e->size = static_cast<uint32_t>(f->size);
      return e;
    }
    case TEP_PRINT_TYPE: {
      e->kind = Expr::kMask;
      e->value = TypeMask(arg->typecast.type);
      e->a = CompileNum(event, arg->typecast.item, atoms);
      if (!e->a) return nullptr;
      // A cast that masks nothing ("(unsigned long)(REC->fd)", as every
      // syscall event has) is its operand: one Eval less per argument.
      if (e->value == ~0ULL) return std::move(e->a);
      return e;
    }
    case TEP_PRINT_OP: {
      const char* op = arg->op.op;
      if (!std::strcmp(op, "[")) return nullptr;
      if (!std::strcmp(op, "?")) {
        tep_print_arg* colon = arg->op.right;
        if (colon == nullptr || colon->type != TEP_PRINT_OP) return nullptr;
        e->kind = Expr::kTernary;
        e->a = CompileNum(event, arg->op.left, atoms);
        e->b = CompileNum(event, colon->op.left, atoms);
        e->c = CompileNum(event, colon->op.right, atoms);
        return e->a && e->b && e->c ? std::move(e) : nullptr;
      }
      static const char* const kOps[] = {"!", "!=", "~",  "|",  "||", "&", "&&", "<", "<<", "<=",
                                         ">", ">>", ">=", "==", "-",  "+", "/",  "%", "*"};
      bool known = false;
      for (const char* k : kOps) known = known || !std::strcmp(op, k);
      if (!known) return nullptr;
      e->kind = Expr::kBinary;
      std::memcpy(e->op, op, std::strlen(op));
      e->a = CompileNum(event, arg->op.left, atoms);
      e->b = CompileNum(event, arg->op.right, atoms);
      return e->a && e->b ? std::move(e) : nullptr;
    }
    default:
      return nullptr;
  }
}

namespace {

void WalkNode(tep_print_arg* arg, int depth, const std::function<void(const char*)>& f);

void WalkList(tep_print_arg* arg, int depth, const std::function<void(const char*)>& f) {
  for (; arg != nullptr; arg = arg->next) WalkNode(arg, depth, f);
}

void WalkNode(tep_print_arg* arg, int depth, const std::function<void(const char*)>& f) {
  // libtraceevent's parser and printer recurse as deep as the format nests;
  // this walk stops well before anything it could not handle.
  if (arg == nullptr || depth > 1000) return;
  ++depth;
  switch (arg->type) {
    case TEP_PRINT_ATOM:
      if (arg->atom.atom != nullptr && std::strtoull(arg->atom.atom, nullptr, 0) == 0 &&
          !std::isdigit(static_cast<unsigned char>(arg->atom.atom[0]))) {
        f(arg->atom.atom);
      }
      return;
    case TEP_PRINT_FLAGS:
      return WalkNode(arg->flags.field, depth, f);
    case TEP_PRINT_SYMBOL:
      return WalkNode(arg->symbol.field, depth, f);
    case TEP_PRINT_HEX:
    case TEP_PRINT_HEX_STR:
      WalkNode(arg->hex.field, depth, f);
      return WalkNode(arg->hex.size, depth, f);
    case TEP_PRINT_INT_ARRAY:
      WalkNode(arg->int_array.field, depth, f);
      WalkNode(arg->int_array.count, depth, f);
      return WalkNode(arg->int_array.el_size, depth, f);
    case TEP_PRINT_TYPE:
      return WalkNode(arg->typecast.item, depth, f);
    case TEP_PRINT_DYNAMIC_ARRAY:
    case TEP_PRINT_DYNAMIC_ARRAY_LEN:
      return WalkNode(arg->dynarray.index, depth, f);
    case TEP_PRINT_OP:
      WalkNode(arg->op.left, depth, f);
      return WalkNode(arg->op.right, depth, f);
    case TEP_PRINT_FUNC:
      return WalkList(arg->func.args, depth, f);
    default:
      return;
  }
}

}  // namespace

void ForEachSymbolAtom(tep_print_arg* args, const std::function<void(const char*)>& f) {
  WalkList(args, 0, f);
}

}  // namespace hvtrace::event_printer_internal
