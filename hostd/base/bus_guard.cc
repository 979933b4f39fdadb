#include "bus_guard.h"

#include <setjmp.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <mutex>

namespace hvtrace::hostd {
namespace {

// The guard of the thread the signal hit: SIGBUS from a memory access is
// delivered to the thread that made it. Initial-exec TLS (this is linked
// into executables), so reading it in the handler is async-signal-safe.
thread_local sigjmp_buf* t_guard = nullptr;
struct sigaction g_previous;

void OnBus(int sig, siginfo_t* info, void* context) {
  if (sigjmp_buf* guard = t_guard) siglongjmp(*guard, 1);
  if ((g_previous.sa_flags & SA_SIGINFO) && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
    return;
  }
  ::signal(SIGBUS, SIG_DFL);  // Returning re-runs the access, which now kills us.
}

void Install() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnBus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous);
  });
}

struct CopyArgs {
  void* dst;
  const void* src;
  size_t n;
};

}  // namespace

bool RunBusGuarded(void (*fn)(void*), void* ctx) {
  Install();
  sigjmp_buf env;
  if (sigsetjmp(env, 1) != 0) {
    t_guard = nullptr;
    return false;
  }
  t_guard = &env;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  fn(ctx);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_guard = nullptr;
  return true;
}

bool GuardedCopy(void* dst, const void* src, size_t n) {
  if (n == 0) return true;
  CopyArgs args{dst, src, n};
  return RunBusGuarded(
      [](void* p) {
        auto* a = static_cast<CopyArgs*>(p);
        std::memcpy(a->dst, a->src, a->n);
      },
      &args);
}

}  // namespace hvtrace::hostd
