// libvirt's event loop, run by Boost.Asio.
//
// libvirt delivers domain events, keepalives and close notifications only
// through an event loop the application registers (virEventRegisterImpl)
// before it opens a connection. Instead of a thread spinning in
// virEventRunDefaultImpl, this implementation serves libvirt's handles and
// timeouts from an Asio executor (the daemon's I/O context):
//   - handles: libvirt's fds are dup()ed into one level-triggered epoll set,
//     and that epoll fd is waited on with an asio stream_descriptor; ready fds
//     are dispatched with poll()-style masks (READABLE/WRITABLE/ERROR/HANGUP).
//     Asio's own reactor is edge-triggered and forgets readiness that arrives
//     while no wait is queued, so after arming the wait we look again.
//   - timeouts: one steady_timer each (frequency -1 off, 0 "as soon as
//     possible", N ms periodic).
// All callbacks into libvirt run on one strand, as libvirt expects from a
// single-threaded loop. libvirt calls add/update/remove from any thread (also
// from inside our callbacks), so the tables are locked and libvirt's free
// callbacks are posted to run later from a clean stack, never from inside
// remove (libvirt deadlocks otherwise).
//
// libvirt accepts one implementation per process, so this is a process-wide
// singleton: Install() binds it to an executor once, before the first
// connection.
#ifndef HVTRACE_HOSTD_LIBVIRT_EVENT_LOOP_H_
#define HVTRACE_HOSTD_LIBVIRT_EVENT_LOOP_H_

#include <boost/asio/any_io_executor.hpp>
#include <cstdint>

#include "hvtrace/result.h"

namespace hvtrace::hostd {

class LibvirtEventLoop {
 public:
  // Registers the implementation with libvirt, running on |executor| (an
  // io_context's executor; the loop adds its own strand). Succeeds again for
  // the same executor; fails if already bound to another one.
  static Status Install(boost::asio::any_io_executor executor);

  // For tools and tests without their own io_context: installs on a private
  // io_context served by a thread that lives as long as the process, unless
  // an implementation is installed already.
  static Status EnsureInstalled();

  static bool installed();

  // The executor the loop runs on (installed() must be true). Code that
  // reacts to libvirt events (reconnect timers) runs there too.
  static boost::asio::any_io_executor executor();

  // True on a thread that has dispatched libvirt callbacks. Code that blocks
  // waiting for a libvirt event must not run there: it would wait for itself.
  static bool OnLoopThread();

  struct Stats {
    int handles = 0;  // Registered and not removed.
    int timeouts = 0;
    uint64_t handle_dispatches = 0;
    uint64_t timeout_dispatches = 0;
    uint64_t wakeups = 0;  // Times the epoll set was found ready.
  };
  static Stats GetStats();
};

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_LIBVIRT_EVENT_LOOP_H_
