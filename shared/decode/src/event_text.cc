// JSON helpers of event_text.h.
#include "event_text.h"

#include <cstring>

namespace hvtrace {

uint64_t ReadUnsignedBytes(const unsigned char* p, uint32_t size, bool little_endian) {
  uint64_t v = 0;
  for (uint32_t i = 0; i < size; ++i) {
    uint32_t byte = little_endian ? size - 1 - i : i;
    v = v << 8 | p[byte];
  }
  return v;
}

namespace {

void AppendScalar(std::string* out, const unsigned char* p, uint32_t size, bool is_signed,
                  bool little_endian) {
  if (size == 0 || size > 8) {
    out->append("null");
    return;
  }
  uint64_t v = ReadUnsigned(p, size, little_endian);
  if (is_signed) {
    int shift = 64 - static_cast<int>(size) * 8;
    AppendInt(out, static_cast<int64_t>(v << shift) >> shift);
  } else {
    AppendInt(out, v);
  }
}

bool IsCharType(const std::string& type) {
  // "char[16]", "__data_loc char[]", "const char[]", "unsigned char[8]" is
  // bytes, not text.
  return (type.starts_with("char[") || type.find(" char[") != std::string::npos) &&
         type.find("unsigned") == std::string::npos;
}

// Element size of an array field from its declared type.
uint32_t ElementSize(const FieldFormat& f) {
  // A flexible array (size 0) declared with a count, "int a[3]; size:0",
  // would give 0-byte elements: its element size comes from the type.
  if (f.kind == FieldKind::kArray && f.array_length > 0 && f.size >= f.array_length &&
      f.size % f.array_length == 0) {
    return f.size / f.array_length;
  }
  const std::string& t = f.type;
  if (t.find("char") != std::string::npos || t.find("u8") != std::string::npos ||
      t.find("s8") != std::string::npos) {
    return 1;
  }
  if (t.find("short") != std::string::npos || t.find("16") != std::string::npos) return 2;
  if (t.find("long") != std::string::npos || t.find("64") != std::string::npos ||
      t.find('*') != std::string::npos) {
    return 8;
  }
  return 4;
}

void AppendArray(std::string* out, const FieldFormat& f, const unsigned char* p, uint32_t len,
                 bool little_endian) {
  if (IsCharType(f.type)) {
    size_t n = strnlen(reinterpret_cast<const char*>(p), len);
    AppendJsonString(out, std::string_view(reinterpret_cast<const char*>(p), n));
    return;
  }
  uint32_t elem = ElementSize(f);
  out->push_back('[');
  for (uint32_t i = 0; i + elem <= len; i += elem) {
    if (i != 0) out->push_back(',');
    AppendScalar(out, p + i, elem, f.is_signed, little_endian);
  }
  out->push_back(']');
}

}  // namespace

void AppendJsonString(std::string* out, std::string_view s) {
  static const char kHex[] = "0123456789abcdef";
  out->push_back('"');
  // Runs of bytes that need no escape are appended whole. A push_back per
  // byte was 23 % of `hvtrace report --format json` on bench/large.dat
  // (perf) in a build where GCC stopped inlining it (the unity batch grew).
  size_t run = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') continue;
    out->append(s.data() + run, i - run);
    run = i + 1;
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\r':
        out->append("\\r");
        break;
      default: {
        const char escaped[] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 15]};
        out->append(escaped, sizeof escaped);
      }
    }
  }
  out->append(s.data() + run, s.size() - run);
  out->push_back('"');
}

void AppendJsonFieldValue(std::string* out, const FieldFormat& field, const unsigned char* data,
                          uint32_t size, bool little_endian) {
  // Fields that lie (partly) outside the record read as null rather than
  // as the scratch area's zero padding.
  if (static_cast<uint64_t>(field.offset) + field.size > size) {
    out->append("null");
    return;
  }
  const unsigned char* p = data + field.offset;
  switch (field.kind) {
    case FieldKind::kScalar:
      AppendScalar(out, p, field.size, field.is_signed, little_endian);
      return;
    case FieldKind::kArray:
      // A size-0 array is the record's flexible tail (`char buf[]` of
      // ftrace:print): it runs to the end of the record, as libtraceevent
      // reads it.
      AppendArray(out, field, p, field.size != 0 ? field.size : size - field.offset, little_endian);
      return;
    case FieldKind::kDataLoc:
    case FieldKind::kRelLoc: {
      uint64_t loc = ReadUnsigned(p, field.size, little_endian);
      uint64_t offset = loc & 0xffff;  // ParseFieldLine allows only size 4.
      uint64_t len = loc >> 16;
      if (field.kind == FieldKind::kRelLoc) offset += field.offset + field.size;
      if (offset > size || len > size - offset) {
        out->append("null");
        return;
      }
      AppendArray(out, field, data + offset, static_cast<uint32_t>(len), little_endian);
      return;
    }
  }
  out->append("null");
}

}  // namespace hvtrace
