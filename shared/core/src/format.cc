// Parser for tracefs format files (see hvtrace/format.h for the grammar).
//
// Written by hand rather than through libtraceevent so that hostile text is
// rejected by small, fuzzed code with explicit limits before anything else
// (libtraceevent's own parser included) looks at it.
#include "hvtrace/format.h"

#include <charconv>
#include <cstring>
#include <unordered_set>
#include <utility>

#include "print_format.h"

namespace hvtrace {
namespace {

using format_internal::CheckPrintFormat;
using format_internal::FindPrintHazards;
using format_internal::IsIdentChar;
using format_internal::IsIdentifier;
using format_internal::Trim;

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
  if (strict_scalars && field->kind == FieldKind::kScalar && field->size > 8 && field->size != 16) {
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

Error MakeError(std::string_view system, std::string_view name, int line, const std::string& what) {
  std::string where =
      std::string(system.empty() ? "?" : system) + "/" + std::string(name.empty() ? "?" : name);
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
  // A REC->name that is no field of the event: libtraceevent 1.7's parser
  // dereferences a NULL field on it (found by format_fuzzer), so such a
  // print fmt never reaches it and the events print their fields raw. The
  // kernel writes such formats: 7.3's vmscan events print REC->ent.pid
  // (the common header as a struct), and refusing the format lost their
  // records, the reclaim before an OOM panic among them.
  std::string unknown_ref;
  for (size_t pos = ev.print_fmt.find("REC->"); pos != std::string::npos && unknown_ref.empty();
       pos = ev.print_fmt.find("REC->", pos + 1)) {
    size_t start = pos + 5, end = start;
    while (end < ev.print_fmt.size() && IsIdentChar(ev.print_fmt[end])) ++end;
    std::string_view ref(ev.print_fmt.data() + start, end - start);
    if (!seen.contains(ref)) unknown_ref = ref.substr(0, 64);
  }
  if (!ev.print_fmt.empty()) {
    std::string bad = CheckPrintFormat(ev.print_fmt);
    if (!bad.empty()) return MakeError(system, ev.name, 0, "print fmt: " + bad);
    if (unknown_ref.empty()) {
      FindPrintHazards(&ev);
    } else {
      ev.unchecked_print = "print fmt refers to '" + unknown_ref + "', which is no field";
    }
  }
  if (!have_name) return MakeError(system, "", lines.line_no(), "missing 'name:'");
  if (!have_id) return MakeError(system, ev.name, lines.line_no(), "missing 'ID:'");
  if (!in_fields) return MakeError(system, ev.name, lines.line_no(), "missing 'format:'");
  return ev;
}

std::optional<uint32_t> ScanEventFormatId(std::string_view text) {
  // The same lines as ParseEventFormat's loop until "format:": it reads the
  // first "ID:" line there the same way, and fails on a second one.
  LineReader lines(text);
  std::string_view line;
  while (lines.Next(&line)) {
    std::string_view t = Trim(line);
    if (t.starts_with("ID:")) {
      uint32_t id = 0;
      if (!ParseU32(t.substr(3), 0xffff, &id)) return std::nullopt;
      return id;
    }
    if (t == "format:" || t.starts_with("print fmt:")) return std::nullopt;
  }
  return std::nullopt;
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
      return Error{"header_event line " + std::to_string(lines.line_no()) +
                   ": expected 'key : value'"};
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
