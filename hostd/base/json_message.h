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
#ifndef HVTRACE_HOSTD_JSON_MESSAGE_H_
#define HVTRACE_HOSTD_JSON_MESSAGE_H_

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
class JsonFieldReader {
 public:
  JsonFieldReader(std::string_view command, const nlohmann::json& args);

  void Field(const char* key, std::string& out, uint64_t = 0, uint64_t = 0);
  void Field(const char* key, bool& out, uint64_t = 0, uint64_t = 0);
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
  template <class T>
  void Required(const char* key, T& out) {
    if (!Present(key)) return Fail("args." + std::string(key) + " is required");
    Field(key, out);
  }
  void List(const char* key, std::vector<std::string>& out, size_t max);

  // The first error, or the first key of |args| no field named.
  Status Finish() const;

 private:
  // Marks |key| known; true when |args| holds a non-null value for it.
  bool Present(const char* key);
  const nlohmann::json* Find(const char* key) const;
  void Fail(const std::string& what);

  std::string command_;
  const nlohmann::json& args_;
  std::set<std::string, std::less<>> known_;
  std::optional<Error> error_;
};

template <class M>
nlohmann::json MessageToJson(const M& message) {
  const M default_message{};
  JsonFieldWriter defaults;
  M::Fields(default_message, defaults);
  JsonFieldWriter writer;
  M::Fields(message, writer);
  return writer.TakeChanged(defaults.Take());
}

template <class M>
Result<M> ParseMessage(const nlohmann::json& args) {
  M message{};
  JsonFieldReader reader(M::kCommand, args);
  M::Fields(message, reader);
  if (Status s = reader.Finish(); !s.ok()) return s.error();
  if constexpr (requires { message.Check(); }) {
    if (Status s = message.Check(); !s.ok()) return s.error();
  }
  return message;
}

// nlohmann's spelling for writing (`nlohmann::json j = request;`). Reading
// goes through ParseMessage: it answers with an error, never an exception.
template <class M>
requires requires(const M& m, JsonFieldWriter& w) { M::Fields(m, w); }
void to_json(nlohmann::json& j, const M& message) { j = MessageToJson(message); }

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_JSON_MESSAGE_H_
