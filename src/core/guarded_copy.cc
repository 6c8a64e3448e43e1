// The SIGBUS handler behind CopyFromMapping and its table of copies in progress.
#include "core/guarded_copy.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>

namespace moert::core {
namespace {

// Copies in progress at once; a thread finding every slot taken waits for one.
constexpr int kGuards = 32;

struct Guard {
  std::atomic<bool> taken{false};
  std::atomic<bool> armed{false};
  std::atomic<pthread_t> thread{};
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<sigjmp_buf*> env{nullptr};
};

Guard g_guards[kGuards];
std::atomic<int> g_armed{0};
struct sigaction g_previous {};

// What SIGBUS did before: the previous handler, or the default action.
void Chain(int sig, siginfo_t* info, void* context) {
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler == SIG_IGN && info->si_code <= 0) return;  // sent, and ignored
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
    return;
  }
  // The default action: a fault happens again on return and kills the process as it
  // would have; a signal someone sent is sent again.
  ::signal(sig, SIG_DFL);
  if (info->si_code <= 0) ::raise(sig);
}

void OnSigbus(int sig, siginfo_t* info, void* context) {
  if (g_armed.load(std::memory_order_acquire) > 0) {
    const pthread_t self = ::pthread_self();
    const uintptr_t at = reinterpret_cast<uintptr_t>(info->si_addr);
    for (Guard& g : g_guards) {
      if (!g.armed.load(std::memory_order_acquire)) continue;
      if (!::pthread_equal(g.thread.load(std::memory_order_relaxed), self)) continue;
      if (at >= g.begin.load(std::memory_order_relaxed) &&
          at < g.end.load(std::memory_order_relaxed)) {
        ::siglongjmp(*g.env.load(std::memory_order_relaxed), 1);
      }
    }
  }
  Chain(sig, info, context);
}

void InstallOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_sigaction = OnSigbus;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGBUS, &action, &g_previous);
  });
}

Guard& TakeGuard() {
  while (true) {
    for (Guard& g : g_guards) {
      if (!g.taken.exchange(true, std::memory_order_acquire)) return g;
    }
    std::this_thread::yield();
  }
}

void Arm(Guard& g, const void* src, size_t n, sigjmp_buf* env) {
  g.thread.store(::pthread_self(), std::memory_order_relaxed);
  g.begin.store(reinterpret_cast<uintptr_t>(src), std::memory_order_relaxed);
  g.end.store(reinterpret_cast<uintptr_t>(src) + n, std::memory_order_relaxed);
  g.env.store(env, std::memory_order_relaxed);
  g.armed.store(true, std::memory_order_release);
  g_armed.fetch_add(1, std::memory_order_acq_rel);
}

void Disarm(Guard& g) {
  g_armed.fetch_sub(1, std::memory_order_acq_rel);
  g.armed.store(false, std::memory_order_release);
  g.taken.store(false, std::memory_order_release);
}

// Apart from CopyFromMapping, so that nothing of the copy's state lives across the
// sigsetjmp in the caller's frame.
[[gnu::noinline]] void Copy(void* dst, const void* src, size_t n) { std::memcpy(dst, src, n); }

}  // namespace

bool CopyFromMapping(void* dst, const void* src, size_t n) {
  if (n == 0) return true;
  InstallOnce();
  Guard& g = TakeGuard();
  sigjmp_buf env;
  Arm(g, src, n, &env);
  // No local changes between sigsetjmp and a siglongjmp back: such a local's value is
  // indeterminate after the jump (GCC for aarch64 stores an `ok = true` before the copy).
  if (sigsetjmp(env, 1) != 0) {
    Disarm(g);
    return false;
  }
  Copy(dst, src, n);
  Disarm(g);
  return true;
}

}  // namespace moert::core
