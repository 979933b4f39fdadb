// The hvtraced control protocol: JSON lines over a Unix stream socket.
//
// Request (one line, at most kMaxRequestBytes including the newline):
//   {"id":N,"cmd":"status","args":{"name":"vm1"}}
// |id| is a 64-bit integer chosen by the client and echoed in every reply line;
// |args| is optional and must be an object when present. "fds":N (0..4) says
// the request carries N open files (fd_passing.h); args name them by index.
//
// Replies (one line each):
//   {"id":N,"ok":true,"result":<any>}                      final, success
//   {"id":N,"ok":false,"error":"<text>","code":"<code>"}   final, failure
//   {"id":N,"stream":<any>}                                 streaming item
//   {"id":N,"stream":<any>,"fds":N}                         item carrying N
//                                                           open files
//   {"id":N,"ok":true,"end":true,"result":<any>}            end of a stream
// A streaming command sends any number of "stream" lines and then exactly one
// final line; a plain command sends only the final line. A stream item with
// "fds" (1..4) arrives with that many descriptors attached to its first byte
// (capture-files: read-only descriptors of a capture's files). A request that cannot
// be parsed gets an error reply whose |id| is the request's id when it could be
// recovered and null otherwise.
//
// Everything here is sans-I/O: bytes in, lines/values out, no sockets, so the
// framer and parsers are unit-tested and fuzzed directly.
#ifndef HVTRACE_HOSTD_CONTROL_PROTOCOL_H_
#define HVTRACE_HOSTD_CONTROL_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "fd_passing.h"
#include "hvtrace/result.h"

namespace hvtrace::hostd {

inline constexpr size_t kMaxRequestBytes = 64 * 1024;
// Deeper JSON is refused (requests and replies) before it is parsed.
inline constexpr size_t kMaxJsonDepth = 64;
// Replies can carry listings; the client accepts much longer lines.
inline constexpr size_t kMaxReplyBytes = 16 * 1024 * 1024;

// Error codes carried in the "code" member of error replies.
inline constexpr std::string_view kErrBadRequest = "bad_request";
inline constexpr std::string_view kErrTooLarge = "too_large";
inline constexpr std::string_view kErrUnknownCommand = "unknown_command";
inline constexpr std::string_view kErrUnknownVm = "unknown_vm";
inline constexpr std::string_view kErrUnknownCapture = "unknown_capture";
inline constexpr std::string_view kErrBusy = "busy";
inline constexpr std::string_view kErrDenied = "permission_denied";
inline constexpr std::string_view kErrInternal = "internal";
inline constexpr std::string_view kErrVmFailed = "vm_failed";

// One line cut out of the byte stream by LineFramer.
struct Frame {
  // False when the line exceeded the cap; |text| is then empty and the framer
  // has skipped input up to and including the next newline.
  bool within_limit = true;
  std::string text;        // Without the trailing "\n" (and "\r").
  uint64_t stream_offset;  // Offset of the line's first byte in the stream.
};

// Splits a byte stream into newline-terminated lines of at most |max_line|
// bytes, not counting the newline. An over-long line yields one Frame with |within_limit| false as
// soon as the cap is passed (not when its newline finally arrives), and the framer then discards
// bytes until the next newline, so a peer cannot make it buffer more than |max_line| bytes.
class LineFramer {
 public:
  explicit LineFramer(size_t max_line) : max_line_(max_line) {}

  // Appends every line completed by |data| to |out|.
  void Feed(std::span<const std::byte> data, std::vector<Frame>& out);
  void Feed(std::string_view data, std::vector<Frame>& out);

  // Bytes of an unfinished line currently held.
  size_t buffered() const { return partial_.size(); }

 private:
  size_t max_line_;
  std::string partial_;
  bool discarding_ = false;
  uint64_t offset_ = 0;      // Stream offset of the next byte fed.
  uint64_t line_start_ = 0;  // Stream offset of |partial_|'s first byte.
};

struct Request {
  int64_t id = 0;
  std::string cmd;
  nlohmann::json args = nlohmann::json::object();
  size_t fd_count = 0;        // "fds" as the request declared it.
  std::vector<SharedFd> fds;  // The descriptors themselves (the server fills them in).
  // The client's uid from SO_PEERCRED (the server sets it; never from the wire).
  std::optional<uint32_t> peer_uid;
};

// A request that failed to parse: the error text and, when the line was JSON
// with a usable "id", that id so the client can match the error.
struct RequestError {
  std::optional<int64_t> id;
  std::string code;
  std::string message;
};

// Parses one request line. Never throws; anything unexpected is a RequestError.
// Blank lines are not requests: the caller skips them (IsBlankLine).
std::variant<Request, RequestError> ParseRequest(std::string_view line);
bool IsBlankLine(std::string_view line);

// Reply lines, each ending in "\n". Strings that are not valid UTF-8 are
// replaced rather than making serialization throw.
std::string OkReply(int64_t id, const nlohmann::json& result);
std::string ErrorReply(std::optional<int64_t> id, std::string_view code, std::string_view message);
// |fds|: how many descriptors go along with the line (0: none).
std::string StreamItem(int64_t id, const nlohmann::json& item, size_t fds = 0);
std::string StreamEnd(int64_t id, const nlohmann::json& result);

// A parsed reply line, for clients.
struct Reply {
  std::optional<int64_t> id;
  bool is_stream_item = false;  // A "stream" line; more lines follow.
  bool ok = false;              // Final lines only.
  nlohmann::json result;        // Final ok reply or stream item.
  std::string error;            // Final error reply.
  std::string code;
  size_t fd_count = 0;        // "fds" of a stream item.
  std::vector<SharedFd> fds;  // Those descriptors (the client fills them in).
};
Result<Reply> ParseReply(std::string_view line);

// The args of |cmd| that name files the daemon reads: for each, the CLI
// opens the file as the calling user and sends the descriptor, and the
// daemon never opens the path. boot: "kernel", "initrd"; formats-harvest:
// "kernel"; adopt: the FILE of "boot_region" (FILE@GPA:SIZE). The descriptors' indices go into
// "<key>_fd"; the paths stay in args, for messages only.
struct OpenedFiles {
  std::vector<UniqueFd> fds;
  std::vector<int> raw() const;
};
Result<OpenedFiles> OpenRequestFiles(std::string_view cmd, nlohmann::json& args);

// Serializes without ever throwing on invalid UTF-8.
std::string DumpJson(const nlohmann::json& value);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_CONTROL_PROTOCOL_H_
