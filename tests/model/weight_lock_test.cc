// Locking the dense weights in RAM (ModelLoadOptions::lock_weights, llama.cpp's
// --mlock): WeightLock locks and unlocks what it is given (the process's VmLck says so),
// a refused range leaves nothing locked and says why, and a model loaded with its
// weights locked computes bit for bit what an unlocked one does.
#include "model/weight_lock.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/greedy_run.h"
#include "common/oracle_file.h"
#include "model/model.h"

namespace moert::model {
namespace {

// The process's locked memory in bytes (VmLck of /proc/self/status), -1 when unknown.
int64_t LockedBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmLck:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

size_t Page() { return static_cast<size_t>(::sysconf(_SC_PAGESIZE)); }

// The sanitizers' runtimes intercept mlock and munlock as no-ops (VmLck never moves).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizerMlock = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitizerMlock = true;
#else
constexpr bool kSanitizerMlock = false;
#endif
#else
constexpr bool kSanitizerMlock = false;
#endif

// mlock the machine refuses outright (no RLIMIT_MEMLOCK room at all) cannot be tested.
bool CanLockAPage() {
  std::vector<uint8_t> probe(2 * Page());
  if (::mlock(probe.data(), Page()) != 0) return false;
  ::munlock(probe.data(), Page());
  return true;
}

TEST(WeightLockTest, LocksAndUnlocksItsRanges) {
  if (kSanitizerMlock) GTEST_SKIP() << "under a sanitizer mlock is a no-op";
  if (!CanLockAPage()) GTEST_SKIP() << "this process may not mlock (RLIMIT_MEMLOCK)";
  const int64_t before = LockedBytes();
  ASSERT_GE(before, 0) << "no VmLck in /proc/self/status";
  std::vector<uint8_t> a(4 * Page(), 1);
  std::vector<float> b(1000, 2.0f);
  {
    WeightLock lock;
    lock.Lock({{a.data(), a.size()}, {b.data(), b.size() * sizeof(float)}});
    ASSERT_EQ(lock.error(), "");
    EXPECT_EQ(lock.locked_bytes(), a.size() + b.size() * sizeof(float));
    // Whole pages: at least the four of `a`, at most a's five and b's two.
    EXPECT_GE(LockedBytes() - before, static_cast<int64_t>(4 * Page()));
    EXPECT_LE(LockedBytes() - before, static_cast<int64_t>(7 * Page()));
  }
  EXPECT_EQ(LockedBytes(), before);
}

TEST(WeightLockTest, ARefusedRangeLeavesNothingLockedAndSaysWhy) {
  if (kSanitizerMlock) GTEST_SKIP() << "under a sanitizer mlock is a no-op";
  if (!CanLockAPage()) GTEST_SKIP() << "this process may not mlock (RLIMIT_MEMLOCK)";
  const int64_t before = LockedBytes();
  std::vector<uint8_t> a(2 * Page(), 1);
  // A page that is no longer mapped: mlock refuses it (ENOMEM) with or without privilege.
  void* gone = ::mmap(nullptr, Page(), PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(gone, MAP_FAILED);
  ASSERT_EQ(::munmap(gone, Page()), 0);
  WeightLock lock;
  lock.Lock({{a.data(), a.size()}, {gone, Page()}});
  EXPECT_EQ(lock.locked_bytes(), 0u);
  EXPECT_NE(lock.error().find("mlock of " + std::to_string(Page()) + " bytes failed after " +
                              std::to_string(a.size()) + " locked"),
            std::string::npos)
      << lock.error();
  EXPECT_NE(lock.error().find("the weights stay unlocked"), std::string::npos) << lock.error();
  EXPECT_EQ(LockedBytes(), before);
}

TEST(WeightLockTest, ALockedModelComputesWhatAnUnlockedOneDoes) {
  if (kSanitizerMlock) GTEST_SKIP() << "under a sanitizer mlock is a no-op";
  if (!CanLockAPage()) GTEST_SKIP() << "this process may not mlock (RLIMIT_MEMLOCK)";
  const format::GgufFile& file = test_util::OracleFile("tiny-moe-shakespeare-q4_0.gguf");
  ModelLoadOptions options;
  options.threads = 2;
  auto plain = Model::Load(file, options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->memory_stats().locked_bytes, 0u);
  const int64_t before = LockedBytes();
  options.lock_weights = true;
  auto locked = Model::Load(file, options);
  ASSERT_TRUE(locked.ok()) << locked.status();
  const MemoryStats memory = (*locked)->memory_stats();
  if (!memory.lock_error.empty()) {
    // A limit below the model's weights: refused as a whole, and said.
    EXPECT_EQ(memory.locked_bytes, 0u);
    EXPECT_NE(memory.lock_error.find("RLIMIT_MEMLOCK"), std::string::npos) << memory.lock_error;
  } else {
    // Every dense weight of the tiny model: a few MB, locked page by page.
    EXPECT_GT(memory.locked_bytes, uint64_t{1} << 20);
    EXPECT_GE(LockedBytes() - before, static_cast<int64_t>(memory.locked_bytes));
  }
  const test_util::GreedyRun a = test_util::RunGreedy(**plain, 12, 6);
  const test_util::GreedyRun b = test_util::RunGreedy(**locked, 12, 6);
  EXPECT_TRUE(test_util::SameBits(a.prefill, b.prefill));
  EXPECT_TRUE(test_util::SameBits(a.decode, b.decode));
  EXPECT_EQ(a.tokens, b.tokens);
  locked->reset();
  EXPECT_EQ(LockedBytes(), before);
}

}  // namespace
}  // namespace moert::model
