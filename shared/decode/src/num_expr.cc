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

std::unique_ptr<Expr> CompileNum(tep_event* event, tep_print_arg* arg) {
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
      if (e->value == 0 && !std::isdigit(static_cast<unsigned char>(atom[0]))) return nullptr;
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
      e->a = CompileNum(event, arg->typecast.item);
      return e->a ? std::move(e) : nullptr;
    }
    case TEP_PRINT_OP: {
      const char* op = arg->op.op;
      if (!std::strcmp(op, "[")) return nullptr;
      if (!std::strcmp(op, "?")) {
        tep_print_arg* colon = arg->op.right;
        if (colon == nullptr || colon->type != TEP_PRINT_OP) return nullptr;
        e->kind = Expr::kTernary;
        e->a = CompileNum(event, arg->op.left);
        e->b = CompileNum(event, colon->op.left);
        e->c = CompileNum(event, colon->op.right);
        return e->a && e->b && e->c ? std::move(e) : nullptr;
      }
      static const char* const kOps[] = {"!", "!=", "~",  "|",  "||", "&", "&&", "<", "<<", "<=",
                                         ">", ">>", ">=", "==", "-",  "+", "/",  "%", "*"};
      bool known = false;
      for (const char* k : kOps) known = known || !std::strcmp(op, k);
      if (!known) return nullptr;
      e->kind = Expr::kBinary;
      std::memcpy(e->op, op, std::strlen(op));
      e->a = CompileNum(event, arg->op.left);
      e->b = CompileNum(event, arg->op.right);
      return e->a && e->b ? std::move(e) : nullptr;
    }
    default:
      return nullptr;
  }
}

}  // namespace hvtrace::event_printer_internal
