// pthreadpool behind core::ThreadPool.
#include "core/thread_pool.h"

#include <pthreadpool.h>

// ThreadSanitizer cannot see pthreadpool's hand-offs (the library is not instrumented):
// say them, so that what the caller wrote before ParallelFor is ordered before the
// tasks and the tasks before what it reads after, and real races between tasks are
// still found.
#if defined(__SANITIZE_THREAD__)
#define MOERT_TSAN_ANNOTATE 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MOERT_TSAN_ANNOTATE 1
#endif
#endif
#ifdef MOERT_TSAN_ANNOTATE
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace moert::core {
namespace {

void Trampoline(void* context, size_t i) {
#ifdef MOERT_TSAN_ANNOTATE
  __tsan_acquire(context);
#endif
  (*static_cast<absl::FunctionRef<void(size_t)>*>(context))(i);
#ifdef MOERT_TSAN_ANNOTATE
  __tsan_release(context);
#endif
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads == 1) return;
  pool_ = pthreadpool_create(threads < 0 ? 1 : static_cast<size_t>(threads));
  threads_ = pool_ == nullptr ? 1 : static_cast<int>(pthreadpool_get_threads_count(pool_));
}

ThreadPool::~ThreadPool() {
  if (pool_ != nullptr) pthreadpool_destroy(pool_);
}

void ThreadPool::ParallelFor(size_t n, absl::FunctionRef<void(size_t)> fn) {
  if (pool_ == nullptr || n <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
#ifdef MOERT_TSAN_ANNOTATE
  __tsan_release(&fn);
#endif
  pthreadpool_parallelize_1d(pool_, &Trampoline, &fn, n,
                             poll_ ? 0 : PTHREADPOOL_FLAG_YIELD_WORKERS);
#ifdef MOERT_TSAN_ANNOTATE
  __tsan_acquire(&fn);
#endif
}

}  // namespace moert::core
