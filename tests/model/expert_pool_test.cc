// The model with its routed experts in an expert pool (ModelLoadOptions with a memory
// budget): on the oracle models, pools of 25% and 50% of the expert bytes and the
// smallest pool that works (k experts: prefill then runs in expert subsets) give the
// same greedy tokens and the same logits, bit for bit, as fully resident experts, with
// direct and buffered reads. Failed loads fail the call cleanly and the next call
// works; a pool or budget too small is a clear load error; the hot set round-trips.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "experts/expert_cache.h"
#include "experts/loader.h"
#include "format/gguf.h"
#include "model/decoder.h"
#include "model/expert_pool_util.h"
#include "model/model.h"

namespace moert::model {
namespace {

using pool_test::File;
using pool_test::Generate;
using pool_test::Generation;
using pool_test::kDecodeSteps;
using pool_test::kPromptTokens;
using pool_test::Load;
using pool_test::Options;
using pool_test::Prompt;
using pool_test::Reference;
using test_util::SameBits;

struct PoolCase {
  std::string model;
  double fraction;  // 0: the smallest pool, k experts
  experts::IoMode io;
};

std::string CaseName(const ::testing::TestParamInfo<PoolCase>& test) {
  std::string name = test.param.model.find("q4_0") != std::string::npos ? "q4_0" : "q8_0";
  name += test.param.fraction == 0 ? "_k_experts"
                                   : "_" + std::to_string(static_cast<int>(test.param.fraction * 100)) +
                                         "pct";
  return name + "_" + std::string(experts::IoModeName(test.param.io));
}

class ExpertPoolTest : public ::testing::TestWithParam<PoolCase> {};

TEST_P(ExpertPoolTest, GreedyTokensAndLogitsMatchFullyResident) {
  const PoolCase& c = GetParam();
  const Generation& want = Reference(c.model);
  ASSERT_EQ(want.tokens.size(), size_t{kDecodeSteps});

  ModelLoadOptions options = Options();
  options.io_mode = c.io;
  if (c.fraction > 0) {
    options.expert_pool_fraction = c.fraction;
  } else {
    // Exactly the k = 2 experts one token needs: every prefill layer runs in subsets.
    const experts::ExpertDirectory dir =
        *experts::ExpertDirectory::Build(File(c.model), 4, 8, 256, 512);
    options.expert_pool_bytes = 2 * experts::ExpertCache::BlockBytes(dir.max_runtime_bytes(),
                                                                     64 << 10);
  }
  std::unique_ptr<Model> model = Load(c.model, options);
  ASSERT_NE(model, nullptr);
  const MemoryStats before = model->memory_stats();
  ASSERT_TRUE(before.expert_pool);
  EXPECT_EQ(before.pool.resident_experts, 0u);
  if (c.fraction > 0) {
    EXPECT_EQ(before.pool.capacity_experts, static_cast<uint64_t>(32 * c.fraction));
  } else {
    EXPECT_EQ(before.pool.capacity_experts, 2u);
  }

  const Generation got = Generate(*model);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_TRUE(SameBits(got.prefill, want.prefill)) << "prefill logits differ";
  EXPECT_TRUE(SameBits(got.decode, want.decode)) << "decode logits differ";

  const MemoryStats s = model->memory_stats();
  EXPECT_GT(s.pool.misses, 0u);
  EXPECT_GT(s.pool.evictions, 0u);  // every pool here is smaller than the experts used
  EXPECT_EQ(s.pool.failed_loads, 0u);
  EXPECT_EQ(s.pool.pinned_experts, 0u);
  EXPECT_LE(s.pool.used_bytes, s.pool.pool_bytes);
  EXPECT_LE(s.pool.peak_committed_bytes, s.pool.pool_bytes);
  EXPECT_EQ(s.budget_bytes,
            s.persistent_bytes + s.kv_cache_bytes + s.scratch_bytes + s.pool.pool_bytes);
  // Direct reads, or the fallback and why.
  if (c.io == experts::IoMode::kDirect && s.io_mode != "direct") {
    EXPECT_EQ(s.io_mode, "buffered");
    EXPECT_NE(s.io_fallback.find("O_DIRECT"), std::string::npos) << s.io_fallback;
    std::printf("%s: O_DIRECT refused here: %s\n", CaseName({c, 0}).c_str(),
                s.io_fallback.c_str());
  } else {
    EXPECT_EQ(s.io_mode, experts::IoModeName(c.io));
    EXPECT_EQ(s.io_fallback, "");
  }
  // The engine that reads (io_uring, or the pread pool and why); mmap mode issues no reads.
  if (c.io == experts::IoMode::kMmap) {
    EXPECT_EQ(s.io_engine, "");
  } else {
    EXPECT_TRUE(s.io_engine == "io_uring" || s.io_engine == "pread") << s.io_engine;
    EXPECT_EQ(s.io_engine == "pread", !s.io_engine_fallback.empty()) << s.io_engine_fallback;
  }
  std::printf("%s: %llu hits, %llu misses, %llu evictions, %.1f MiB read\n",
              CaseName({c, 0}).c_str(), static_cast<unsigned long long>(s.pool.hits),
              static_cast<unsigned long long>(s.pool.misses),
              static_cast<unsigned long long>(s.pool.evictions),
              static_cast<double>(s.pool.bytes_loaded) / (1 << 20));
}

std::vector<PoolCase> Cases() {
  std::vector<PoolCase> cases;
  for (const char* model : {"tiny-moe-shakespeare-q4_0.gguf", "tiny-moe-shakespeare-q8_0.gguf"}) {
    for (double fraction : {0.25, 0.5}) {
      for (experts::IoMode io : {experts::IoMode::kDirect, experts::IoMode::kBuffered}) {
        cases.push_back({model, fraction, io});
      }
    }
    cases.push_back({model, 0.0, experts::IoMode::kDirect});
    cases.push_back({model, 0.0, experts::IoMode::kMmap});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Oracle, ExpertPoolTest, ::testing::ValuesIn(Cases()), CaseName);

struct FaultCase {
  experts::LoaderFault fault;
  const char* message;
};

class ExpertPoolFaultTest : public ::testing::TestWithParam<FaultCase> {};

TEST_P(ExpertPoolFaultTest, FailsTheCallCleanlyAndTheNextOneWorks) {
  const std::string name = "tiny-moe-shakespeare-q4_0.gguf";
  const Generation& want = Reference(name);
  ModelLoadOptions options = Options();
  options.expert_pool_fraction = 0.25;
  std::unique_ptr<Model> model = Load(name, options);
  ASSERT_NE(model, nullptr);
  experts::ExpertCache* cache = dynamic_cast<DecoderModel&>(*model).expert_cache();
  ASSERT_NE(cache, nullptr);
  const std::vector<int32_t> prompt = Prompt();
  auto kv = model->NewKvCache(64);
  ASSERT_TRUE(kv.ok());
  std::vector<float> logits;
  if (GetParam().fault == experts::LoaderFault::kChecksumMismatch) {
    // Checksums come from the first loads; then every expert is read again.
    ASSERT_TRUE(model->Forward(prompt, kv->get(), LogitsFor::kAll, &logits).ok());
    (*kv)->Truncate(0);
    cache->EvictAll();
  }
  // Whichever experts of layer 2 the prompt needs, its first load fails.
  for (int e = 0; e < 8; ++e) cache->loader().InjectFault(2, e, GetParam().fault);
  absl::Status s = model->Forward(prompt, kv->get(), LogitsFor::kAll, &logits);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  const std::string message(s.message());
  EXPECT_NE(message.find("layer 2, expert "), std::string::npos) << message;
  EXPECT_NE(message.find("file offset"), std::string::npos) << message;
  EXPECT_NE(message.find(GetParam().message), std::string::npos) << message;
  EXPECT_EQ((*kv)->size(), 0);  // the KV cache is as it was
  const MemoryStats after_failure = model->memory_stats();
  EXPECT_EQ(after_failure.pool.failed_loads, 1u);
  EXPECT_EQ(after_failure.pool.pinned_experts, 0u);

  for (int e = 0; e < 8; ++e) cache->loader().InjectFault(2, e, GetParam().fault, 0);
  ASSERT_TRUE(model->Forward(prompt, kv->get(), LogitsFor::kAll, &logits).ok());
  EXPECT_TRUE(SameBits(logits, want.prefill));
  EXPECT_EQ((*kv)->size(), kPromptTokens);
}

INSTANTIATE_TEST_SUITE_P(
    Faults, ExpertPoolFaultTest,
    ::testing::Values(FaultCase{experts::LoaderFault::kShortRead, "short read"},
                      FaultCase{experts::LoaderFault::kIoError, "Input/output error"},
                      FaultCase{experts::LoaderFault::kChecksumMismatch, "checksum mismatch"}),
    [](const auto& test) {
      return std::string(test.param.fault == experts::LoaderFault::kShortRead ? "ShortRead"
                         : test.param.fault == experts::LoaderFault::kIoError ? "IoError"
                                                                              : "ChecksumMismatch");
    });

TEST(ExpertPool, PoolTooSmallForOneTokensExpertsIsALoadError) {
  ModelLoadOptions options = Options();
  options.expert_pool_bytes = 256 << 10;  // one Q4_0 expert (221184 bytes of pages)
  auto model = Model::Load(File("tiny-moe-shakespeare-q4_0.gguf"), options);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(model.status().message());
  EXPECT_NE(message.find("expert pool of 221184 bytes holds 1 experts (221184 bytes each)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("needs 2 experts"), std::string::npos) << message;
  EXPECT_NE(message.find("442368 bytes"), std::string::npos) << message;
}

TEST(ExpertPool, BudgetBelowThePersistentPartIsALoadError) {
  ModelLoadOptions options = Options();
  options.memory_budget_bytes = 1 << 20;
  auto model = Model::Load(File("tiny-moe-shakespeare-q4_0.gguf"), options);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(model.status().message());
  EXPECT_NE(message.find("memory budget of 1048576 bytes cannot hold the persistent weights ("),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("64 positions"), std::string::npos) << message;
}

TEST(ExpertPool, BudgetSizesThePool) {
  const std::string name = "tiny-moe-shakespeare-q8_0.gguf";
  ModelLoadOptions options = Options();
  options.expert_pool_fraction = 1.0;
  std::unique_ptr<Model> full = Load(name, options);
  ASSERT_NE(full, nullptr);
  const MemoryStats m = full->memory_stats();
  EXPECT_EQ(m.pool.capacity_experts, 32u);
  // The budget counts an expert's pages, not its 512 KiB block.
  const uint64_t charge = m.pool.charge_bytes;
  EXPECT_EQ(m.pool.block_bytes, 512u << 10);
  EXPECT_GT(charge, 384u << 10);
  EXPECT_LT(charge, 512u << 10);
  EXPECT_EQ(m.all_experts_bytes, 32u * charge);
  EXPECT_EQ(m.experts_per_token, 2u);
  // A budget that leaves room for 5 experts and a little more.
  const uint64_t fixed = m.persistent_bytes + m.kv_cache_bytes + m.scratch_bytes;
  options = Options();
  options.memory_budget_bytes = fixed + 5 * charge + 1000;
  std::unique_ptr<Model> model = Load(name, options);
  ASSERT_NE(model, nullptr);
  const MemoryStats s = model->memory_stats();
  EXPECT_EQ(s.budget_bytes, options.memory_budget_bytes);
  EXPECT_EQ(s.pool.capacity_experts, 5u);
  const Generation got = Generate(*model);
  EXPECT_EQ(got.tokens, Reference(name).tokens);
  EXPECT_TRUE(SameBits(got.decode, Reference(name).decode));
  // Pool and budget together must fit.
  options.expert_pool_bytes = 6 * charge;
  auto too_big = Model::Load(File(name), options);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("cannot hold an expert pool of " +
                                            std::to_string(6 * charge) + " bytes"),
            std::string::npos)
      << too_big.status();
}

TEST(ExpertPool, ReferencePathAndFloatExpertsAreRejected) {
  ModelLoadOptions options = Options();
  options.expert_pool_fraction = 0.5;
  options.quantized_kernels = false;
  auto model = Model::Load(File("tiny-moe-shakespeare-q4_0.gguf"), options);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(model.status().message().find("quantized_kernels"), std::string::npos);
  options.quantized_kernels = true;
  model = Model::Load(File("tiny-moe-shakespeare-f32.gguf"), options);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(model.status().message().find("blk.0.ffn_gate_exps.weight"), std::string::npos)
      << model.status();
  options.expert_pool_fraction = 1.5;
  model = Model::Load(File("tiny-moe-shakespeare-q4_0.gguf"), options);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ExpertPool, HotSetIsSavedAndLoadedFirst) {
  const std::string name = "tiny-moe-shakespeare-q4_0.gguf";
  const std::string dir =
      ::testing::TempDir() + "/moert-expert-pool-hot-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ModelLoadOptions options = Options();
  options.expert_pool_fraction = 0.5;
  options.hot_set = true;
  options.hot_set_path = dir + "/tiny.moert-hot";
  {
    std::unique_ptr<Model> model = Load(name, options);
    ASSERT_NE(model, nullptr);
    EXPECT_EQ(model->memory_stats().hot_set_preloaded, 0u);  // none yet
    Generate(*model);
    ASSERT_TRUE(model->SaveHotSet().ok());
  }
  ASSERT_TRUE(std::filesystem::exists(options.hot_set_path));
  std::unique_ptr<Model> model = Load(name, options);
  ASSERT_NE(model, nullptr);
  const MemoryStats loaded = model->memory_stats();
  EXPECT_EQ(loaded.hot_set_preloaded, 16u);  // the pool's size
  EXPECT_EQ(loaded.pool.resident_experts, 16u);
  EXPECT_EQ(loaded.pool.misses, 0u);
  const Generation got = Generate(*model);
  EXPECT_TRUE(SameBits(got.decode, Reference(name).decode));
  EXPECT_GT(model->memory_stats().pool.hits, 0u);
  std::filesystem::remove_all(dir);
}

// Without hot_set_path the hot set lives in the cache directory, under hot/, named
// after the model file; with no cache directory at all there is none, and saving it
// writes nothing.
TEST(ExpertPool, HotSetGoesToTheCacheDirectoryOrNowhere) {
  const std::string dir =
      ::testing::TempDir() + "/moert-expert-pool-cache-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  ModelLoadOptions options = Options();
  options.expert_pool_fraction = 0.5;
  options.hot_set = true;
  options.cache_dir = dir;
  {
    std::unique_ptr<Model> model = Load("tiny-moe-shakespeare-q4_0.gguf", options);
    ASSERT_NE(model, nullptr);
    EXPECT_EQ(model->memory_stats().hot_set_path,
              dir + "/hot/tiny-moe-shakespeare-q4_0.gguf.moert-hot");
    Generate(*model);
    ASSERT_TRUE(model->SaveHotSet().ok());
    EXPECT_TRUE(std::filesystem::exists(model->memory_stats().hot_set_path));
    EXPECT_EQ(model->memory_stats().hot_set_error, "");
  }
  std::filesystem::remove_all(dir);

  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string saved_xdg = xdg != nullptr ? xdg : "", saved_home = home != nullptr ? home : "";
  ::unsetenv("XDG_CACHE_HOME");
  ::unsetenv("HOME");
  options.cache_dir.clear();
  std::unique_ptr<Model> model = Load("tiny-moe-shakespeare-q4_0.gguf", options);
  if (xdg != nullptr) ::setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1);
  if (home != nullptr) ::setenv("HOME", saved_home.c_str(), 1);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->memory_stats().hot_set_path, "");
  Generate(*model);
  EXPECT_TRUE(model->SaveHotSet().ok());
}

}  // namespace
}  // namespace moert::model
