// Prefetch of predicted experts (pipeline/prefetcher.h) on the oracle models with an
// expert pool and the residency penalty off: greedy tokens and logits are bit for bit
// those of prefetch off (prefill and decode, pools of 25% and of k experts, where
// prefetch must back off); with a slow loader, prefetched loads are used (counters, not
// time); loader faults, a failed call and destroying the model with loads in flight
// neither hang (a watchdog aborts after a bound) nor leave experts pinned.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/greedy_run.h"
#include "common/oracle_file.h"
#include "core/strings.h"
#include "experts/expert_cache.h"
#include "experts/loader.h"
#include "format/gguf.h"
#include "model/decoder.h"
#include "model/model.h"
#include "model/perplexity.h"
#include "pipeline/prefetcher.h"
#include "tokenizer/tokenizer.h"

namespace moert::model {
namespace {

const std::string kModels = std::string(MOERT_SHARED_DIR) + "/models/";
constexpr int kPromptTokens = 48;
constexpr int kDecodeSteps = 12;

// Aborts the process when a test runs past its bound (a deadlock is a failure, not a
// hang of the suite).
class Watchdog {
 public:
  explicit Watchdog(int seconds)
      : thread_([this, seconds] {
          std::unique_lock<std::mutex> lock(mu_);
          if (!cv_.wait_for(lock, std::chrono::seconds(seconds), [&] { return done_; })) {
            std::fprintf(stderr, "watchdog: test still running after %d s\n", seconds);
            std::abort();
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

const format::GgufFile& File(const std::string& name) { return test_util::OracleFile(name); }

ModelLoadOptions Options(bool prefetch, double fraction) {
  ModelLoadOptions options;
  options.threads = 2;
  options.kv_cache_positions = 64;
  options.router.alpha = 0;  // residency must not feed routing here
  options.prefetch = prefetch;
  options.prefetch_depth = 1;
  if (fraction > 0) options.expert_pool_fraction = fraction;
  return options;
}

// The smallest pool: the k = 2 experts one token needs (too small for two slots).
uint64_t KExpertsPool(const std::string& name) {
  const experts::ExpertDirectory dir = *experts::ExpertDirectory::Build(File(name), 4, 8, 256, 512);
  return 2 * experts::ExpertCache::BlockBytes(dir.max_runtime_bytes(), 64 << 10);
}

std::unique_ptr<Model> Load(const std::string& name, const ModelLoadOptions& options) {
  auto model = Model::Load(File(name), options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

using test_util::Argmax;
using test_util::SameBits;
using Generation = test_util::GreedyRun;

std::vector<int32_t> Prompt() { return test_util::SpreadPrompt(kPromptTokens); }

// A prefill batch, then greedy decoding one token at a time.
Generation Generate(Model& model) {
  return test_util::RunGreedy(model, kPromptTokens, kDecodeSteps);
}

// One line of a model's expert pool and prefetcher counters for the test log (the
// tests that print them assert on some; the rest are for reading).
void PrintPoolStats(const std::string& label, const MemoryStats& s) {
  const auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
  std::printf("%s: precision %.3f recall %.3f, %llu prefetches, %llu hidden, %llu late, "
              "%llu unused, %llu cancelled, %llu backed off; %llu misses, %llu streamed "
              "(%llu done before their turn); hits %llu/%llu\n",
              label.c_str(), s.prefetcher.precision(), s.prefetcher.recall(), u(s.pool.prefetches),
              u(s.pool.loads_hidden), u(s.pool.prefetch_late), u(s.pool.prefetch_unused),
              u(s.pool.prefetch_cancelled), u(s.prefetcher.backed_off), u(s.pool.misses),
              u(s.pool.streamed), u(s.pool.streamed_hidden), u(s.pool.hits),
              u(s.pool.hits + s.pool.misses));
}

struct PrefetchCase {
  std::string model;
  double fraction;  // 0: the k-experts pool
  int protect_steps;  // ExpertCacheOptions::prefetch_protect_steps
};

class PrefetchTest : public ::testing::TestWithParam<PrefetchCase> {};

TEST_P(PrefetchTest, OutputsMatchPrefetchOff) {
  Watchdog watchdog(300);
  const PrefetchCase& c = GetParam();
  ModelLoadOptions off = Options(false, c.fraction);
  ModelLoadOptions on = Options(true, c.fraction);
  if (c.fraction == 0) off.expert_pool_bytes = on.expert_pool_bytes = KExpertsPool(c.model);
  on.expert_cache.prefetch_protect_steps = c.protect_steps;
  std::unique_ptr<Model> model_off = Load(c.model, off);
  std::unique_ptr<Model> model_on = Load(c.model, on);
  ASSERT_NE(model_off, nullptr);
  ASSERT_NE(model_on, nullptr);
  const Generation want = Generate(*model_off);
  const Generation got = Generate(*model_on);
  ASSERT_EQ(want.tokens.size(), size_t{kDecodeSteps});
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_TRUE(SameBits(got.prefill, want.prefill)) << "prefill logits differ";
  EXPECT_TRUE(SameBits(got.decode, want.decode)) << "decode logits differ";

  const MemoryStats s = model_on->memory_stats();
  EXPECT_TRUE(s.prefetch);
  EXPECT_FALSE(model_off->memory_stats().prefetch);
  EXPECT_EQ(model_off->memory_stats().pool.prefetches, 0u);
  // Every step scores a prediction for layers 1..3.
  EXPECT_EQ(s.prefetcher.predictions, uint64_t{3} * (1 + kDecodeSteps));
  EXPECT_GT(s.prefetcher.predicted, 0u);
  EXPECT_LE(s.prefetcher.correct, s.prefetcher.predicted);
  EXPECT_LE(s.prefetcher.correct, s.prefetcher.used);
  EXPECT_EQ(s.pool.pinned_experts, 0u);
  EXPECT_EQ(s.pool.failed_loads, 0u);
  EXPECT_LE(s.pool.loads_hidden + s.pool.prefetch_late, s.pool.prefetches);
  if (c.fraction == 0) {
    // No room for two slots: prefetch backs off and nothing is read ahead.
    EXPECT_EQ(s.pool.prefetches, 0u);
    EXPECT_EQ(s.prefetcher.issued, 0u);
    EXPECT_GT(s.prefetcher.backed_off, 0u);
  } else {
    // With the lazy window protected, a pool that the last steps' experts fill backs
    // off; protecting only this step's experts, it reads ahead.
    if (c.protect_steps == 0) {
      EXPECT_GT(s.prefetcher.issued, 0u);
    }
    EXPECT_EQ(s.prefetcher.issued, s.pool.prefetches);
  }
  const std::string label =
      StrCat(c.model, " ", c.fraction * 100, "% protect ", c.protect_steps, ", prefetch ");
  PrintPoolStats(label + "on", s);
  PrintPoolStats(label + "off", model_off->memory_stats());
}

INSTANTIATE_TEST_SUITE_P(
    Oracle, PrefetchTest,
    ::testing::Values(PrefetchCase{"tiny-moe-shakespeare-q4_0.gguf", 0.25, 2},
                      PrefetchCase{"tiny-moe-shakespeare-q8_0.gguf", 0.25, 2},
                      PrefetchCase{"tiny-moe-shakespeare-q4_0.gguf", 0.25, 0},
                      PrefetchCase{"tiny-moe-shakespeare-q8_0.gguf", 0.25, 0},
                      PrefetchCase{"tiny-moe-shakespeare-q4_0.gguf", 0.5, 2},
                      PrefetchCase{"tiny-moe-shakespeare-q4_0.gguf", 0.5, 0},
                      PrefetchCase{"tiny-moe-shakespeare-q4_0.gguf", 0, 2},
                      PrefetchCase{"tiny-moe-shakespeare-q8_0.gguf", 0, 0}),
    [](const auto& test) {
      std::string name = test.param.model.find("q4_0") != std::string::npos ? "q4_0" : "q8_0";
      return name +
             (test.param.fraction == 0
                  ? "_k_experts"
                  : "_" + std::to_string(static_cast<int>(test.param.fraction * 100)) + "pct") +
             "_protect" + std::to_string(test.param.protect_steps);
    });

// The speculation gate: open until a step's reads kept the loader's threads busy for
// 90% of it, then closed until a step below 60% (its own reads would otherwise reopen
// and close it every other step).
TEST(Prefetch, SpeculationGateClosesOnBusyReadsWithHysteresis) {
  pipeline::SpeculationGate gate;
  EXPECT_TRUE(gate.open());
  EXPECT_TRUE(gate.Update(0.0));
  EXPECT_TRUE(gate.Update(0.89));
  EXPECT_FALSE(gate.Update(0.9));
  EXPECT_FALSE(gate.Update(0.75));  // between the thresholds: stays as it was
  EXPECT_FALSE(gate.Update(0.6));
  EXPECT_TRUE(gate.Update(0.59));
  EXPECT_TRUE(gate.Update(0.75));  // between the thresholds again: stays open
  EXPECT_FALSE(gate.Update(1.0));
  EXPECT_FALSE(gate.open());
  pipeline::SpeculationGate custom(0.5, 0.2);
  EXPECT_FALSE(custom.Update(0.5));
  EXPECT_FALSE(custom.Update(0.3));
  EXPECT_TRUE(custom.Update(0.1));
}

// Which leading ranks speculation may keep to while the reads are busy: those right at
// least min_precision of the time over at least min_samples scored predictions, stopping
// at the first that is not; old counts fade (halved past 4096).
TEST(Prefetch, RankPrecisionTrustsLeadingRanksThatAreNearlyAlwaysRight) {
  pipeline::RankPrecision ranks;
  EXPECT_EQ(ranks.Trusted(2, 0.9, 16), 0);  // nothing scored yet
  for (int i = 0; i < 20; ++i) {
    ranks.Record(0, true);
    ranks.Record(1, i % 10 != 0);  // 90%
    ranks.Record(2, i % 2 == 0);   // 50%
    ranks.Record(3, true);         // right, but behind a rank that is not
  }
  EXPECT_EQ(ranks.Trusted(8, 0.9, 16), 2);
  EXPECT_EQ(ranks.Trusted(1, 0.9, 16), 1);   // the limit
  EXPECT_EQ(ranks.Trusted(8, 0.9, 32), 0);   // too few samples
  EXPECT_EQ(ranks.Trusted(8, 0.95, 16), 1);  // rank 1 is below 95%
  EXPECT_EQ(ranks.Trusted(8, 0.5, 16), 4);
  ranks.Record(-1, true);  // ignored, as are ranks past the table
  ranks.Record(pipeline::RankPrecision::kMaxRanks, true);
  EXPECT_EQ(ranks.Trusted(8, 0.9, 16), 2);
  // Rank 0 turns wrong: after enough misses its precision falls below 90%.
  for (int i = 0; i < 3; ++i) ranks.Record(0, false);
  EXPECT_EQ(ranks.Trusted(8, 0.9, 16), 0);
  // Past 4096 a rank's counts are halved, so new outcomes weigh more.
  pipeline::RankPrecision fading;
  for (int i = 0; i < 4096; ++i) fading.Record(0, false);
  EXPECT_EQ(fading.Trusted(1, 0.5, 16), 0);
  for (int i = 0; i < 4097 * 2; ++i) fading.Record(0, true);
  EXPECT_EQ(fading.Trusted(1, 0.9, 16), 1);
}

TEST(Prefetch, SlowLoaderPrefetchedLoadsAreUsed) {
  Watchdog watchdog(300);
  const std::string name = "tiny-moe-shakespeare-q4_0.gguf";
  ModelLoadOptions options = Options(true, 0.25);
  options.expert_cache.prefetch_protect_steps = 0;  // read ahead in this small pool
  std::unique_ptr<Model> model = Load(name, options);
  ASSERT_NE(model, nullptr);
  experts::ExpertCache* cache = dynamic_cast<DecoderModel&>(*model).expert_cache();
  ASSERT_NE(cache, nullptr);
  cache->loader().set_delay_for_testing(2000);  // 2 ms per load: flash, not page cache
  const Generation g = Generate(*model);
  EXPECT_EQ(g.tokens.size(), size_t{kDecodeSteps});
  const MemoryStats s = model->memory_stats();
  EXPECT_GT(s.pool.prefetches, 0u);
  // Loads started before the layer that used them: finished in time (hidden) or not
  // (waited for, but started early): either way overlapped with compute.
  EXPECT_GT(s.pool.loads_hidden + s.pool.prefetch_late, 0u);
  // Each prefetch ends one way at most.
  EXPECT_LE(s.pool.loads_hidden + s.pool.prefetch_late + s.pool.prefetch_unused +
                s.pool.prefetch_cancelled + s.pool.loads_in_flight,
            s.pool.prefetches);
  // Every miss is one load (a late prefetch's load is its prefetch's), every prefetch
  // not cancelled one load.
  EXPECT_EQ(s.pool.loads, s.pool.misses - s.pool.prefetch_late + s.pool.prefetches -
                              s.pool.prefetch_cancelled - s.pool.loads_in_flight);
  // The layer's misses streamed: started together, each computed once in (some while
  // the ones after them still loaded, which this test cannot tell from a slow start).
  EXPECT_GT(s.pool.streamed, 0u);
  EXPECT_LE(s.pool.streamed_hidden, s.pool.streamed);
  EXPECT_LE(s.pool.streamed, s.pool.misses);
  EXPECT_EQ(s.pool.pinned_experts, 0u);
  PrintPoolStats("slow loader", s);
}

TEST(Prefetch, LoaderFaultsDuringPrefetchDoNotLeakOrHang) {
  Watchdog watchdog(300);
  const std::string name = "tiny-moe-shakespeare-q4_0.gguf";
  std::unique_ptr<Model> reference = Load(name, Options(false, 0.25));
  ASSERT_NE(reference, nullptr);
  const Generation want = Generate(*reference);
  ModelLoadOptions options = Options(true, 0.25);
  options.expert_cache.prefetch_protect_steps = 0;
  std::unique_ptr<Model> model = Load(name, options);
  ASSERT_NE(model, nullptr);
  experts::ExpertCache* cache = dynamic_cast<DecoderModel&>(*model).expert_cache();
  ASSERT_NE(cache, nullptr);
  cache->loader().set_delay_for_testing(500);
  const std::vector<int32_t> prompt = Prompt();
  auto kv = model->NewKvCache(64);
  ASSERT_TRUE(kv.ok());
  std::vector<float> logits;
  // Two failures per expert of layer 2: a failed prefetch falls back to a synchronous
  // load, which fails too (or a synchronous load fails and the retry is the next call):
  // the call may fail, cleanly.
  for (int e = 0; e < 8; ++e) cache->loader().InjectFault(2, e, experts::LoaderFault::kIoError, 2);
  absl::Status s = model->Forward(prompt, kv->get(), LogitsFor::kAll, &logits);
  if (!s.ok()) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_EQ((*kv)->size(), 0);
  } else {
    // A success is a right answer: the retries loaded every expert.
    EXPECT_EQ((*kv)->size(), static_cast<int>(prompt.size()));
    EXPECT_TRUE(SameBits(logits, want.prefill));
  }
  EXPECT_EQ(model->memory_stats().pool.pinned_experts, 0u);
  for (int e = 0; e < 8; ++e) cache->loader().InjectFault(2, e, experts::LoaderFault::kIoError, 0);
  (*kv)->Truncate(0);
  ASSERT_TRUE(model->Forward(prompt, kv->get(), LogitsFor::kAll, &logits).ok());
  EXPECT_TRUE(SameBits(logits, want.prefill));
  cache->Drain();
  const MemoryStats after = model->memory_stats();
  EXPECT_EQ(after.pool.pinned_experts, 0u);
  EXPECT_EQ(after.pool.loads_in_flight, 0u);
  EXPECT_GT(after.pool.failed_loads, 0u);
}

TEST(Prefetch, FailedPrefetchFallsBackToASynchronousLoad) {
  Watchdog watchdog(120);
  const std::string name = "tiny-moe-shakespeare-q4_0.gguf";
  std::unique_ptr<Model> model = Load(name, Options(true, 0.25));
  ASSERT_NE(model, nullptr);
  experts::ExpertCache* cache = dynamic_cast<DecoderModel&>(*model).expert_cache();
  ASSERT_NE(cache, nullptr);
  cache->loader().InjectFault(1, 3, experts::LoaderFault::kShortRead, 1);
  ASSERT_EQ(cache->Prefetch(1, 3), experts::ExpertCache::PrefetchResult::kStarted);
  EXPECT_TRUE(cache->IsLoading(1, 3));
  auto view = cache->Acquire(1, 3);  // waits, sees the failure, loads synchronously
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE(cache->IsResident(1, 3));
  cache->Release(1, 3);
  const experts::ExpertCacheStats s = cache->stats();
  EXPECT_EQ(s.prefetch_failed, 1u);
  EXPECT_EQ(s.failed_loads, 1u);
  EXPECT_EQ(s.loads, 2u);
  EXPECT_EQ(s.pinned_experts, 0u);
}

TEST(Prefetch, DestroyingTheModelWithLoadsInFlightDoesNotHang) {
  Watchdog watchdog(120);
  const std::string name = "tiny-moe-shakespeare-q4_0.gguf";
  std::unique_ptr<Model> model = Load(name, Options(true, 0.5));
  ASSERT_NE(model, nullptr);
  experts::ExpertCache* cache = dynamic_cast<DecoderModel&>(*model).expert_cache();
  ASSERT_NE(cache, nullptr);
  cache->loader().set_delay_for_testing(20000);
  int started = 0;
  for (int e = 0; e < 8; ++e) {
    started += cache->Prefetch(3, e) == experts::ExpertCache::PrefetchResult::kStarted ? 1 : 0;
  }
  EXPECT_GT(started, 0);
  EXPECT_GT(cache->stats().loads_in_flight, 0u);
  model.reset();
}

TEST(Prefetch, NeverEvictsPinnedOrRecentExperts) {
  Watchdog watchdog(120);
  const std::string name = "tiny-moe-shakespeare-q4_0.gguf";
  std::unique_ptr<Model> model = Load(name, Options(true, 0.25));  // 8 experts
  ASSERT_NE(model, nullptr);
  experts::ExpertCache* cache = dynamic_cast<DecoderModel&>(*model).expert_cache();
  ASSERT_NE(cache, nullptr);
  ASSERT_EQ(cache->capacity_experts(), 8u);
  // Fill the pool: layer 0's experts, all used this step, two still pinned.
  cache->BeginStep();
  for (int e = 0; e < 8; ++e) ASSERT_TRUE(cache->Acquire(0, e).ok());
  for (int e = 2; e < 8; ++e) cache->Release(0, e);
  EXPECT_EQ(cache->Prefetch(1, 0), experts::ExpertCache::PrefetchResult::kBackedOff);
  // Two steps later the unpinned ones are still in the lazy window.
  cache->BeginStep();
  cache->BeginStep();
  EXPECT_EQ(cache->Prefetch(1, 0), experts::ExpertCache::PrefetchResult::kBackedOff);
  // Past it, one of them may go (never a pinned one).
  cache->BeginStep();
  EXPECT_EQ(cache->Prefetch(1, 0), experts::ExpertCache::PrefetchResult::kStarted);
  cache->Drain();
  EXPECT_TRUE(cache->IsResident(1, 0));
  EXPECT_TRUE(cache->IsResident(0, 0));
  EXPECT_TRUE(cache->IsResident(0, 1));
  EXPECT_EQ(cache->stats().evictions, 1u);
  // The prefetched expert, not yet used, is not taken by another prefetch either.
  EXPECT_EQ(cache->Prefetch(1, 1), experts::ExpertCache::PrefetchResult::kStarted);
  cache->Drain();
  EXPECT_TRUE(cache->IsResident(1, 0));
  // Acquire of a finished prefetch is a hit and a hidden load.
  const uint64_t hits = cache->stats().hits;
  ASSERT_TRUE(cache->Acquire(1, 0).ok());
  cache->Release(1, 0);
  EXPECT_EQ(cache->stats().hits, hits + 1);
  EXPECT_EQ(cache->stats().loads_hidden, 1u);
  cache->Release(0, 0);
  cache->Release(0, 1);
  EXPECT_EQ(cache->stats().pinned_experts, 0u);
}

// With the residency penalty on, prefetch changes what is resident and so may change
// routing: the perplexity difference it makes, token by token (decode-like batches of
// one, where residency matters) over the first chunks of valid.txt, pool 25%. Reported,
// and bounded: prefetch must not cost the penalty's routing real quality.
TEST(PrefetchSlowTest, PerplexityDifferenceWithTheResidencyPenaltyOn) {
  Watchdog watchdog(600);
  const std::string name = "tiny-moe-shakespeare-q4_0.gguf";
  auto tok = tokenizer::Tokenizer::FromGguf(File(name));
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::ifstream in(kModels + "valid.txt");
  std::stringstream text;
  text << in.rdbuf();
  const std::vector<int32_t> tokens = tok->Encode(text.str(), true, false);
  PerplexityOptions ppl;
  ppl.n_ctx = 128;
  ppl.n_batch = 1;
  ppl.bos = 1;
  ppl.max_chunks = 2;
  double result[2] = {0, 0};
  for (int prefetch = 0; prefetch < 2; ++prefetch) {
    ModelLoadOptions options = Options(prefetch == 1, 0.25);
    options.router.alpha = 1;
    options.kv_cache_positions = 128;
    std::unique_ptr<Model> model = Load(name, options);
    ASSERT_NE(model, nullptr);
    auto r = ComputePerplexity(*model, tokens, ppl);
    ASSERT_TRUE(r.ok()) << r.status();
    result[prefetch] = r->ppl;
    EXPECT_EQ(model->memory_stats().pool.pinned_experts, 0u);
  }
  const double change = (result[1] - result[0]) / result[0];
  std::printf("residency penalty on (alpha 1), pool 25%%, 2 chunks of 128 one token at a time: "
              "PPL prefetch off %.4f, on %.4f (%+.3f%%)\n",
              result[0], result[1], 100 * change);
  EXPECT_TRUE(std::isfinite(result[0]) && std::isfinite(result[1]));
  EXPECT_LT(std::abs(change), 0.01);
}

TEST(Prefetch, DepthOutOfRangeIsALoadError) {
  ModelLoadOptions options = Options(true, 0.25);
  options.prefetch_depth = 4;  // the model has 4 layers
  auto model = Model::Load(File("tiny-moe-shakespeare-q4_0.gguf"), options);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(model.status().message()).find("prefetch depth"), std::string::npos);
}

}  // namespace
}  // namespace moert::model
