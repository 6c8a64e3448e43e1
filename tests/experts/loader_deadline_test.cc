// The loader's deadlines and its cancellation: a wait whose read is held up past the
// deadline reads the expert itself (the same bytes, counted), and the late read never
// writes the destination; a queued load past the deadline leaves the queue; a full
// queue past the deadline hands the load back; destroying a loader or a cache with a
// held-up read and a long queue, and dropping a cache's queued prefetches, return
// promptly. The 2 s bounds are hang guards, not speed claims.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "common/held_reads.h"
#include "experts/expert_cache.h"
#include "experts/loader.h"
#include "experts/test_model.h"

namespace moert::experts {
namespace {

using test_util::Eventually;
using test_util::kHangGuard;
using test_util::ReadGate;
using test_util::ReadHook;
using test_util::SlowReads;
using testing::Block;
using testing::TestModel;
using testing::ViewBytes;
using Clock = std::chrono::steady_clock;

TestModel Model(const std::string& name) {
  return testing::WriteTestModel(testing::TempDir(name), "m.gguf");
}

// A loader whose reads the gate holds, of a fresh test model.
class LoaderDeadline : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = testing::WriteTestModel(testing::TempDir("deadline"), "m.gguf");
    dir_ = std::make_unique<ExpertDirectory>(model_.Directory());
  }
  // The gate opens before the loader goes (its destructor waits for the held read).
  void TearDown() override { gate_.Open(); }

  Loader* Open(uint32_t deadline_ms, IoMode mode = IoMode::kBuffered, size_t queue_capacity = 16) {
    // One I/O thread: the gate holding its read holds every load behind it.
    auto loader = Loader::Create(*dir_, {.mode = mode,
                                         .queue_capacity = queue_capacity,
                                         .io_threads = 1,
                                         .wait_deadline_ms = deadline_ms,
                                         .before_read_for_testing = gate_.Hook()});
    EXPECT_TRUE(loader.ok()) << loader.status();
    if (loader.ok()) loader_ = std::move(*loader);
    return loader_.get();
  }
  const ExpertInfo& Info(int layer, int expert) const { return dir_->info(layer, expert); }

  TestModel model_;
  std::unique_ptr<ExpertDirectory> dir_;
  ReadGate gate_;
  std::unique_ptr<Loader> loader_;
};

TEST_F(LoaderDeadline, AWaitPastTheDeadlineReadsHereAndTheLateReadIsDropped) {
  const std::vector<uint8_t> want = model_.ExpectedBlock(1, 2);
  Loader* loader = Open(50);
  ASSERT_NE(loader, nullptr);
  Block block(Info(1, 2).runtime_bytes);
  const Loader::Ticket ticket = loader->Submit(Info(1, 2), block.data, std::nullopt);
  gate_.AwaitHeld(1);
  const LoadResult r = loader->Wait(ticket);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(block.bytes(), want);  // bit for bit what the I/O thread would have written
  EXPECT_EQ(loader->stats().wait_timeouts, 1u);

  // The block is the caller's again: the held-up read, let go, must not touch it.
  std::memset(block.data, 0xab, block.size);
  gate_.Open();
  ASSERT_TRUE(Eventually([&] { return loader->stats().late_reads_dropped == 1; }));
  EXPECT_EQ(block.bytes(), std::vector<uint8_t>(block.size, 0xab));
  const LoaderStats s = loader->stats();
  EXPECT_EQ(s.loads, 1u);  // the one read here
  EXPECT_EQ(s.failed_loads, 0u);

  // And the loader goes on as before.
  const LoadResult next = loader->Wait(loader->Submit(Info(1, 2), block.data, r.checksum));
  EXPECT_TRUE(next.status.ok()) << next.status;
  EXPECT_FALSE(next.timed_out);
  EXPECT_EQ(block.bytes(), want);
}

TEST_F(LoaderDeadline, AQueuedLoadPastTheDeadlineLeavesTheQueue) {
  Loader* loader = Open(50);
  ASSERT_NE(loader, nullptr);
  Block first(Info(0, 0).runtime_bytes);
  Block second(Info(0, 1).runtime_bytes);
  const Loader::Ticket a = loader->Submit(Info(0, 0), first.data, std::nullopt);
  gate_.AwaitHeld(1);
  const Loader::Ticket b = loader->Submit(Info(0, 1), second.data, std::nullopt);
  EXPECT_EQ(loader->queued(), 1u);
  const LoadResult rb = loader->Wait(b);
  ASSERT_TRUE(rb.status.ok()) << rb.status;
  EXPECT_TRUE(rb.timed_out);
  EXPECT_EQ(loader->queued(), 0u);  // read here, not again by the I/O thread
  EXPECT_EQ(second.bytes(), model_.ExpectedBlock(0, 1));
  gate_.Open();
  // The first load was let go before its deadline passed.
  const LoadResult ra = loader->Wait(a);
  ASSERT_TRUE(ra.status.ok()) << ra.status;
  EXPECT_EQ(first.bytes(), model_.ExpectedBlock(0, 0));
  EXPECT_EQ(loader->stats().late_reads_dropped, 0u);
}

