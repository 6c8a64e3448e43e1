// Expert reads held up on the loader's thread (LoaderOptions::before_read_for_testing):
// a gate that holds every read until the test opens it, a device that takes a fixed
// time per read, and a bounded poll, for the tests of deadlines and cancellation. The
// bounds are hang guards, never speed claims.
#ifndef MOERT_TESTS_COMMON_HELD_READS_H_
#define MOERT_TESTS_COMMON_HELD_READS_H_

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "experts/expert_directory.h"

namespace moert::test_util {

using ReadHook = std::function<void(const experts::ExpertInfo&)>;

inline constexpr auto kHangGuard = std::chrono::seconds(2);

// Holds the loader thread's reads until opened (each at most 10 s, so that a failing
// test still ends). Open it before the loader goes: its destructor waits for the read.
class ReadGate {
 public:
  ReadHook Hook() {
    return [this](const experts::ExpertInfo&) {
      std::unique_lock<std::mutex> lock(mu_);
      ++held_;
      cv_.notify_all();
      cv_.wait_for(lock, std::chrono::seconds(10), [&] { return open_; });
    };
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  // Waits (up to the hang guard) until reads were held `n` times.
  void AwaitHeld(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    ASSERT_TRUE(cv_.wait_for(lock, kHangGuard, [&] { return held_ >= n; }));
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int held_ = 0;
  bool open_ = false;
};

// A slow device: every read takes `ms` more.
inline ReadHook SlowReads(int ms) {
  return [ms](const experts::ExpertInfo&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  };
}

// Polls `done` until it holds (true) or the hang guard passes (false).
template <typename F>
bool Eventually(F done) {
  const auto until = std::chrono::steady_clock::now() + kHangGuard;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace moert::test_util

#endif  // MOERT_TESTS_COMMON_HELD_READS_H_
