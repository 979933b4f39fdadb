#include "qmp_framer.h"

#include <cstdio>
#include <utility>

namespace hvtrace::hostd {

QmpFramer::QmpFramer(size_t max_message_bytes) : max_message_bytes_(max_message_bytes) {}

Status QmpFramer::Fail(std::string message) {
  failed_ = true;
  error_ = Error{std::move(message)};
  current_.clear();
  return error_;
}

Status QmpFramer::CompleteMessage() {
  // The scanner only proved the brackets balance; the JSON parser decides
  // whether the rest is valid. allow_exceptions=false: a bad message is a
  // value to report, not a throw through the I/O loop.
  nlohmann::json message = nlohmann::json::parse(current_, nullptr, /*allow_exceptions=*/false);
  const size_t size = current_.size();
  current_.clear();
  if (message.is_discarded()) {
    return Fail("QMP: malformed JSON message of " + std::to_string(size) +
                " bytes ending at byte " + std::to_string(consumed_));
  }
  if (!message.is_object()) {
    return Fail("QMP: message ending at byte " + std::to_string(consumed_) +
                " is not a JSON object");
  }
  ready_.push_back(std::move(message));
  return {};
}

Status QmpFramer::Feed(std::string_view bytes) {
  if (failed_) return error_;
  for (const char c : bytes) {
    ++consumed_;
    if (current_.empty()) {
      // Between messages: only whitespace, and a message must be an object.
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') continue;
      if (c != '{') {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "0x%02x", static_cast<unsigned char>(c));
        return Fail(std::string("QMP: unexpected byte ") + hex + " between messages at byte " +
                    std::to_string(consumed_));
      }
    }
    if (current_.size() >= max_message_bytes_) {
      return Fail("QMP: message exceeds the " + std::to_string(max_message_bytes_) +
                  "-byte limit at byte " + std::to_string(consumed_));
    }
    current_.push_back(c);
    if (in_string_) {
      if (escape_) {
        escape_ = false;
      } else if (c == '\\') {
        escape_ = true;
      } else if (c == '"') {
        in_string_ = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string_ = true;
        break;
      case '{':
      case '[':
        if (++depth_ > kMaxNestingDepth) {
          return Fail("QMP: message nests deeper than " + std::to_string(kMaxNestingDepth) +
                      " levels at byte " + std::to_string(consumed_));
        }
        break;
      case '}':
      case ']':
        if (--depth_ == 0) {
          if (Status s = CompleteMessage(); !s.ok()) return s;
        }
        break;
      default:
        break;
    }
  }
  return {};
}

bool QmpFramer::Pop(nlohmann::json* message) {
  if (ready_.empty()) return false;
  *message = std::move(ready_.front());
  ready_.pop_front();
  return true;
}

Status QmpFramer::Finish() const {
  if (failed_) return error_;
  if (!current_.empty()) {
    return Error{"QMP: stream ended in the middle of a message (" +
                 std::to_string(current_.size()) + " bytes pending at byte " +
                 std::to_string(consumed_) + ")"};
  }
  return {};
}

}  // namespace hvtrace::hostd
