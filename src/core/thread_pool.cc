// pthreadpool behind core::ThreadPool.
#include "core/thread_pool.h"

#include <pthreadpool.h>

namespace moert::core {
namespace {

void Trampoline(void* context, size_t i) {
  (*static_cast<absl::FunctionRef<void(size_t)>*>(context))(i);
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
  // Idle workers yield rather than spin: the cores may be shared with other work.
  pthreadpool_parallelize_1d(pool_, &Trampoline, &fn, n, PTHREADPOOL_FLAG_YIELD_WORKERS);
}

}  // namespace moert::core
