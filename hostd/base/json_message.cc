#include "json_message.h"

#include <limits>

namespace hvtrace::hostd {

using nlohmann::json;

json JsonFieldWriter::TakeChanged(const json& defaults) {
  json out = json::object();
  for (auto& [key, value] : out_.items()) {
    auto it = defaults.find(key);
    if (required_.contains(key) || it == defaults.end() || *it != value) out[key] = value;
  }
  out_ = json::object();
  return out;
}

JsonFieldReader::JsonFieldReader(std::string_view command, const json& args, std::string where)
    : command_(command), args_(args), where_(std::move(where)) {
  if (!args_.is_object()) Fail(where_ + " must be an object");
}

const json* JsonFieldReader::Find(const char* key) const {
  if (!args_.is_object()) return nullptr;
  auto it = args_.find(key);
  return it == args_.end() || it->is_null() ? nullptr : &*it;
}

bool JsonFieldReader::Present(const char* key) {
  known_.insert(key);
  return !error_ && Find(key) != nullptr;
}

void JsonFieldReader::Fail(const std::string& what) {
  if (!error_) error_ = Error{command_ + ": " + what};
}

void JsonFieldReader::Field(const char* key, std::string& out, uint64_t, uint64_t) {
  if (!Present(key)) return;
  const json& v = *Find(key);
  if (!v.is_string()) return Fail(Path(key) + " must be a string");
  out = v.get<std::string>();
}

void JsonFieldReader::Field(const char* key, bool& out, uint64_t, uint64_t) {
  if (!Present(key)) return;
  const json& v = *Find(key);
  if (!v.is_boolean()) return Fail(Path(key) + " must be true or false");
  out = v.get<bool>();
}

void JsonFieldReader::Field(const char* key, double& out, uint64_t, uint64_t) {
  if (!Present(key)) return;
  const json& v = *Find(key);
  if (!v.is_number()) return Fail(Path(key) + " must be a number");
  out = v.get<double>();
}

void JsonFieldReader::Field(const char* key, json& out, uint64_t, uint64_t) {
  if (!Present(key)) return;
  out = *Find(key);
}

void JsonFieldReader::Field(const char* key, uint64_t& out, uint64_t lo, uint64_t hi) {
  if (!Present(key)) return;
  const json& v = *Find(key);
  // JSON from the wire parses as unsigned; built in C++ it may be signed.
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0)) {
    return Fail(Path(key) + " must be a non-negative integer");
  }
  const uint64_t n = v.get<uint64_t>();
  if ((lo != 0 || hi != 0) && (n < lo || n > hi)) {
    return Fail(Path(key) + " = " + std::to_string(n) + " is outside " + std::to_string(lo) + ".." +
                std::to_string(hi));
  }
  out = n;
}

void JsonFieldReader::Field(const char* key, uint32_t& out, uint64_t lo, uint64_t hi) {
  uint64_t wide = out;
  Field(key, wide, lo, hi == 0 ? std::numeric_limits<uint32_t>::max() : hi);
  if (!error_) out = static_cast<uint32_t>(wide);
}

void JsonFieldReader::Field(const char* key, int& out, uint64_t lo, uint64_t hi) {
  uint64_t wide = static_cast<uint64_t>(out);
  Field(key, wide, lo, hi == 0 ? std::numeric_limits<int>::max() : hi);
  if (!error_) out = static_cast<int>(wide);
}

void JsonFieldReader::List(const char* key, std::vector<std::string>& out, size_t max) {
  if (!Present(key)) return;
  const json& v = *Find(key);
  if (!v.is_array() || v.size() > max) {
    return Fail(Path(key) + " must be a list of at most " + std::to_string(max) + " strings");
  }
  std::vector<std::string> list;
  for (const json& item : v) {
    if (!item.is_string()) return Fail(Path(key) + " must hold strings");
    list.push_back(item.get<std::string>());
  }
  out = std::move(list);
}

Status JsonFieldReader::Finish() const {
  if (error_) return *error_;
  for (const auto& [key, value] : args_.items()) {
    if (known_.contains(key)) continue;
    std::string takes;
    for (const std::string& k : known_) takes += (takes.empty() ? "" : ", ") + k;
    const bool args = where_ == "args";
    return Error{command_ + ": unknown " + (args ? "argument " : "key ") + where_ + "." + key +
                 " (" + (args ? command_ : where_) + " takes: " + (takes.empty() ? "none" : takes) +
                 ")"};
  }
  return {};
}

}  // namespace hvtrace::hostd
