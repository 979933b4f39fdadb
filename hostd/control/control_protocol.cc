#include "control_protocol.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

namespace hvtrace::hostd {
namespace {

using nlohmann::json;

constexpr size_t kMaxCommandName = 64;

std::optional<int64_t> IdFrom(const json& value) {
  if (value.is_number_integer() && !value.is_number_unsigned()) {
    return value.get<int64_t>();
  }
  if (value.is_number_unsigned()) {
    uint64_t u = value.get<uint64_t>();
    if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return static_cast<int64_t>(u);
    }
  }
  return std::nullopt;
}

json IdJson(std::optional<int64_t> id) { return id ? json(*id) : json(nullptr); }

// Records the first syntax error of a SAX parse; everything else is accepted
// and dropped. Used only to explain a failed parse without throwing.
struct ErrorCatcher : nlohmann::json_sax<json> {
  std::string message;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    message = e.what();
    return false;
  }
};

// Parsing is iterative in nlohmann::json, but copying, comparing and dumping
// a value recurse once per level: a 64 KiB line of '[' would overflow the
// stack later. So depth is checked on the raw text first.
Status CheckNesting(std::string_view text) {
  size_t depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        return Error{"JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                     " levels at byte " + std::to_string(i)};
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return {};
}

// Never throws: hostile input is the normal case here, and exceptions per bad
// line would also be slow.
Result<json> ParseJson(std::string_view text) {
  if (Status s = CheckNesting(text); !s.ok()) return s.error();
  json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (!doc.is_discarded()) return doc;
  ErrorCatcher catcher;
  json::sax_parse(text.begin(), text.end(), &catcher);
  return Error{catcher.message.empty() ? "syntax error" : catcher.message};
}

}  // namespace

void LineFramer::Feed(std::string_view data, std::vector<Frame>& out) {
  while (!data.empty()) {
    size_t nl = data.find('\n');
    if (discarding_) {
      if (nl == std::string_view::npos) {
        offset_ += data.size();
        return;
      }
      offset_ += nl + 1;
      data.remove_prefix(nl + 1);
      discarding_ = false;
      line_start_ = offset_;
      continue;
    }
    std::string_view piece = nl == std::string_view::npos ? data : data.substr(0, nl);
    if (partial_.size() + piece.size() > max_line_) {
      out.push_back(Frame{false, {}, line_start_});
      partial_.clear();
      if (nl == std::string_view::npos) {
        // Skip the rest of this line as it arrives, without buffering it.
        discarding_ = true;
        offset_ += data.size();
        return;
      }
      offset_ += nl + 1;
      data.remove_prefix(nl + 1);
      line_start_ = offset_;
      continue;
    }
    partial_.append(piece);
    if (nl == std::string_view::npos) {
      offset_ += data.size();
      return;
    }
    offset_ += nl + 1;
    data.remove_prefix(nl + 1);
    if (!partial_.empty() && partial_.back() == '\r') partial_.pop_back();
    out.push_back(Frame{true, std::move(partial_), line_start_});
    partial_.clear();
    line_start_ = offset_;
  }
}

void LineFramer::Feed(std::span<const std::byte> data, std::vector<Frame>& out) {
  Feed(std::string_view(reinterpret_cast<const char*>(data.data()), data.size()), out);
}