TEST_F(LoaderDeadline, GivingUpIsDeadlineExceededNamingTheExpert) {
  Loader* loader = Open(20, IoMode::kMmap);
  ASSERT_NE(loader, nullptr);
  Block block(Info(1, 3).runtime_bytes);
  const LoadResult r =
      loader->Wait(loader->Submit(Info(1, 3), block.data, std::nullopt), OnDeadline::kGiveUp);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDeadlineExceeded) << r.status;
  EXPECT_NE(r.status.message().find("layer 1, expert 3"), std::string::npos) << r.status;
  EXPECT_NE(r.status.message().find(model_.path), std::string::npos) << r.status;
  EXPECT_NE(r.status.message().find("20 ms"), std::string::npos) << r.status;
}

TEST_F(LoaderDeadline, AFullQueuePastTheDeadlineHandsTheLoadBack) {
  Loader* loader = Open(50, IoMode::kBuffered, /*queue_capacity=*/1);
  ASSERT_NE(loader, nullptr);
  std::vector<std::unique_ptr<Block>> blocks;
  std::vector<Loader::Ticket> tickets;
  for (int e = 0; e < 3; ++e) {
    blocks.push_back(std::make_unique<Block>(Info(0, e).runtime_bytes));
    tickets.push_back(loader->Submit(Info(0, e), blocks.back()->data, std::nullopt));
    if (e == 0) gate_.AwaitHeld(1);
  }
  // The third found the queue full for the whole deadline.
  EXPECT_EQ(loader->stats().wait_timeouts, 1u);
  EXPECT_EQ(loader->queued(), 1u);
  const LoadResult r = loader->Wait(tickets[2]);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(blocks[2]->bytes(), model_.ExpectedBlock(0, 2));
  EXPECT_EQ(loader->stats().wait_timeouts, 1u);  // counted once
  gate_.Open();
  for (int e = 0; e < 2; ++e) {
    const LoadResult done = loader->Wait(tickets[static_cast<size_t>(e)]);
    ASSERT_TRUE(done.status.ok()) << done.status;
    EXPECT_EQ(blocks[static_cast<size_t>(e)]->bytes(), model_.ExpectedBlock(0, e));
  }
}

TEST(LoaderDestroy, WithAHeldUpReadAndALongQueueIsPrompt) {
  const TestModel model = Model("destroy");
  const ExpertDirectory dir = model.Directory();
  auto loader = Loader::Create(dir, {.mode = IoMode::kBuffered,
                                     .queue_capacity = 64,
                                     .before_read_for_testing = SlowReads(300)});
  ASSERT_TRUE(loader.ok()) << loader.status();
  std::vector<std::unique_ptr<Block>> blocks;
  for (int i = 0; i < 40; ++i) {  // 12 s of reads, were they all made
    const ExpertInfo& info = dir.info(i % 2, (i / 2) % 4);
    blocks.push_back(std::make_unique<Block>(info.runtime_bytes));
    (*loader)->Submit(info, blocks.back()->data, std::nullopt, /*urgent=*/i % 3 == 0);
  }
  ASSERT_TRUE(Eventually([&] { return (*loader)->queued() < 40; }));  // one is being read
  const auto start = Clock::now();
  loader->reset();
  EXPECT_LT(Clock::now() - start, kHangGuard);
}

// A cache that holds all 8 experts, over a loader whose reads `hook` holds up.
std::unique_ptr<ExpertCache> HeldCache(const TestModel& model, ReadHook hook,
                                       uint32_t deadline_ms = 1000) {
  ExpertCacheOptions options;
  options.pool_bytes = 8 * (128 << 10);
  options.loader.mode = IoMode::kBuffered;
  options.loader.io_threads = 1;  // the held read holds every load behind it
  options.loader.wait_deadline_ms = deadline_ms;
  options.loader.before_read_for_testing = std::move(hook);
  auto cache = ExpertCache::Create(model.Directory(), options);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? std::move(*cache) : nullptr;
}

