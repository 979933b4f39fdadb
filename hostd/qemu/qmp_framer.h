// QmpFramer: the sans-I/O core of the QMP client. It turns the byte stream of
// a QEMU monitor socket into complete JSON messages.
//
// Wire format (QEMU docs/interop/qmp-spec.txt): a stream of JSON objects,
// each followed by "\r\n" when QEMU writes them. We do not rely on the line
// ending: the framer tracks object nesting, strings and escapes, so a message
// is complete when its outermost '}' arrives, however the bytes were split
// across reads. Between messages only whitespace is allowed.
//
// The peer is QEMU, which we trust more than a guest but not blindly: a
// message larger than |max_message_bytes|, nesting deeper than
// |kMaxNestingDepth|, anything that is not a JSON object, or bytes outside a
// message are errors. Errors are sticky: once the stream is out of step there
// is no safe way to find the next message boundary, so the owner closes the
// connection.
#ifndef HVTRACE_HOSTD_QMP_FRAMER_H_
#define HVTRACE_HOSTD_QMP_FRAMER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

class QmpFramer {
 public:
  static constexpr size_t kDefaultMaxMessageBytes = 1 << 20;
  static constexpr int kMaxNestingDepth = 64;

  explicit QmpFramer(size_t max_message_bytes = kDefaultMaxMessageBytes);

  // Consumes |bytes|; every message completed by them is queued for Pop().
  // Returns the (sticky) error if the stream is malformed; messages completed
  // before the bad byte stay queued.
  Status Feed(std::string_view bytes);

  // Moves the oldest complete message into |*message|. False when none.
  bool Pop(nlohmann::json* message);

  // Call at end of stream: an error if a message was cut off (EOF mid-message)
  // or the stream had already failed.
  Status Finish() const;

  bool failed() const { return failed_; }
  size_t queued() const { return ready_.size(); }
  // Total bytes consumed, for error messages ("at byte N").
  uint64_t bytes_consumed() const { return consumed_; }

 private:
  Status Fail(std::string message);
  Status CompleteMessage();

  size_t max_message_bytes_;
  std::string current_;  // Bytes of the message being assembled.
  int depth_ = 0;        // Nesting of {} and [] inside |current_|.
  bool in_string_ = false;
  bool escape_ = false;
  bool failed_ = false;
  Error error_;
  uint64_t consumed_ = 0;
  std::deque<nlohmann::json> ready_;
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_QMP_FRAMER_H_
