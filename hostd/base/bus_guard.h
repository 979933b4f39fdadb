// Reading a shared mapping of a file that another process may shrink. A guest
// region's backing file is QEMU's (its user owns an attach region's file and
// can ftruncate it): a page past the new end raises SIGBUS, which would kill
// hvtraced and every VM's capture with it. Under this guard the access fails
// instead and the caller reports the region as shrunk.
//
// Why map at all: pread of a 16 MiB region took 7-9 ms on the CI-sized
// machine against 2.7-3.0 ms for mmap + memcpy and 1.7 ms for memcpy alone
// (bench/README.md, capture_latency.sh `copy`): most of panic -> region.bin
// durable.
#ifndef HVTRACE_HOSTD_BASE_BUS_GUARD_H_
#define HVTRACE_HOSTD_BASE_BUS_GUARD_H_

#include <cstddef>
#include <type_traits>

namespace hvtrace::hostd {

// Runs fn(ctx); returns false if it raised SIGBUS (fn is then abandoned where
// it was: it must hold no lock and allocate nothing while touching the
// mapping). SIGBUS outside a guard keeps its earlier disposition.
bool RunBusGuarded(void (*fn)(void*), void* ctx);

// The same for a callable: RunBusGuarded([&] { ... }).
template <typename F>
bool RunBusGuarded(F&& fn) {
  using Fn = std::remove_reference_t<F>;
  return RunBusGuarded([](void* p) { (*static_cast<Fn*>(p))(); }, &fn);
}

// memcpy under RunBusGuarded.
bool GuardedCopy(void* dst, const void* src, size_t n);

}  // namespace hvtrace::hostd

#endif  // HVTRACE_HOSTD_BASE_BUS_GUARD_H_
