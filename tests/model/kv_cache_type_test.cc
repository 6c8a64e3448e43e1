// KV cache types through the model (ModelLoadOptions::kv_type_k / kv_type_v): the
// cache's bytes follow the types, logits stay close to the f32 cache's (f16 and q8_0
// round what is stored), a prefill batch still equals its tokens one at a time bit for
// bit, the budget counts the smaller cache, and OpenCL is refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "common/greedy_run.h"
#include "common/nmse.h"
#include "common/oracle_file.h"
#include "core/strings.h"
#include "model/model.h"

namespace moert::model {
namespace {

using backend::KvType;

ModelLoadOptions Options(KvType k, KvType v) {
  ModelLoadOptions options;
  options.threads = 2;
  options.kv_type_k = k;
  options.kv_type_v = v;
  return options;
}

std::unique_ptr<Model> Load(KvType k, KvType v, ModelLoadOptions options = {}) {
  options.threads = 2;
  options.kv_type_k = k;
  options.kv_type_v = v;
  auto model = Model::Load(test_util::OracleFile("tiny-moe-shakespeare-q8_0.gguf"), options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

TEST(KvCacheTypeTest, BytesFollowTheTypes) {
  // 4 layers, K and V rows of 128 values.
  struct Case {
    KvType k, v;
    uint64_t bytes_per_position;
  };
  for (const Case& c : {Case{KvType::kF32, KvType::kF32, 4 * (512 + 512)},
                        Case{KvType::kF16, KvType::kF16, 4 * (256 + 256)},
                        Case{KvType::kQ8_0, KvType::kQ8_0, 4 * (136 + 136)},
                        Case{KvType::kQ8_0, KvType::kF16, 4 * (136 + 256)}}) {
    auto model = Load(c.k, c.v);
    ASSERT_NE(model, nullptr);
    auto cache = model->NewKvCache(100);
    ASSERT_TRUE(cache.ok()) << cache.status();
    EXPECT_EQ((*cache)->bytes(), 100 * c.bytes_per_position)
        << backend::KvTypeName(c.k) << "/" << backend::KvTypeName(c.v);
  }
}

TEST(KvCacheTypeTest, LogitsStayCloseAndBatchesEqualSingleTokens) {
  auto reference = Load(KvType::kF32, KvType::kF32);
  ASSERT_NE(reference, nullptr);
  const test_util::GreedyRun want = test_util::RunGreedy(*reference, 48, 8);
  // Normalized mean squared error of the logits against the f32 cache's.
  for (auto [k, v, bound] : {std::tuple{KvType::kF16, KvType::kF16, 2e-5},
                             std::tuple{KvType::kQ8_0, KvType::kQ8_0, 2e-4},
                             std::tuple{KvType::kQ8_0, KvType::kF32, 2e-4}}) {
    auto model = Load(k, v);
    ASSERT_NE(model, nullptr);
    const test_util::GreedyRun got = test_util::RunGreedy(*model, 48, 8);
    const std::string name = StrCat(backend::KvTypeName(k), "/", backend::KvTypeName(v));
    ASSERT_EQ(got.prefill.size(), want.prefill.size()) << name;
    ASSERT_EQ(got.decode.size(), want.decode.size()) << name;
    const double prefill = test_util::Nmse(got.prefill, want.prefill);
    const double decode = test_util::Nmse(got.decode, want.decode);
    RecordProperty(StrCat("nmse_", backend::KvTypeName(k), "_", backend::KvTypeName(v)),
                   StrCat(prefill, " ", decode));
    EXPECT_LT(prefill, bound) << name;
    EXPECT_LT(decode, bound) << name;
    EXPECT_GT(prefill + decode, 0.0) << name << ": the rounding should show";
    EXPECT_EQ(got.tokens, want.tokens) << name;

    // The same positions one at a time: the same bits (rows are converted one by one).
    auto cache = model->NewKvCache(64);
    ASSERT_TRUE(cache.ok());
    const std::vector<int32_t> prompt = test_util::SpreadPrompt(48);
    std::vector<float> logits, last;
    for (int32_t t : prompt) {
      ASSERT_TRUE(model->Forward({&t, 1}, cache->get(), LogitsFor::kLast, &logits).ok());
    }
    last.assign(got.prefill.end() - static_cast<std::ptrdiff_t>(logits.size()), got.prefill.end());
    EXPECT_TRUE(test_util::SameBits(logits, last)) << name;
  }
}

TEST(KvCacheTypeTest, TheBudgetCountsTheSmallerCache) {
  ModelLoadOptions f32;
  f32.expert_pool_bytes = 2 << 20;
  f32.kv_cache_positions = 256;
  auto a = Load(KvType::kF32, KvType::kF32, f32);
  auto b = Load(KvType::kQ8_0, KvType::kQ8_0, f32);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->memory_stats().kv_cache_bytes, 256u * 4096);
  EXPECT_EQ(b->memory_stats().kv_cache_bytes, 256u * 1088);
  EXPECT_EQ(a->memory_stats().budget_bytes - b->memory_stats().budget_bytes,
            256u * (4096 - 1088));
}

TEST(KvCacheTypeTest, OpenClIsRefusedAutoStaysOnTheCpu) {
  ModelLoadOptions opencl = Options(KvType::kQ8_0, KvType::kF32);
  opencl.backend = Backend::kOpenCl;
  auto refused = Model::Load(test_util::OracleFile("tiny-moe-shakespeare-q8_0.gguf"), opencl);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented) << refused.status();
  EXPECT_NE(refused.status().message().find("q8_0 keys and f32 values runs on the CPU only"),
            std::string::npos)
      << refused.status();
  ModelLoadOptions automatic = Options(KvType::kF16, KvType::kF16);
  automatic.backend = Backend::kAuto;
  auto model = Model::Load(test_util::OracleFile("tiny-moe-shakespeare-q8_0.gguf"), automatic);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->backend_stats().backend, "CPU");
  EXPECT_NE((*model)->backend_stats().cpu_reason.find("f16 keys"), std::string::npos);
}

}  // namespace
}  // namespace moert::model
