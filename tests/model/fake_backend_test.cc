// The layer graph on a backend that lacks ops (a FakeBackend, tests/backend/
// fake_backend.h, as the model's device): the model runs, the ops the device does not
// have run on the CPU (backend/cpu_fallback.h), and the logits are the CPU's bit for
// bit (the fake runs its ops with the CPU's code), for fp32 and quantized weights,
// fully resident and with an expert pool, routed on the host and on the device.
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>

#include "backend/fake_backend.h"
#include "common/greedy_run.h"
#include "format/gguf.h"
#include "model/model.h"

namespace moert::model {
namespace {

using backend::Op;
using backend::testing::FakeBackend;
using backend::testing::FakeCounts;

const std::string kModels = std::string(MOERT_SHARED_DIR) + "/models/";

struct Case {
  const char* file;
  double pool;        // expert_pool_fraction (0: resident)
  std::set<Op> ops;   // what the fake device runs
  const char* name;
};

// Elementwise and matmuls only: attention, RoPE, the router's top-k, the fused expert
// op, biases and norms' relatives all on the CPU.
const std::set<Op> kFewOps = {Op::kMatMul, Op::kRmsNorm, Op::kAdd, Op::kSiluMul,
                              Op::kGatherRows, Op::kMoeCombine};
// Everything but attention (and the ops no decoder uses): the device routes (top-k)
// and runs the fused expert op.
const std::set<Op> kMostOps = {Op::kMatMul,     Op::kRmsNorm,    Op::kAdd,      Op::kSiluMul,
                               Op::kGatherRows, Op::kMoeCombine, Op::kRope,     Op::kTopK,
                               Op::kFusedMoe,   Op::kAddBias,    Op::kStoreHalf};

class FakeBackendTest : public ::testing::TestWithParam<Case> {};

TEST_P(FakeBackendTest, UnsupportedOpsRunOnTheCpuAndTheLogitsAreTheCpus) {
  const Case& c = GetParam();
  auto file = format::GgufFile::Open(kModels + c.file);
  ASSERT_TRUE(file.ok()) << file.status();
  ModelLoadOptions options;
  options.expert_pool_fraction = c.pool;
  options.router.alpha = 0;
  options.kv_cache_positions = 64;
  auto cpu = Model::Load(**file, options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();

  auto counts = std::make_shared<FakeCounts>();
  options.backend = Backend::kOpenCl;
  options.device_backend = [&]() -> absl::StatusOr<std::unique_ptr<backend::Backend>> {
    return std::unique_ptr<backend::Backend>(std::make_unique<FakeBackend>(c.ops, counts));
  };
  auto fake = Model::Load(**file, options);
  ASSERT_TRUE(fake.ok()) << fake.status();
  EXPECT_EQ((*fake)->backend_stats().backend, "Fake");

  const test_util::GreedyRun want = test_util::RunGreedy(**cpu, 20, 6);
  const test_util::GreedyRun got = test_util::RunGreedy(**fake, 20, 6);
  EXPECT_TRUE(test_util::SameBits(got.prefill, want.prefill)) << c.name << ": prefill logits";
  EXPECT_EQ(got.tokens, want.tokens) << c.name;
  EXPECT_TRUE(test_util::SameBits(got.decode, want.decode)) << c.name << ": decode logits";
  const BackendStats stats = (*fake)->backend_stats();
  EXPECT_GT(counts->ops, 0u) << c.name << ": the fake device ran nothing";
  EXPECT_GT(stats.cpu_placed_ops, 0u) << c.name << ": nothing ran on the CPU";
  EXPECT_EQ(stats.fallbacks, 0u);
  EXPECT_EQ(stats.device_batches, 7u);  // the prefill and 6 decode steps
}

INSTANTIATE_TEST_SUITE_P(
    Oracle, FakeBackendTest,
    ::testing::Values(Case{"tiny-moe-shakespeare-f32.gguf", 0, kFewOps, "f32_few_ops"},
                      Case{"tiny-moe-shakespeare-q4_0.gguf", 0, kFewOps, "q4_0_few_ops"},
                      Case{"tiny-moe-shakespeare-q4_0.gguf", 0, kMostOps, "q4_0_most_ops"},
                      Case{"tiny-moe-shakespeare-q4_0.gguf", 0.25, kFewOps, "q4_0_pool_few_ops"},
                      Case{"tiny-moe-shakespeare-q8_0.gguf", 0.25, kMostOps,
                           "q8_0_pool_most_ops"}),
    [](const ::testing::TestParamInfo<Case>& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace moert::model
