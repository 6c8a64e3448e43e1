// Tests of the dense fallback FFN (Model::SetDenseFallback, moert-pack --dense-fallback's
// blk.N.ffn_{gate,up,down}_dense_fallback tensors): loaded when present and counted in
// the budget, switched on and off at run time without expert loads while on and with
// logits bit for bit a never-switched model's once off, and a clear load error for a
// malformed one. The files are the q8_0 oracle copied with fallback tensors added here
// (expert 0's matrices), so that the model module does not depend on the tool.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "backend/fake_backend.h"
#include "common/greedy_run.h"
#include "common/oracle_file.h"
#include "core/strings.h"
#include "format/arch.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "model/model.h"

namespace moert::model {
namespace {

using format::GgufFile;
using format::TensorKind;
using format::TensorWeightName;
using test_util::SameBits;

constexpr char kOracle[] = "tiny-moe-shakespeare-q8_0.gguf";

// How a test copy of the oracle differs from it.
struct Variant {
  bool fallback = true;        // add the fallback tensors (expert 0's matrices)
  bool same_experts = false;   // every expert replaced by expert 0
  bool transpose_down = false; // layer 0's fallback down declared [n_embd, n_ff]
  bool drop_down = false;      // layer 0's fallback down left out
};

bool IsExpertTensor(std::string_view name) {
  return name.find("_exps.weight") != std::string_view::npos;
}

// Expert 0's bytes of a stacked expert tensor.
std::span<const uint8_t> FirstExpert(const GgufFile& file, const format::GgufTensorInfo& t) {
  return file.TensorData(t).subspan(0, static_cast<size_t>(t.n_bytes / t.dims[2]));
}

// The files written, removed at exit: an expert pool opens its model file by name, so
// they stay while the tests run.
std::vector<std::string>& TempFiles() {
  static auto* paths = [] {
    auto* p = new std::vector<std::string>();
    std::atexit([] {
      for (const std::string& path : TempFiles()) std::remove(path.c_str());
    });
    return p;
  }();
  return *paths;
}

std::unique_ptr<GgufFile> WriteVariant(const std::string& name, const Variant& v) {
  const GgufFile& src = test_util::OracleFile(kOracle);
  format::GgufWriter w;
  w.CopyMetadata(src);
  std::vector<uint8_t> copies;
  for (const format::GgufTensorInfo& t : src.tensors()) {
    std::span<const uint8_t> data = src.TensorData(t);
    if (v.same_experts && IsExpertTensor(t.name)) {
      const std::span<const uint8_t> first = FirstExpert(src, t);
      copies.clear();
      for (uint64_t e = 0; e < t.dims[2]; ++e) copies.insert(copies.end(), first.begin(), first.end());
      data = copies;
    }
    EXPECT_TRUE(w.AddTensor(t.name, t.type, t.dims, data).ok()) << t.name;
  }
  const uint32_t n_layer = 4;
  const TensorKind kinds[3][2] = {
      {TensorKind::kFfnGateExps, TensorKind::kFfnGateDenseFallback},
      {TensorKind::kFfnUpExps, TensorKind::kFfnUpDenseFallback},
      {TensorKind::kFfnDownExps, TensorKind::kFfnDownDenseFallback}};
  for (uint32_t il = 0; v.fallback && il < n_layer; ++il) {
    const int layer = static_cast<int>(il);
    for (const auto& [exps, fallback] : kinds) {
      const format::GgufTensorInfo* t = src.FindTensor(TensorWeightName(exps, layer));
      EXPECT_NE(t, nullptr);
      if (t == nullptr) return nullptr;
      const bool down = fallback == TensorKind::kFfnDownDenseFallback;
      if (down && il == 0 && v.drop_down) continue;
      std::vector<uint64_t> dims = {t->dims[0], t->dims[1]};
      if (down && il == 0 && v.transpose_down) std::swap(dims[0], dims[1]);
      EXPECT_TRUE(
          w.AddTensor(TensorWeightName(fallback, layer), t->type, dims, FirstExpert(src, *t)).ok());
    }
  }
  const std::string path = StrCat(::testing::TempDir(), "/", getpid(), "_", name, ".gguf");
  TempFiles().push_back(path);
  EXPECT_TRUE(w.WriteFile(path).ok()) << path;
  auto file = GgufFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? std::move(*file) : nullptr;
}

ModelLoadOptions Options() {
  ModelLoadOptions options;
  options.threads = 2;
  options.kv_cache_positions = 64;
  options.router.alpha = 0;  // a pool's routing as fully resident experts'
  return options;
}

std::unique_ptr<Model> Load(const GgufFile& file, const ModelLoadOptions& options = Options()) {
  auto model = Model::Load(file, options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

// Every row's logits of the spread prompt, in a fresh cache.
std::vector<float> Prefill(Model& model, size_t n = 32) {
  std::vector<float> logits;
  auto cache = model.NewKvCache(64);
  EXPECT_TRUE(cache.ok()) << cache.status();
  if (!cache.ok()) return logits;
  absl::Status s =
      model.Forward(test_util::SpreadPrompt(n), cache->get(), LogitsFor::kAll, &logits);
  EXPECT_TRUE(s.ok()) << s;
  return logits;
}

bool AllFinite(const std::vector<float>& v) {
  return !v.empty() && std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

const GgufFile& FallbackFile() {
  static const GgufFile* file = WriteVariant("fallback", {}).release();
  return *file;
}

TEST(DenseFallbackTest, WithoutTheTensorsIsFailedPreconditionAndTheModelKeepsWorking) {
  std::unique_ptr<Model> model = Load(test_util::OracleFile(kOracle));
  std::unique_ptr<Model> never = Load(test_util::OracleFile(kOracle));
  ASSERT_NE(model, nullptr);
  ASSERT_NE(never, nullptr);
  EXPECT_FALSE(model->has_dense_fallback());
  const absl::Status s = model->SetDenseFallback(true);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("moert-pack --dense-fallback"), std::string_view::npos) << s;
  EXPECT_TRUE(SameBits(Prefill(*model), Prefill(*never)));
}

TEST(DenseFallbackTest, SwitchesOnAndBackBitIdentical) {
  std::unique_ptr<Model> model = Load(FallbackFile());
  std::unique_ptr<Model> never = Load(FallbackFile());
  ASSERT_NE(model, nullptr);
  ASSERT_NE(never, nullptr);
  EXPECT_TRUE(model->has_dense_fallback());
  const std::vector<float> routed = Prefill(*never);
  ASSERT_TRUE(model->SetDenseFallback(true).ok());
  const std::vector<float> dense = Prefill(*model);
  EXPECT_TRUE(AllFinite(dense));
  EXPECT_GT(MaxAbsDiff(dense, routed), 1e-2f) << "the fallback ran the experts";
  ASSERT_TRUE(model->SetDenseFallback(false).ok());
  EXPECT_TRUE(SameBits(Prefill(*model), routed));
}

// Switching between the steps of one session: the cache keeps what each step computed.
TEST(DenseFallbackTest, SwitchesBetweenDecodeSteps) {
  std::unique_ptr<Model> model = Load(FallbackFile());
  ASSERT_NE(model, nullptr);
  auto cache = model->NewKvCache(64);
  ASSERT_TRUE(cache.ok()) << cache.status();
  std::vector<float> logits;
  ASSERT_TRUE(
      model->Forward(test_util::SpreadPrompt(16), cache->get(), LogitsFor::kLast, &logits).ok());
  for (int step = 0; step < 6; ++step) {
    ASSERT_TRUE(model->SetDenseFallback(step % 2 == 0).ok());
    const int32_t next = test_util::Argmax(logits.data(), logits.size());
    ASSERT_TRUE(model->Forward({&next, 1}, cache->get(), LogitsFor::kLast, &logits).ok());
    EXPECT_TRUE(AllFinite(logits)) << "step " << step;
  }
  EXPECT_EQ((*cache)->size(), 22);
}

// With every expert equal to expert 0 and the fallback expert 0 too, the routed layer
// (renormalised top-2 weights summing to 1) and the fallback compute the same FFN.
TEST(DenseFallbackTest, MatchesTheExpertsWhenAllExpertsAreTheFallback) {
  std::unique_ptr<GgufFile> file = WriteVariant("same", {.same_experts = true});
  ASSERT_NE(file, nullptr);
  ModelLoadOptions options = Options();
  options.quantized_kernels = false;  // fp32: only the weighted sum's rounding differs
  std::unique_ptr<Model> model = Load(*file, options);
  ASSERT_NE(model, nullptr);
  const std::vector<float> routed = Prefill(*model);
  ASSERT_TRUE(model->SetDenseFallback(true).ok());
  const std::vector<float> dense = Prefill(*model);
  EXPECT_TRUE(AllFinite(dense));
  EXPECT_LT(MaxAbsDiff(dense, routed), 1e-3f);
}

TEST(DenseFallbackTest, NoExpertLoadsWhileOnWithAnExpertPool) {
  ModelLoadOptions options = Options();
  options.expert_pool_fraction = 0.25;
  options.prefetch = true;
  std::unique_ptr<Model> model = Load(FallbackFile(), options);
  std::unique_ptr<Model> never = Load(FallbackFile(), options);
  ASSERT_NE(model, nullptr);
  ASSERT_NE(never, nullptr);
  ASSERT_TRUE(model->memory_stats().expert_pool);
  ASSERT_TRUE(model->SetDenseFallback(true).ok());
  const experts::ExpertCacheStats before = model->memory_stats().pool;
  const test_util::GreedyRun dense = test_util::RunGreedy(*model, 32, 6);
  EXPECT_TRUE(AllFinite(dense.decode));
  const experts::ExpertCacheStats on = model->memory_stats().pool;
  EXPECT_EQ(on.misses, before.misses);
  EXPECT_EQ(on.hits, before.hits);
  EXPECT_EQ(on.loads, before.loads);
  EXPECT_EQ(on.prefetches, before.prefetches);
  // Off again: the experts load, and the logits are a never-switched pool's.
  ASSERT_TRUE(model->SetDenseFallback(false).ok());
  const test_util::GreedyRun routed = test_util::RunGreedy(*model, 32, 6);
  EXPECT_GT(model->memory_stats().pool.misses, on.misses);
  const test_util::GreedyRun reference = test_util::RunGreedy(*never, 32, 6);
  EXPECT_TRUE(SameBits(routed.prefill, reference.prefill));
  EXPECT_TRUE(SameBits(routed.decode, reference.decode));
  EXPECT_EQ(routed.tokens, reference.tokens);
}

// On a device backend (a fake one with most ops), the fallback runs in the device's
// graph with the CPU's logits bit for bit.
TEST(DenseFallbackTest, RunsOnADeviceBackendAsOnTheCpu) {
  std::unique_ptr<Model> cpu = Load(FallbackFile());
  ASSERT_NE(cpu, nullptr);
  ModelLoadOptions options = Options();
  options.backend = Backend::kOpenCl;
  auto counts = std::make_shared<backend::testing::FakeCounts>();
  options.device_backend = [&]() -> absl::StatusOr<std::unique_ptr<backend::Backend>> {
    using backend::Op;
    return std::unique_ptr<backend::Backend>(std::make_unique<backend::testing::FakeBackend>(
        std::set<Op>{Op::kMatMul, Op::kRmsNorm, Op::kAdd, Op::kSiluMul, Op::kGatherRows,
                     Op::kMoeCombine, Op::kRope, Op::kTopK, Op::kFusedMoe, Op::kAddBias},
        counts));
  };
  std::unique_ptr<Model> device = Load(FallbackFile(), options);
  ASSERT_NE(device, nullptr);
  ASSERT_EQ(device->backend_stats().backend, "Fake");
  ASSERT_TRUE(cpu->SetDenseFallback(true).ok());
  ASSERT_TRUE(device->SetDenseFallback(true).ok());
  const test_util::GreedyRun want = test_util::RunGreedy(*cpu, 20, 4);
  const test_util::GreedyRun got = test_util::RunGreedy(*device, 20, 4);
  EXPECT_TRUE(SameBits(got.prefill, want.prefill));
  EXPECT_TRUE(SameBits(got.decode, want.decode));
  EXPECT_EQ(device->backend_stats().fallbacks, 0u);
  EXPECT_GT(counts->ops, 0u);
}

// The budget counts the fallback with the other weights outside the pool: 12 matrices
// of 512 x 256 values, at least a byte each in the runtime's int8 layout.
TEST(DenseFallbackTest, TheBudgetCountsTheFallback) {
  ModelLoadOptions options = Options();
  options.memory_budget_bytes = uint64_t{64} << 20;
  std::unique_ptr<Model> plain = Load(test_util::OracleFile(kOracle), options);
  std::unique_ptr<Model> model = Load(FallbackFile(), options);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(model, nullptr);
  const uint64_t extra =
      model->memory_stats().persistent_bytes - plain->memory_stats().persistent_bytes;
  const uint64_t values = 12 * 512 * 256;
  EXPECT_GE(extra, values);
  EXPECT_LE(extra, values * 4);
}

TEST(DenseFallbackTest, AWrongShapeIsALoadErrorNamingTheTensor) {
  std::unique_ptr<GgufFile> file = WriteVariant("transposed", {.transpose_down = true});
  ASSERT_NE(file, nullptr);
  auto model = Model::Load(*file, Options());
  ASSERT_FALSE(model.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(model.status())) << model.status();
  EXPECT_NE(model.status().message().find(
                "tensor 'blk.0.ffn_down_dense_fallback.weight' has shape [256, 512], expected "
                "[512, 256]"),
            std::string_view::npos)
      << model.status();
}

TEST(DenseFallbackTest, AMissingPartIsALoadErrorNamingTheTensor) {
  std::unique_ptr<GgufFile> file = WriteVariant("no_down", {.drop_down = true});
  ASSERT_NE(file, nullptr);
  auto model = Model::Load(*file, Options());
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("'blk.0.ffn_down_dense_fallback.weight'"),
            std::string_view::npos)
      << model.status();
}

}  // namespace
}  // namespace moert::model
