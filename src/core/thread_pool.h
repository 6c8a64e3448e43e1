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

  // Whether the workers, once a ParallelFor is done, spin for a while (pthreadpool's
  // bounded spin-wait) before they sleep, so that the next one starts without a futex
  // wake-up each (default), or sleep at once, which frees the cores between parallel
  // sections. A fully resident decode step runs hundreds of short ones: spinning was
  // 10-16% faster on a 2-core machine, and 9% slower with an expert pool, whose loader
  // threads need the cores (docs/performance.md; ModelLoadOptions::poll picks).
  void set_poll(bool poll) { poll_ = poll; }
  bool poll() const { return poll_; }

 private:
  pthreadpool* pool_ = nullptr;  // null: run on the caller's thread
  int threads_ = 1;
  bool poll_ = true;
};

}  // namespace moert::core

#endif  // MOERT_CORE_THREAD_POOL_H_
