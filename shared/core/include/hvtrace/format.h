// Typed descriptions of tracefs event formats.
//
// The kernel describes every event in events/<system>/<event>/format:
//
//   name: sched_switch
//   ID: 372
//   format:
//   	field:unsigned short common_type;	offset:0;	size:2;	signed:0;
//   	...                                   (blank line after the common fields)
//   	field:char prev_comm[16];	offset:8;	size:16;	signed:0;
//   	field:__data_loc char[] name;	offset:24;	size:4;	signed:0;
//
//   print fmt: "prev_comm=%s ...", REC->prev_comm, ...
//
// events/header_page uses the same field lines; events/header_event is a short
// list of "key : value" lines. Format text can come from a guest or a file, so
// the parsers treat it as hostile: sizes are capped, every number is range
// checked and a malformed line fails the whole format with its line number.
#ifndef HVTRACE_FORMAT_H_
#define HVTRACE_FORMAT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/result.h"

namespace hvtrace {

// Limits applied to untrusted format text.
inline constexpr size_t kMaxFormatTextSize = 1 << 20;  // kmem's print fmts reach ~8 KiB.
inline constexpr size_t kMaxFields = 512;
inline constexpr size_t kMaxNameSize = 256;        // System, event and field names.
inline constexpr uint32_t kMaxFieldEnd = 1 << 20;  // offset + size.
// The largest length argument (EventFormat::length_fields) a record may carry
// into libtraceevent's printer: a __data_loc array's own limit.
inline constexpr uint64_t kMaxPrintLength = 1 << 16;

enum class FieldKind : uint8_t {
  kScalar,   // int, unsigned long, pid_t, pointers ...
  kArray,    // char comm[16], u32 buf[] (array_length 0 when open-ended)
  kDataLoc,  // __data_loc T[] name: u32 (len << 16 | offset from record start)
  kRelLoc,   // __rel_loc T[] name: u32 (len << 16 | offset after the field)
};

struct FieldFormat {
  std::string name;  // "prev_comm"
  // The declaration without the name, whitespace collapsed: "char[16]",
  // "unsigned long", "const char *", "__data_loc char[]".
  std::string type;
  uint32_t offset = 0;
  uint32_t size = 0;
  bool is_signed = false;
  FieldKind kind = FieldKind::kScalar;
  uint32_t array_length = 0;  // kArray: declared element count (0 for "[]").
  bool is_common = false;     // Listed before the blank line (common_*).
};

struct EventFormat {
  std::string system;
  std::string name;
  uint32_t id = 0;
  std::vector<FieldFormat> fields;  // In file order: common fields first.
  std::string print_fmt;            // Everything after "print fmt: ".

  // What libtraceevent's printer takes on trust. It divides without a zero
  // check (SIGFPE: at parse time for a constant divisor that folds to 0, at
  // print time for a field holding 0), and it reads as many bytes as a length
  // argument says (__print_hex, __print_hex_str, __print_array, a '*' width
  // or precision). ParseEventFormat sorts every divisor and length argument
  // of print_fmt: constants it can bound are safe; a plain REC->field is
  // listed below and checked per record by the decoder (a record whose
  // divisor is 0 or whose length passes kMaxPrintLength prints raw);
  // anything else sets unchecked_print to the reason, and the print fmt
  // never reaches libtraceevent.
  std::vector<std::string> divisor_fields;
  std::vector<std::string> length_fields;
  std::string unchecked_print;

  // Returns the field called |field_name| or nullptr.
  const FieldFormat* FindField(std::string_view field_name) const;
};

// Parses one event's format text. |system| is the directory the format came
// from (trace.dat stores it beside the text). Errors name the system, event
// and line.
Result<EventFormat> ParseEventFormat(std::string_view system, std::string_view text);

// The id ParseEventFormat(system, |text|) returns when it succeeds, read
// without parsing the rest: the first "ID:" line among those before
// "format:" (where the kernel writes it). nullopt when no such line is
// there or its number is bad: then only ParseEventFormat can tell. A
// decoder uses it to parse only the formats of the events a trace holds
// (a kernel has ~1,800; a trace uses a few dozen).
std::optional<uint32_t> ScanEventFormatId(std::string_view text);

// Parses events/header_page into its fields (timestamp, commit, overwrite,
// data). The page codec's PageLayout::FromHeaderPage reads the same file for
// the walker; this is the typed view for tools and checks.
Result<std::vector<FieldFormat>> ParseHeaderPage(std::string_view text);

// events/header_event: the bit widths of the record header and the type_len
// values of the special records.
struct HeaderEventFormat {
  uint32_t type_len_bits = 5;
  uint32_t time_delta_bits = 27;
  uint32_t array_bits = 32;
  uint32_t padding_type = 29;
  uint32_t time_extend_type = 30;
  uint32_t time_stamp_type = 31;
  uint32_t data_max_type_len = 28;
};
Result<HeaderEventFormat> ParseHeaderEvent(std::string_view text);

}  // namespace hvtrace

#endif  // HVTRACE_FORMAT_H_