bool IsBlankLine(std::string_view line) {
  return std::all_of(line.begin(), line.end(),
                     [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

std::variant<Request, RequestError> ParseRequest(std::string_view line) {
  Result<json> parsed = ParseJson(line);
  if (!parsed.ok()) {
    return RequestError{std::nullopt, std::string(kErrBadRequest),
                        "malformed JSON: " + parsed.error().message};
  }
  const json& doc = *parsed;
  if (!doc.is_object()) {
    return RequestError{std::nullopt, std::string(kErrBadRequest),
                        std::string("request must be a JSON object, got ") + doc.type_name()};
  }
  auto id_it = doc.find("id");
  if (id_it == doc.end()) {
    return RequestError{std::nullopt, std::string(kErrBadRequest), "request has no \"id\""};
  }
  std::optional<int64_t> id = IdFrom(*id_it);
  if (!id) {
    return RequestError{std::nullopt, std::string(kErrBadRequest),
                        "request \"id\" must be an integer in the int64 range"};
  }
  auto cmd_it = doc.find("cmd");
  if (cmd_it == doc.end() || !cmd_it->is_string()) {
    return RequestError{id, std::string(kErrBadRequest), "request needs a string \"cmd\""};
  }
  const std::string& cmd = cmd_it->get_ref<const std::string&>();
  if (cmd.empty() || cmd.size() > kMaxCommandName) {
    return RequestError{
        id, std::string(kErrBadRequest),
        "request \"cmd\" must be 1.." + std::to_string(kMaxCommandName) + " characters"};
  }
  Request request;
  request.id = *id;
  request.cmd = cmd;
  auto args_it = doc.find("args");
  if (args_it != doc.end() && !args_it->is_null()) {
    if (!args_it->is_object()) {
      return RequestError{
          id, std::string(kErrBadRequest),
          std::string("request \"args\" must be an object, got ") + args_it->type_name()};
    }
    request.args = *args_it;
  }
  if (auto fds_it = doc.find("fds"); fds_it != doc.end() && !fds_it->is_null()) {
    if (!fds_it->is_number_unsigned() || fds_it->get<uint64_t>() > kMaxFdsPerRequest) {
      return RequestError{
          id, std::string(kErrBadRequest),
          "request \"fds\" must be an integer 0.." + std::to_string(kMaxFdsPerRequest)};
    }
    request.fd_count = fds_it->get<size_t>();
  }
  return request;
}

std::string DumpJson(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string OkReply(int64_t id, const json& result) {
  json reply = {{"id", id}, {"ok", true}, {"result", result}};
  return DumpJson(reply) + "\n";
}

std::string ErrorReply(std::optional<int64_t> id, std::string_view code, std::string_view message) {
  json reply = {{"id", IdJson(id)},
                {"ok", false},
                {"error", std::string(message)},
                {"code", std::string(code)}};
  return DumpJson(reply) + "\n";
}

std::string StreamItem(int64_t id, const json& item, size_t fds) {
  json reply = {{"id", id}, {"stream", item}};
  if (fds != 0) reply["fds"] = fds;
  return DumpJson(reply) + "\n";
}

std::string StreamEnd(int64_t id, const json& result) {
  json reply = {{"id", id}, {"ok", true}, {"end", true}, {"result", result}};
  return DumpJson(reply) + "\n";
}

Result<Reply> ParseReply(std::string_view line) {
  Result<json> parsed = ParseJson(line);
  if (!parsed.ok()) return Error{"malformed reply from hvtraced: " + parsed.error().message};
  json& doc = *parsed;
  if (!doc.is_object()) return Error{"reply from hvtraced is not a JSON object"};
  Reply reply;
  auto id_it = doc.find("id");
  if (id_it == doc.end()) return Error{"reply from hvtraced has no \"id\""};
  if (!id_it->is_null()) {
    reply.id = IdFrom(*id_it);
    if (!reply.id) return Error{"reply from hvtraced has a non-integer \"id\""};
  }
  if (auto it = doc.find("stream"); it != doc.end()) {
    reply.is_stream_item = true;
    reply.result = std::move(*it);
    if (auto fds = doc.find("fds"); fds != doc.end()) {
      if (!fds->is_number_unsigned() || fds->get<uint64_t>() > kMaxFdsPerRequest) {
        return Error{"reply from hvtraced has a bad \"fds\" (want 0.." +
                     std::to_string(kMaxFdsPerRequest) + ")"};
      }
      reply.fd_count = fds->get<size_t>();
    }
    return reply;
  }
  auto ok_it = doc.find("ok");
  if (ok_it == doc.end() || !ok_it->is_boolean()) {
    return Error{"reply from hvtraced has no boolean \"ok\""};
  }
  reply.ok = ok_it->get<bool>();
  if (reply.ok) {
    if (auto it = doc.find("result"); it != doc.end()) reply.result = std::move(*it);
  } else {
    auto err = doc.find("error");
    reply.error =
        err != doc.end() && err->is_string() ? err->get<std::string>() : "unspecified error";
    auto code = doc.find("code");
    if (code != doc.end() && code->is_string()) reply.code = code->get<std::string>();
  }
  return reply;
}

std::vector<int> OpenedFiles::raw() const {
  std::vector<int> out;
  for (const UniqueFd& fd : fds) out.push_back(fd.get());
  return out;
}

Result<OpenedFiles> OpenRequestFiles(std::string_view cmd, json& args) {
  OpenedFiles opened;
  auto open_one = [&](const char* key, const std::string& path) -> Status {
    // O_NONBLOCK: a FIFO or device named by mistake must not hang the CLI;
    // the daemon refuses anything but a regular file anyway.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
      return Error{std::string("cannot open ") + key + " " + path + " as uid " +
                   std::to_string(::geteuid()) + ": " + std::strerror(errno) +
                   " (hvtraced reads only files its client can read)"};
    }
    opened.fds.emplace_back(fd);
    args[std::string(key) + "_fd"] = opened.fds.size() - 1;
    return {};
  };
  auto string_arg = [&](const char* key) -> std::string {
    auto it = args.find(key);
    return it != args.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (cmd == "boot" || cmd == "formats-harvest") {
    for (const char* key : {"kernel", "initrd"}) {
      if (std::string path = string_arg(key); !path.empty()) {
        if (Status s = open_one(key, path); !s.ok()) return s.error();
      }
    }
  } else if (cmd == "adopt") {
    const std::string region = string_arg("boot_region");
    const size_t at = region.rfind('@');
    if (at != std::string::npos && at > 0) {
      if (Status s = open_one("boot_region", region.substr(0, at)); !s.ok()) return s.error();
    }
  }
  return opened;
}

}  // namespace hvtrace::hostd
