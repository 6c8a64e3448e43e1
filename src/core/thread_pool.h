// The compute threads (pthreadpool; the caller's thread takes part), shared by the
// reference layers (model/) and the kernel operators (backend/).
#ifndef MOERT_CORE_THREAD_POOL_H_
#define MOERT_CORE_THREAD_POOL_H_

#include <cstddef>

#include "absl/functional/function_ref.h"

struct pthreadpool;

namespace moert::core {

class ThreadPool {
 public:
  // `threads` >= 1; 0 means one per core.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return threads_; }
  // The pthreadpool behind it, for libraries that take one (XNNPACK); null: one thread.
  pthreadpool* handle() const { return pool_; }

  // Calls fn(i) for every i in [0, n), spread over the threads. Calls must write
  // disjoint outputs; which thread runs which i is unspecified.
  void ParallelFor(size_t n, absl::FunctionRef<void(size_t)> fn);

 private:
  pthreadpool* pool_ = nullptr;  // null: run on the caller's thread
  int threads_ = 1;
};

}  // namespace moert::core

#endif  // MOERT_CORE_THREAD_POOL_H_