// A cache whose reads the gate holds until the end of the test.
class ExpertCacheDeadline : public ::testing::Test {
 protected:
  void TearDown() override { gate_.Open(); }  // before the cache goes
  ExpertCache* Open(const std::string& name, uint32_t deadline_ms = 1000) {
    model_ = Model(name);
    cache_ = HeldCache(model_, gate_.Hook(), deadline_ms);
    return cache_.get();
  }

  TestModel model_;
  ReadGate gate_;
  std::unique_ptr<ExpertCache> cache_;
};

TEST_F(ExpertCacheDeadline, DroppingQueuedPrefetchesDuringAHeldUpReadIsPrompt) {
  ExpertCache* cache = Open("cancel");
  ASSERT_NE(cache, nullptr);
  for (int l = 0; l < 2; ++l) {
    for (int e = 0; e < 4; ++e) {
      ASSERT_EQ(cache->Prefetch(l, e), ExpertCache::PrefetchResult::kStarted);
    }
  }
  gate_.AwaitHeld(1);
  EXPECT_EQ(cache->loader().queued(), 7u);
  const auto start = Clock::now();
  EXPECT_EQ(cache->CancelQueuedLoads(), 7u);
  EXPECT_LT(Clock::now() - start, kHangGuard);
  const ExpertCacheStats s = cache->stats();
  EXPECT_EQ(s.prefetch_cancelled, 7u);
  EXPECT_EQ(s.loads_in_flight, 1u);  // the read held up
  EXPECT_EQ(s.used_bytes, ExpertCache::ChargeBytes(cache->directory().info(0, 0).runtime_bytes));
  EXPECT_EQ(cache->loader().queued(), 0u);
  // The one in flight still lands; everything else loads on demand as usual.
  gate_.Open();
  cache->Drain();
  EXPECT_TRUE(cache->IsResident(0, 0));
  auto view = cache->Acquire(1, 3);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(ViewBytes(*view, cache->directory().info(1, 3).runtime_bytes),
            model_.ExpectedBlock(1, 3));
  cache->Release(1, 3);
}

TEST_F(ExpertCacheDeadline, AcquirePastTheDeadlineReadsHereBitForBit) {
  ExpertCache* cache = Open("acquire", /*deadline_ms=*/20);
  ASSERT_NE(cache, nullptr);
  const ExpertInfo& info = cache->directory().info(0, 2);
  // A prefetch held up on the I/O thread, then the layer needs the expert.
  ASSERT_EQ(cache->Prefetch(0, 2), ExpertCache::PrefetchResult::kStarted);
  auto view = cache->Acquire(0, 2);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(ViewBytes(*view, info.runtime_bytes), model_.ExpectedBlock(0, 2));
  cache->Release(0, 2);
  // A miss queued behind the held read.
  auto miss = cache->Acquire(1, 1);
  ASSERT_TRUE(miss.ok()) << miss.status();
  EXPECT_EQ(ViewBytes(*miss, cache->directory().info(1, 1).runtime_bytes),
            model_.ExpectedBlock(1, 1));
  cache->Release(1, 1);
  ExpertCacheStats s = cache->stats();
  EXPECT_EQ(s.load_timeouts, 2u);
  EXPECT_EQ(s.failed_loads, 0u);
  EXPECT_EQ(s.loads, 2u);
  EXPECT_EQ(s.prefetch_late, 1u);
  EXPECT_EQ(s.resident_experts, 2u);

  // A prefetch nobody waits for is dropped at its deadline by Drain: its block is free.
  ASSERT_EQ(cache->Prefetch(1, 2), ExpertCache::PrefetchResult::kStarted);
  cache->Drain();
  s = cache->stats();
  EXPECT_EQ(s.load_timeouts, 3u);
  EXPECT_FALSE(cache->IsResident(1, 2));
  EXPECT_EQ(s.loads_in_flight, 0u);
  EXPECT_EQ(s.resident_experts, 2u);
  EXPECT_EQ(s.used_bytes,
            2 * ExpertCache::ChargeBytes(cache->directory().info(0, 0).runtime_bytes));
}

TEST(ExpertCacheDestroy, WithAHeldUpReadAndQueuedPrefetchesIsPrompt) {
  const TestModel model = Model("cache-destroy");
  std::unique_ptr<ExpertCache> cache = HeldCache(model, SlowReads(300));
  ASSERT_NE(cache, nullptr);
  for (int l = 0; l < 2; ++l) {
    for (int e = 0; e < 4; ++e) cache->Prefetch(l, e);
  }
  ASSERT_TRUE(Eventually([&] { return cache->loader().queued() < 8; }));  // one is being read
  const auto start = Clock::now();
  cache.reset();
  EXPECT_LT(Clock::now() - start, kHangGuard);
}

}  // namespace
}  // namespace moert::experts
