// core::ThreadPool: every index of a ParallelFor runs exactly once, whether idle workers
// poll for the next section or sleep at once, over many short sections in a row (a
// decode step's pattern), and a one-thread pool runs on the caller.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace moert::core {
namespace {

void ExpectEachIndexOnce(ThreadPool& pool) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{64}, size_t{1000}}) {
    for (int round = 0; round < 50; ++round) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, [&](size_t i) { hits[i].fetch_add(1, std::memory_order_relaxed); });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n " << n << " i " << i;
    }
  }
}

TEST(ThreadPool, PollingWorkersRunEachIndexOnce) {
  ThreadPool pool(2);
  EXPECT_TRUE(pool.poll());  // the default
  ExpectEachIndexOnce(pool);
}

TEST(ThreadPool, SleepingWorkersRunEachIndexOnce) {
  ThreadPool pool(2);
  pool.set_poll(false);
  EXPECT_FALSE(pool.poll());
  ExpectEachIndexOnce(pool);
  pool.set_poll(true);  // switched back between sections
  ExpectEachIndexOnce(pool);
}

TEST(ThreadPool, OneThreadRunsOnTheCaller) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.threads(), 1);
  EXPECT_EQ(pool.handle(), nullptr);
  const std::thread::id caller = std::this_thread::get_id();
  int ran = 0;
  pool.ParallelFor(5, [&](size_t) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    ++ran;
  });
  EXPECT_EQ(ran, 5);
}

}  // namespace
}  // namespace moert::core
