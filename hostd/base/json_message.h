// One JSON mapping per control message (control/requests.h,
// qemu/boot_request.h), used in both directions. A message lists its fields
// once, in a static template that reads and writes alike:
//
//   struct DetachRequest {
//     static constexpr const char* kCommand = "detach";
//     std::string name;
//     uint64_t timeout_ms = 10000;  // The default: here and nowhere else.
//     template <class Self, class Map>
//     static void Fields(Self& r, Map& m) {
//       m.Required("name", r.name);
//       m.Field("timeout_ms", r.timeout_ms, 1, 600000);
//     }
//   };
//
// MessageToJson writes the required fields and those that differ from the
// defaults (an unset std::optional is left out), so a request carries what
// its sender chose and the receiver's struct supplies the rest; ParseMessage
// reads strictly: args must be an object, a key the message does
// not list is refused, a value of the wrong type is refused, and the error
// names the command and the key ("detach: args.timeout_ms must be a
// non-negative integer"). An absent or null key keeps the member's default.
// A message may add `Status Check() const` for what one field cannot say
// (a VM name's characters, an enum's spellings); ParseMessage calls it last.
//
// Replies (control/replies.h) use the same mapping. They set
// `static constexpr bool kWritesDefaults = true` (ReplyMessage): a reply
// states every field, so `--json` shows a count of 0 rather than leaving it
// out; an unset std::optional is still left out (absent: there is none). A field may be
// another message (read as an object, its errors naming the path:
// "reply.region.size"), a std::vector of messages, a double, or a
// nlohmann::json passed through as it is (a document with a mapping of its
// own, such as a capture's manifest summary).
#ifndef HVTRACE_HOSTD_JSON_MESSAGE_H_
#define HVTRACE_HOSTD_JSON_MESSAGE_H_

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

// Writes a message's fields into a JSON object.
class JsonFieldWriter {
 public:
  template <class T>
  void Field(const char* key, const T& value, uint64_t = 0, uint64_t = 0) {
    out_[key] = value;
  }
  template <class T>
  void Field(const char* key, const std::optional<T>& value, uint64_t = 0, uint64_t = 0) {
    if (value) out_[key] = *value;
  }
  template <class T>
  void Required(const char* key, const T& value) {
    out_[key] = value;
    required_.insert(key);
  }
  // A list of strings of at most |max| entries.
  void List(const char* key, const std::vector<std::string>& value, size_t) { out_[key] = value; }
  void List(const char* key, const std::vector<std::string>& value) { out_[key] = value; }

  // What was written, less the keys whose value is the one in |defaults|
  // (the same message type's fields as written for a default-built one).
  nlohmann::json TakeChanged(const nlohmann::json& defaults);
  nlohmann::json Take() { return std::move(out_); }

 private:
  nlohmann::json out_ = nlohmann::json::object();
  std::set<std::string, std::less<>> required_;
};

// Reads a message's fields out of a JSON object, strictly; the first error
// is kept and the rest of the fields are skipped.
// A reply's base: every field written.
struct ReplyMessage {
  static constexpr bool kWritesDefaults = true;
};

template <class M>
concept JsonMessage = requires(M& m, JsonFieldWriter& w) {
  M::Fields(m, w);
};

class JsonFieldReader {
 public:
  // |where| names the object in errors: "args" for a request, "reply" for a
  // reply, "reply.region" for a message inside one.
  JsonFieldReader(std::string_view command, const nlohmann::json& args, std::string where = "args");

