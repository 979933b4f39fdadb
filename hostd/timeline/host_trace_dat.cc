#include "host_trace_dat.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "hvtrace/page.h"

namespace hvtrace::hostd {

const char kHostHeaderPage[] =
    "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n"
    "\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n"
    "\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n"
    "\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;\n";
const char kHostHeaderEvent[] =
    "# compressed entry header\n"
    "\ttype_len    :    5 bits\n"
    "\ttime_delta  :   27 bits\n"
    "\tarray       :   32 bits\n"
    "\n"
    "\tpadding     : type == 29\n"
    "\ttime_extend : type == 30\n"
    "\ttime_stamp : type == 31\n"
    "\tdata max type_len  == 28\n";

namespace {

constexpr uint32_t kPageSize = 4096;
constexpr uint32_t kCommonSize = 8;
constexpr size_t kMaxRecord = 3000;

enum class Kind : uint8_t { kUnset, kDecimal, kHex, kText };

struct Field {
  std::string key;   // As QEMU printed it ("" for non key/value text).
  std::string name;  // As a C identifier in the format.
  Kind kind = Kind::kUnset;
  uint32_t offset = 0;
};

struct Schema {
  uint16_t id = 0;
  std::string name;
  std::vector<Field> fields;
  uint32_t size = kCommonSize;  // Fixed part of a record.
};

std::optional<uint64_t> Number(std::string_view v, Kind kind) {
  uint64_t out = 0;
  int base = 10;
  if (kind == Kind::kHex) {
    if (!v.starts_with("0x")) return std::nullopt;
    v.remove_prefix(2);
    base = 16;
  }
  if (v.empty()) return std::nullopt;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out, base);
  if (ec != std::errc() || end != v.data() + v.size()) return std::nullopt;
  return out;
}

Kind KindOf(std::string_view v) {
  if (v.starts_with("0x") && Number(v, Kind::kHex)) return Kind::kHex;
  if (Number(v, Kind::kDecimal)) return Kind::kDecimal;
  return Kind::kText;
}

std::string Identifier(std::string_view key, const std::set<std::string>& taken) {
  std::string id;
  for (char c : key.substr(0, 64)) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    id += ok ? c : '_';
  }
  if (id.empty()) id = "args";
  if ((id[0] >= '0' && id[0] <= '9') || id.starts_with("common_")) id = "arg_" + id;
  std::string unique = id;
  for (int n = 2; taken.contains(unique); ++n) unique = id + "_" + std::to_string(n);
  return unique;
}

// One schema per event name: the union of its keys, each key's kind the one
// all its values share (else text).
std::map<std::string, Schema> Schemas(const QemuTraceLog& log) {
  std::map<std::string, Schema> schemas;
  for (const QemuTraceEvent& e : log.events) {
    auto it = schemas.find(e.name);
    if (it == schemas.end()) {
      if (schemas.size() >= kMaxHostEventNames) continue;
      it = schemas.emplace(e.name, Schema{}).first;
      // The parser's names are [A-Za-z0-9_]+; a C identifier does not start with a digit.
      const bool digit = !e.name.empty() && e.name[0] >= '0' && e.name[0] <= '9';
      it->second.name = (digit ? "e_" : "") + e.name;
    }
    Schema& s = it->second;
    for (const auto& arg : e.args) {
      // Not a structured binding: clang (the sanitizer build) refuses to
      // capture one in the lambda.
      const std::string& key = arg.first;
      const std::string& value = arg.second;
      auto f = std::find_if(s.fields.begin(), s.fields.end(),
                            [&](const Field& x) { return x.key == key; });
      if (f == s.fields.end()) {
        if (s.fields.size() >= kMaxHostFields) continue;
        std::set<std::string> taken;
        for (const Field& x : s.fields) taken.insert(x.name);
        s.fields.push_back({key, Identifier(key, taken), Kind::kUnset, 0});
        f = s.fields.end() - 1;
      }
      const Kind k = KindOf(value);
      f->kind = f->kind == Kind::kUnset || f->kind == k ? k : Kind::kText;
    }
  }
  uint16_t id = 1;
  for (auto& [name, s] : schemas) {
    s.id = id++;
    uint32_t at = kCommonSize;
    for (Field& f : s.fields) {
      if (f.kind == Kind::kUnset) f.kind = Kind::kText;
      if (f.kind != Kind::kText) f.offset = at, at += 8;
    }
    for (Field& f : s.fields) {
      if (f.kind == Kind::kText) f.offset = at, at += 4;
    }
    s.size = at;
  }
  return schemas;
}

