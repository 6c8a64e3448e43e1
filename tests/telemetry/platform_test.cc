// The platform hooks: a replaced clock is what NowNs returns (and steady_clock again
// once reset), a replaced log sink receives each message at or above the minimum level
// with its level, from several threads at once, and the default sink comes back.
#include "telemetry/platform.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace moert::telemetry {
namespace {

std::atomic<uint64_t> g_fake_now{0};
uint64_t FakeClock() { return g_fake_now.load(); }

TEST(PlatformTest, AReplacedClockIsTheClock) {
  const uint64_t before = NowNs();
  g_fake_now = 42;
  SetClock(FakeClock);
  EXPECT_EQ(NowNs(), 42u);
  g_fake_now = 1000;
  EXPECT_EQ(NowNs(), 1000u);
  SetClock(nullptr);
  EXPECT_GE(NowNs(), before);
}

TEST(PlatformTest, TheSinkGetsWhatIsAtOrAboveTheMinimumLevel) {
  std::mutex mutex;
  std::vector<std::pair<LogLevel, std::string>> got;
  SetLogSink([&](LogLevel level, std::string_view message) {
    std::lock_guard<std::mutex> lock(mutex);
    got.emplace_back(level, std::string(message));
  });
  SetMinLogLevel(LogLevel::kWarning);
  EXPECT_FALSE(LogEnabled(LogLevel::kInfo));
  EXPECT_TRUE(LogEnabled(LogLevel::kError));
  Log(LogLevel::kInfo, "dropped");
  Log(LogLevel::kWarning, "kept");
  Log(LogLevel::kError, "also kept");
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].first, LogLevel::kWarning);
  EXPECT_EQ(got[0].second, "kept");
  EXPECT_EQ(got[1].first, LogLevel::kError);

  got.clear();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 100; ++i) Log(LogLevel::kError, "thread " + std::to_string(t));
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(got.size(), 400u);

  SetLogSink(nullptr);
  SetMinLogLevel(LogLevel::kInfo);
  got.clear();
  testing::internal::CaptureStderr();
  Log(LogLevel::kWarning, "to stderr");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "moert: warning: to stderr\n");
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(LogLevelName(LogLevel::kDebug), "debug");
}

}  // namespace
}  // namespace moert::telemetry