  void Field(const char* key, std::string& out, uint64_t = 0, uint64_t = 0);
  void Field(const char* key, bool& out, uint64_t = 0, uint64_t = 0);
  void Field(const char* key, double& out, uint64_t = 0, uint64_t = 0);
  // Any value but null, as it is.
  void Field(const char* key, nlohmann::json& out, uint64_t = 0, uint64_t = 0);
  // Unsigned integers within [|lo|, |hi|] (both 0: any).
  void Field(const char* key, uint64_t& out, uint64_t lo = 0, uint64_t hi = 0);
  void Field(const char* key, uint32_t& out, uint64_t lo = 0, uint64_t hi = 0);
  void Field(const char* key, int& out, uint64_t lo = 0, uint64_t hi = 0);
  template <class T>
  void Field(const char* key, std::optional<T>& out, uint64_t lo = 0, uint64_t hi = 0) {
    if (!Present(key)) return;
    T value{};
    Field(key, value, lo, hi);
    out = std::move(value);
  }
  template <JsonMessage M>
  void Field(const char* key, M& out, uint64_t = 0, uint64_t = 0) {
    if (!Present(key)) return;
    ReadNested(*Find(key), Path(key), out);
  }
  template <JsonMessage M>
  void Field(const char* key, std::vector<M>& out, uint64_t = 0, uint64_t = 0) {
    if (!Present(key)) return;
    const nlohmann::json& v = *Find(key);
    if (!v.is_array()) return Fail(Path(key) + " must be a list");
    std::vector<M> list(v.size());
    for (size_t i = 0; i < v.size() && !error_; ++i) {
      ReadNested(v[i], Path(key) + "[" + std::to_string(i) + "]", list[i]);
    }
    if (!error_) out = std::move(list);
  }
  template <class T>
  void Required(const char* key, T& out) {
    if (!Present(key)) return Fail(Path(key) + " is required");
    Field(key, out);
  }
  void List(const char* key, std::vector<std::string>& out, size_t max);
  void List(const char* key, std::vector<std::string>& out) { List(key, out, SIZE_MAX); }

  // The first error, or the first key of |args| no field named.
  Status Finish() const;

 private:
  // Marks |key| known; true when |args| holds a non-null value for it.
  bool Present(const char* key);
  std::string Path(const char* key) const { return where_ + "." + key; }
  template <JsonMessage M>
  void ReadNested(const nlohmann::json& value, std::string where, M& out) {
    JsonFieldReader nested(command_, value, std::move(where));
    M::Fields(out, nested);
    if (Status s = nested.Finish(); !s.ok()) error_ = s.error();
  }
  const nlohmann::json* Find(const char* key) const;
  void Fail(const std::string& what);

  std::string command_;
  const nlohmann::json& args_;
  std::string where_;
  std::set<std::string, std::less<>> known_;
  std::optional<Error> error_;
};

template <class M>
nlohmann::json MessageToJson(const M& message) {
  if constexpr (requires { M::kWritesDefaults; }) {
    JsonFieldWriter writer;
    M::Fields(message, writer);
    return writer.Take();
  } else {
    JsonFieldWriter writer;
    M::Fields(message, writer);
    const M default_message{};
    JsonFieldWriter defaults;
    M::Fields(default_message, defaults);
    return writer.TakeChanged(defaults.Take());
  }
}

// |where| is "args" for a request, "reply" for a reply; errors name it and
// |command| ("ping: reply.uptime_ms must be …").
template <class M>
Result<M> ParseMessage(const nlohmann::json& args, std::string where, std::string_view command) {
  M message{};
  JsonFieldReader reader(command, args, std::move(where));
  M::Fields(message, reader);
  if (Status s = reader.Finish(); !s.ok()) return s.error();
  if constexpr (requires { message.Check(); }) {
    if (Status s = message.Check(); !s.ok()) return s.error();
  }
  return message;
}
template <class M>
Result<M> ParseMessage(const nlohmann::json& args, std::string where = "args") {
  return ParseMessage<M>(args, std::move(where), M::kCommand);
}

// nlohmann's spelling for writing (`nlohmann::json j = request;`). Reading
// goes through ParseMessage: it answers with an error, never an exception.
template <class M>
requires requires(const M& m, JsonFieldWriter& w) { M::Fields(m, w); }
void to_json(nlohmann::json& j, const M& message) { j = MessageToJson(message); }

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_JSON_MESSAGE_H_