std::string FormatText(const Schema& s) {
  std::string t = "name: " + s.name + "\nID: " + std::to_string(s.id) + "\nformat:\n";
  t += "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n";
  t += "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n";
  t += "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n";
  t += "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n";
  std::string fmt, args;
  for (const Field& f : s.fields) {
    const bool text = f.kind == Kind::kText;
    t += std::string("\tfield:") + (text ? "__data_loc char[] " : "u64 ") + f.name +
         ";\toffset:" + std::to_string(f.offset) + ";\tsize:" + (text ? "4" : "8") +
         ";\tsigned:0;\n";
    if (!fmt.empty()) fmt += ' ';
    fmt += f.key.empty() ? "" : f.name + "=";
    fmt += text ? "%s" : f.kind == Kind::kHex ? "0x%llx" : "%llu";
    args += text ? ", __get_str(" + f.name + ")" : ", REC->" + f.name;
  }
  t += "\nprint fmt: \"" + fmt + "\"" + args + "\n";
  return t;
}

void Put(std::vector<std::byte>& rec, uint32_t at, const void* v, size_t n) {
  std::memcpy(rec.data() + at, v, n);
}

// One record: the common header (pid = QEMU's thread id), the numbers, the
// text references, then the text.
std::vector<std::byte> Record(const Schema& s, const QemuTraceEvent& e) {
  std::vector<std::byte> rec(s.size, std::byte{0});
  Put(rec, 0, &s.id, 2);
  const int32_t pid = static_cast<int32_t>(std::min<uint32_t>(e.tid, INT32_MAX));
  Put(rec, 4, &pid, 4);
  for (const Field& f : s.fields) {
    std::string_view value;
    for (const auto& [key, v] : e.args) {
      if (key == f.key) value = v;
    }
    if (f.kind != Kind::kText) {
      const uint64_t n = Number(value, f.kind).value_or(0);
      Put(rec, f.offset, &n, 8);
      continue;
    }
    // A record must fit one page whatever QEMU printed.
    const size_t room = rec.size() < kMaxRecord ? kMaxRecord - rec.size() : 0;
    const std::string_view kept = value.substr(0, std::min(kMaxHostText, room));
    const uint32_t loc = static_cast<uint32_t>((kept.size() + 1) << 16 | rec.size());
    Put(rec, f.offset, &loc, 4);
    for (char c : kept) rec.push_back(static_cast<std::byte>(c));
    rec.push_back(std::byte{0});
  }
  return rec;
}

}  // namespace

HostTraceDat BuildHostTraceDat(const QemuTraceLog& log) {
  HostTraceDat out;
  const std::map<std::string, Schema> schemas = Schemas(log);
  TraceDatWriterInput& in = out.input;
  in.page_size = kPageSize;
  in.header_page = kHostHeaderPage;
  in.header_event = kHostHeaderEvent;
  in.trace_clock = kHostTraceClock;
  for (const auto& [name, s] : schemas) in.formats.push_back({kHostSystem, FormatText(s)});
  std::vector<size_t> order(log.events.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return log.events[a].realtime_ns < log.events[b].realtime_ns;
  });
  const PageLayout layout = PageLayout::Default(kPageSize);
  std::set<uint32_t> tids;
  std::optional<PageWriter> writer;
  in.cpus.emplace_back();
  for (size_t i : order) {
    const QemuTraceEvent& e = log.events[i];
    auto s = schemas.find(e.name);
    if (s == schemas.end()) {
      ++out.dropped;
      continue;
    }
    const std::vector<std::byte> rec = Record(s->second, e);
    if (!writer || !writer->Append(e.realtime_ns, rec)) {
      if (writer) writer->Finish();
      writer.emplace(out.pages.emplace_back(kPageSize, std::byte{0}), layout, e.realtime_ns);
      in.cpus[0].push_back(out.pages.back());
      if (!writer->Append(e.realtime_ns, rec)) {
        ++out.dropped;
        continue;
      }
    }
    if (out.events++ == 0) out.first_ns = e.realtime_ns;
    out.last_ns = e.realtime_ns;
    tids.insert(e.tid);
  }
  if (writer) writer->Finish();
  for (uint32_t tid : tids) in.cmdlines += std::to_string(tid) + " qemu\n";
  return out;
}

}  // namespace hvtrace::hostd
