// Passing open files over the control socket (SCM_RIGHTS).
//
// The daemon runs as root and never opens a path a client names: the client
// opens its input files (kernel, initrd, boot region) with its own rights and
// sends the descriptors along with the request line. A request says how many
// it carries ({"id":…,"cmd":…,"fds":N,"args":{…,"kernel_fd":0}}); the
// descriptors travel with the request's first byte, so the server queues what
// each read brings and hands a request the first N queued. |args| refer to
// them by index.
#ifndef HVTRACE_HOSTD_FD_PASSING_H_
#define HVTRACE_HOSTD_FD_PASSING_H_

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "hvtrace/result.h"
#include "unique_fd.h"

namespace hvtrace::hostd {

// At most this many descriptors per request; a server holds at most twice as
// many not yet claimed per connection (more closes the connection).
inline constexpr size_t kMaxFdsPerRequest = 4;

using SharedFd = std::shared_ptr<UniqueFd>;

// Sends all of |bytes| on the stream socket |socket|, |fds| attached to the
// first byte. Retries EINTR; never raises SIGPIPE.
Status SendWithFds(int socket, std::string_view bytes, std::span<const int> fds);

// One non-blocking sendmsg of (a prefix of) |bytes| with |fds| attached to
// its first byte: for a writer that waits for writability itself (hvtraced's
// Asio socket). Returns the byte count sent (the descriptors went with it),
// -1 with errno set (EAGAIN: nothing sent, try again when writable).
ssize_t SendSomeWithFds(int socket, std::string_view bytes, std::span<const int> fds);

// One non-blocking recvmsg into |buf|. Received descriptors (close-on-exec)
// are appended to |fds|; |*truncated| is set when the peer sent more than
// kMaxFdsPerRequest at once (the kernel closes the excess). Returns the
// byte count, 0 at EOF, -1 with errno set.
ssize_t RecvWithFds(int socket, std::span<char> buf, std::vector<SharedFd>& fds, bool* truncated);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_FD_PASSING_H_
