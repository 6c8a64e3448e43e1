// The model on the OpenCL backend against the CPU backend, end to end (issue 8): the
// F32 oracle's greedy continuation of a REFERENCE.md prompt is the CPU's token for
// token, and on the Q8_0 and Q4_0 models the top-1 token agrees at >= 99% of the
// scored positions of the first chunks of valid.txt (all of it in the slow suite), with
// perplexity within 0.1%. A device failure part-way through a batch (injected through
// a FaultBackend around the OpenCL backend) is a Status on Backend::kOpenCl and a counted CPU fallback
// with the CPU's result on kAuto, and the device runs the next request correctly.
// Without a device the tests skip, unless MOERT_REQUIRE_OPENCL=1 (the host build).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/failure_policy.h"
#include "backend/opencl/cl_status.h"
#include "backend/opencl/opencl_backend.h"
#include "backend/fault_backend.h"
#include "common/greedy_run.h"
#include "core/strings.h"
#include "format/gguf.h"
#include "model/decoder.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace moert::model {
namespace {

const std::string kModels = std::string(MOERT_SHARED_DIR) + "/models/";

bool RequireOpenCl() {
  const char* v = std::getenv("MOERT_REQUIRE_OPENCL");
  return v != nullptr && std::string(v) == "1";
}

struct Loaded {
  std::unique_ptr<format::GgufFile> file;
  std::unique_ptr<Model> model;
};

// The OpenCL backend (any device, PoCL's CPU one here) inside a FaultBackend whose
// injections `faults` arms: ModelLoadOptions::device_backend.
std::function<absl::StatusOr<std::unique_ptr<backend::Backend>>()> FaultyOpenCl(
    std::shared_ptr<backend::testing::FaultState> faults) {
  return [faults]() -> absl::StatusOr<std::unique_ptr<backend::Backend>> {
    backend::opencl::OpenClBackendOptions cl;
    cl.allow_cpu_device = true;
    absl::StatusOr<std::unique_ptr<backend::Backend>> device = backend::opencl::OpenOpenClBackend(cl);
    if (!device.ok()) return device.status();
    return std::unique_ptr<backend::Backend>(
        std::make_unique<backend::testing::FaultBackend>(std::move(*device), faults));
  };
}

// The model on `backend` (with `faults`: the OpenCL device through a FaultBackend);
// *skip set (and nothing loaded) when the OpenCL backend has no device here.
Loaded Load(const std::string& name, Backend backend, std::string* skip,
            std::shared_ptr<backend::testing::FaultState> faults = nullptr) {
  Loaded out;
  auto file = format::GgufFile::Open(kModels + name);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return out;
  out.file = std::move(*file);
  ModelLoadOptions options;
  options.backend = backend;
  if (faults != nullptr) options.device_backend = FaultyOpenCl(faults);
  auto model = Model::Load(*out.file, options);
  if (!model.ok() && backend != Backend::kCpu &&
      model.status().code() == absl::StatusCode::kFailedPrecondition) {
    *skip = std::string(model.status().message());
    return out;
  }
  EXPECT_TRUE(model.ok()) << model.status();
  if (model.ok()) out.model = std::move(*model);
  return out;
}

#define MOERT_SKIP_WITHOUT_DEVICE(skip)                                          \
  if (!(skip).empty()) {                                                         \
    if (RequireOpenCl()) FAIL() << "MOERT_REQUIRE_OPENCL=1 but: " << (skip);     \
    GTEST_SKIP() << "no OpenCL device: " << (skip);                              \
  }

int Argmax(const float* v, int64_t n) {
  return static_cast<int>(std::max_element(v, v + n) - v);
}

std::vector<int> Greedy(Model& model, std::vector<int32_t> prompt, int n) {
  auto cache = model.NewKvCache(256).value();
  std::vector<float> logits;
  std::vector<int> out;
  std::vector<int32_t> batch = prompt;
  for (int i = 0; i < n; ++i) {
    const absl::Status s = model.Forward(batch, cache.get(), LogitsFor::kLast, &logits);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) break;
    out.push_back(Argmax(logits.data(), static_cast<int64_t>(logits.size())));
    batch = {out.back()};
  }
  return out;
}

TEST(OpenClForwardTest, F32GreedyContinuationIsTheCpus) {
  std::string skip;
  Loaded gpu = Load("tiny-moe-shakespeare-f32.gguf", Backend::kOpenCl, &skip);
  MOERT_SKIP_WITHOUT_DEVICE(skip);
  ASSERT_NE(gpu.model, nullptr);
  EXPECT_EQ(gpu.model->backend_stats().backend, "OpenCL");
  EXPECT_FALSE(gpu.model->backend_stats().device.empty());
  Loaded cpu = Load("tiny-moe-shakespeare-f32.gguf", Backend::kCpu, &skip);
  ASSERT_NE(cpu.model, nullptr);
  EXPECT_EQ(cpu.model->backend_stats().backend, "CPU");
  // REFERENCE.md: "ROMEO:" and its greedy 32 tokens.
  const std::vector<int> want = {13, 2010, 270, 1999, 275, 2014, 277, 309, 261, 271, 584,
                                 260, 1992, 1999, 302, 1999, 13, 2012, 260, 1992, 275, 369,
                                 822, 261, 292, 393, 2014, 1995, 1999, 13, 2010, 270};
  const std::vector<int> on_cpu = Greedy(*cpu.model, {1, 826, 2007}, 32);
  const std::vector<int> on_gpu = Greedy(*gpu.model, {1, 826, 2007}, 32);
  EXPECT_EQ(on_cpu, want);
  EXPECT_EQ(on_gpu, on_cpu);
  EXPECT_EQ(gpu.model->backend_stats().fallbacks, 0u);
}

// An F16 model's float weights stay half on the device (every value is one): about
// half the device memory of the F32 model, and the CPU's tokens and logits (the same
// weight values; only the attention's and norms' summation orders differ).
TEST(OpenClForwardSlowTest, F16WeightsStayHalfOnTheDevice) {
  std::string skip;
  Loaded gpu = Load("tiny-moe-shakespeare-f16.gguf", Backend::kOpenCl, &skip);
  MOERT_SKIP_WITHOUT_DEVICE(skip);
  ASSERT_NE(gpu.model, nullptr);
  Loaded cpu = Load("tiny-moe-shakespeare-f16.gguf", Backend::kCpu, &skip);
  Loaded gpu32 = Load("tiny-moe-shakespeare-f32.gguf", Backend::kOpenCl, &skip);
  ASSERT_TRUE(cpu.model && gpu32.model);
  const uint64_t f16_bytes = gpu.model->backend_stats().device_weight_bytes;
  const uint64_t f32_bytes = gpu32.model->backend_stats().device_weight_bytes;
  std::printf("device weights: F16 model %llu bytes, F32 model %llu bytes\n",
              static_cast<unsigned long long>(f16_bytes),
              static_cast<unsigned long long>(f32_bytes));
  EXPECT_GT(f16_bytes, f32_bytes * 45 / 100);  // norms stay fp32
  EXPECT_LT(f16_bytes, f32_bytes * 55 / 100);
  const test_util::GreedyRun c = test_util::RunGreedy(*cpu.model, 12, 12);
  const test_util::GreedyRun g = test_util::RunGreedy(*gpu.model, 12, 12);
  EXPECT_EQ(g.tokens, c.tokens);
  ASSERT_EQ(g.decode.size(), c.decode.size());
  ASSERT_EQ(g.prefill.size(), c.prefill.size());
  float worst = 0;
  for (size_t i = 0; i < c.decode.size(); ++i) {
    worst = std::max(worst, std::fabs(g.decode[i] - c.decode[i]));
  }
  for (size_t i = 0; i < c.prefill.size(); ++i) {
    worst = std::max(worst, std::fabs(g.prefill[i] - c.prefill[i]));
  }
  EXPECT_LT(worst, 1e-4f);
}

// The KV cache the device fills is the host's: a sequence prefilled on the device
// continues on the CPU model with the same logits as a CPU-only run.
TEST(OpenClForwardTest, DeviceKeysAndValuesLandInTheHostCache) {
  std::string skip;
  Loaded gpu = Load("tiny-moe-shakespeare-f32.gguf", Backend::kOpenCl, &skip);
  MOERT_SKIP_WITHOUT_DEVICE(skip);
  ASSERT_NE(gpu.model, nullptr);
  // A cache only fits the model that made it, so compare the cached rows through a
  // second, identical device model: the second call reuses the device copy, the
  // third (after Truncate and another cache) uploads from the host. cache_b holds
  // other tokens, so that the device copy's rows 0..2 are wrong for cache_a.
  auto cache_a = gpu.model->NewKvCache(64).value();
  auto cache_b = gpu.model->NewKvCache(64).value();
  std::vector<float> la, lb;
  const std::vector<int32_t> prompt = {1, 826, 2007, 13, 2010};
  const std::vector<int32_t> other = {1, 100, 200};
  ASSERT_TRUE(gpu.model->Forward(prompt, cache_a.get(), LogitsFor::kLast, &la).ok());
  ASSERT_TRUE(gpu.model->Forward(other, cache_b.get(), LogitsFor::kLast, &lb).ok());
  // cache_a again: the device copy is cache_b's now, so positions 0..4 come from the host.
  cache_a->Truncate(4);
  ASSERT_TRUE(gpu.model->Forward({prompt.data() + 4, 1}, cache_a.get(), LogitsFor::kLast, &lb)
                  .ok());
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) ASSERT_NEAR(la[i], lb[i], 1e-4f) << i;
}

struct Score {
  double nll = 0;
  int64_t scored = 0;
  std::vector<int> top1;
};

// llama-perplexity's method (REFERENCE.md) over the first `chunks` chunks of 128.
Score ScoreChunks(Model& model, const std::vector<int32_t>& tokens, int chunks) {
  constexpr int kCtx = 128;
  Score s;
  std::vector<float> logits;
  const int64_t n_vocab = model.spec().n_vocab;
  for (int c = 0; c < chunks; ++c) {
    std::vector<int32_t> chunk(tokens.begin() + c * kCtx, tokens.begin() + (c + 1) * kCtx);
    chunk[0] = 1;
    auto cache = model.NewKvCache(kCtx).value();
    const absl::Status st = model.Forward(chunk, cache.get(), LogitsFor::kAll, &logits);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) return s;
    for (int p = kCtx / 2; p < kCtx - 1; ++p) {
      const float* row = logits.data() + p * n_vocab;
      const float mx = *std::max_element(row, row + n_vocab);
      double sum = 0;
      for (int64_t v = 0; v < n_vocab; ++v) sum += std::exp(double(row[v]) - mx);
      s.nll += -(double(row[chunk[p + 1]]) - mx - std::log(sum));
      ++s.scored;
      s.top1.push_back(Argmax(row, n_vocab));
    }
  }
  return s;
}

class OpenClQuantizedTest : public ::testing::TestWithParam<const char*> {};
// The whole of valid.txt (361 chunks: minutes on PoCL): the x86 CI step only (`slow`).
class OpenClQuantizedSlowTest : public OpenClQuantizedTest {};

// valid.txt in the oracle vocabulary, BOS first.
std::vector<int32_t> ValidTokens(const format::GgufFile& file) {
  auto tokenizer = tokenizer::Tokenizer::FromGguf(file);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  if (!tokenizer.ok()) return {};
  std::ifstream in(kModels + "valid.txt", std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  const std::vector<tokenizer::TokenId> ids = tokenizer->Encode(text.str(), true, false);
  return std::vector<int32_t>(ids.begin(), ids.end());
}

// Top-1 agreement >= 99% and perplexity within 0.1% between the CPU's and the device's
// scores of the same chunks; prints them under `label`.
void ExpectAgreement(const Score& c, const Score& g, const std::string& label) {
  ASSERT_EQ(c.scored, g.scored);
  ASSERT_GT(c.scored, 0);
  int64_t agree = 0;
  for (size_t i = 0; i < c.top1.size(); ++i) agree += c.top1[i] == g.top1[i];
  EXPECT_GE(static_cast<double>(agree), 0.99 * static_cast<double>(c.scored))
      << agree << " of " << c.scored;
  const double ppl_cpu = std::exp(c.nll / static_cast<double>(c.scored));
  const double ppl_gpu = std::exp(g.nll / static_cast<double>(g.scored));
  EXPECT_LT(std::fabs(ppl_gpu - ppl_cpu) / ppl_cpu, 1e-3) << ppl_cpu << " vs " << ppl_gpu;
  std::printf("%s: top-1 agreement %.2f%% (%lld of %lld), PPL cpu %.4f opencl %.4f\n",
              label.c_str(), 100.0 * static_cast<double>(agree) / static_cast<double>(c.scored),
              static_cast<long long>(agree), static_cast<long long>(c.scored), ppl_cpu, ppl_gpu);
}

// Top-1 agreement >= 99% and perplexity within 0.1% of the CPU backend over the first
// `chunks` chunks of valid.txt (0: all).
void ExpectAgreementWithTheCpu(const char* name, int chunks) {
  std::string skip;
  Loaded gpu = Load(name, Backend::kOpenCl, &skip);
  MOERT_SKIP_WITHOUT_DEVICE(skip);
  ASSERT_NE(gpu.model, nullptr);
  Loaded cpu = Load(name, Backend::kCpu, &skip);
  ASSERT_NE(cpu.model, nullptr);
  const std::vector<int32_t> tokens = ValidTokens(*cpu.file);
  if (chunks == 0) chunks = static_cast<int>(tokens.size() / 128);
  ASSERT_GE(tokens.size(), static_cast<size_t>(chunks) * 128);
  ExpectAgreement(ScoreChunks(*cpu.model, tokens, chunks), ScoreChunks(*gpu.model, tokens, chunks),
                  StrCat(name, ", ", chunks, " chunks"));
  EXPECT_EQ(gpu.model->backend_stats().fallbacks, 0u);
}

TEST_P(OpenClQuantizedTest, Top1AndPerplexityAgreeWithTheCpu) {
  ExpectAgreementWithTheCpu(GetParam(), 6);  // 378 scored positions; seconds on PoCL
}

TEST_P(OpenClQuantizedSlowTest, Top1AndPerplexityAgreeWithTheCpuOverValidTxt) {
  ExpectAgreementWithTheCpu(GetParam(), 0);
}

INSTANTIATE_TEST_SUITE_P(Models, OpenClQuantizedTest,
                         ::testing::Values("tiny-moe-shakespeare-q8_0.gguf",
                                           "tiny-moe-shakespeare-q4_0.gguf"));
INSTANTIATE_TEST_SUITE_P(Models, OpenClQuantizedSlowTest,
                         ::testing::Values("tiny-moe-shakespeare-q8_0.gguf",
                                           "tiny-moe-shakespeare-q4_0.gguf"));

// The device's KV cache in half (ModelLoadOptions::opencl_kv_half): half the cache's
// device memory, and on the Q8_0 oracle over 10 chunks the CPU's top-1 at >= 99% of
// the scored positions with perplexity within 0.1% (measured: 99.52%, -0.04%; the
// first 2 chunks alone give 97.6%: 3 flips in 126). The host cache holds the rounded
// values, so a sequence the CPU continues sees what the device saw.
TEST(OpenClForwardSlowTest, HalfKvCacheStaysWithinTheAgreementBounds) {
  const std::string name = "tiny-moe-shakespeare-q8_0.gguf";
  auto file = format::GgufFile::Open(kModels + name);
  ASSERT_TRUE(file.ok()) << file.status();
  const auto load = [&](Backend backend, bool kv_half, std::string* skip) {
    ModelLoadOptions options;
    options.backend = backend;
    options.opencl_kv_half = kv_half;
    auto model = Model::Load(**file, options);
    if (!model.ok() && model.status().code() == absl::StatusCode::kFailedPrecondition) {
      *skip = std::string(model.status().message());
      return std::unique_ptr<Model>();
    }
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? std::move(*model) : std::unique_ptr<Model>();
  };
  std::string skip;
  std::unique_ptr<Model> half = load(Backend::kOpenCl, true, &skip);
  MOERT_SKIP_WITHOUT_DEVICE(skip);
  ASSERT_NE(half, nullptr);
  std::unique_ptr<Model> full = load(Backend::kOpenCl, false, &skip);
  std::unique_ptr<Model> cpu = load(Backend::kCpu, true, &skip);  // ignored on the CPU
  ASSERT_TRUE(full && cpu);
  const std::vector<int32_t> tokens = ValidTokens(**file);
  const Score c = ScoreChunks(*cpu, tokens, 10);
  ExpectAgreement(c, ScoreChunks(*half, tokens, 10), StrCat(name, ", half KV cache"));
  ExpectAgreement(c, ScoreChunks(*full, tokens, 10), StrCat(name, ", fp32 KV cache"));
  const uint64_t half_bytes = half->backend_stats().device_kv_bytes;
  const uint64_t full_bytes = full->backend_stats().device_kv_bytes;
  EXPECT_GT(full_bytes, 0u);
  EXPECT_EQ(half_bytes * 2, full_bytes);
  // A decode step after the prefill reads the rows the device rounded and copied back.
  const test_util::GreedyRun g = test_util::RunGreedy(*half, 16, 8);
  const test_util::GreedyRun r = test_util::RunGreedy(*cpu, 16, 8);
  size_t same = 0;
  for (size_t i = 0; i < std::min(g.tokens.size(), r.tokens.size()); ++i) {
    same += g.tokens[i] == r.tokens[i];
  }
  EXPECT_EQ(g.tokens.size(), 8u);
  std::printf("half KV: %llu device bytes (fp32: %llu); greedy tokens equal to the CPU's: %zu "
              "of 8\n", static_cast<unsigned long long>(half_bytes),
              static_cast<unsigned long long>(full_bytes), same);
}

// An expert pool on the device backend (residency penalty off): the routing runs on
// the host from the pool's residency; the pooled experts compute on the device, read
// from the pool's memory in place (PooledExperts::kDevice: zero-copy on PoCL, which
// shares host memory) or from a device copy written per load (kDeviceCopy), or on the
// host (kHost). Each against the CPU backend with the same pool: top-1 >= 99% and
// perplexity within 0.1% over 2 chunks; the experts really come from the pool
// (misses), and both device placements give the same bits, as does prefetch on (in a
// 50% pool: at 25% this model's lazy window leaves prefetch no room).
class OpenClPoolTest : public ::testing::Test {
 protected:
  static constexpr int kChunks = 2;
  static constexpr char kName[] = "tiny-moe-shakespeare-q4_0.gguf";

  void SetUp() override {
    auto file = format::GgufFile::Open(kModels + kName);
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = std::move(*file);
    tokens_ = ValidTokens(*file_);
    ASSERT_GE(tokens_.size(), size_t{kChunks * 128});
  }

  // The Q4_0 oracle with a 25% pool; null and *skip set without a device.
  std::unique_ptr<Model> Load(Backend backend, PooledExperts placement, bool prefetch,
                              std::string* skip, float dynamic_k_p = 0, double pool = 0.25,
                              std::shared_ptr<backend::testing::FaultState> faults = nullptr) {
    ModelLoadOptions options;
    if (faults != nullptr) options.device_backend = FaultyOpenCl(faults);
    options.backend = backend;
    options.expert_pool_fraction = pool;
    options.router.alpha = 0;
    options.router.dynamic_k_p = dynamic_k_p;
    options.router.k_max = dynamic_k_p > 0 ? 3 : 0;
    options.prefetch = prefetch;
    options.kv_cache_positions = 128;
    options.opencl_pooled_experts = placement;
    auto model = Model::Load(*file_, options);
    if (!model.ok() && backend == Backend::kOpenCl &&
        model.status().code() == absl::StatusCode::kFailedPrecondition) {
      *skip = std::string(model.status().message());
      return nullptr;
    }
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? std::move(*model) : nullptr;
  }

  Score Run(Model& model) { return ScoreChunks(model, tokens_, kChunks); }

  std::unique_ptr<format::GgufFile> file_;
  std::vector<int32_t> tokens_;
};

// The whole-model comparisons run in the x86 CI step only (label `slow`); the
// sanitizer step keeps the pool's host-side paths through the tests below them.
class OpenClPoolSlowTest : public OpenClPoolTest {};

TEST_F(OpenClPoolSlowTest, PooledExpertsRunOnTheDeviceFromThePoolsMemory) {
  std::string skip;
  std::unique_ptr<Model> gpu = Load(Backend::kOpenCl, PooledExperts::kDevice, false, &skip);
  MOERT_SKIP_WITHOUT_DEVICE(skip);
  ASSERT_NE(gpu, nullptr);
  std::unique_ptr<Model> cpu = Load(Backend::kCpu, PooledExperts::kDevice, false, &skip);
  std::unique_ptr<Model> copy = Load(Backend::kOpenCl, PooledExperts::kDeviceCopy, false, &skip);
  std::unique_ptr<Model> host = Load(Backend::kOpenCl, PooledExperts::kHost, false, &skip);
  // Prefetch needs room for a second slot beyond the lazy window: a 50% pool. Every
  // batch's experts fit in either pool, so the device computes the same bits.
  std::unique_ptr<Model> prefetch =
      Load(Backend::kOpenCl, PooledExperts::kDevice, true, &skip, 0, /*pool=*/0.5);
  ASSERT_TRUE(cpu && copy && host && prefetch);

  const Score c = Run(*cpu);
  const Score g = Run(*gpu);
  ExpectAgreement(c, g, StrCat(kName, ", pool 25%, experts on the device"));
  const Score h = Run(*host);
  ExpectAgreement(c, h, StrCat(kName, ", pool 25%, experts on the host"));
  const Score d = Run(*copy);
  EXPECT_EQ(d.top1, g.top1);
  EXPECT_EQ(d.nll, g.nll);  // the same kernels over the same bytes
  const Score p = Run(*prefetch);
  EXPECT_EQ(p.top1, g.top1);
  EXPECT_EQ(p.nll, g.nll);  // prefetch changes when experts load, not the routing
  // Decoding, where the next layer's loads start while the device computes.
  const test_util::GreedyRun gd = test_util::RunGreedy(*gpu, 12, 12);
  const test_util::GreedyRun pd = test_util::RunGreedy(*prefetch, 12, 12);
  EXPECT_EQ(pd.tokens, gd.tokens);
  EXPECT_TRUE(test_util::SameBits(pd.decode, gd.decode));
  EXPECT_GT(prefetch->memory_stats().pool.prefetches, 0u);

  for (Model* m : {gpu.get(), copy.get(), host.get(), prefetch.get()}) {
    const BackendStats b = m->backend_stats();
    const MemoryStats mem = m->memory_stats();
    EXPECT_EQ(b.backend, "OpenCL");
    EXPECT_EQ(b.fallbacks, 0u);
    EXPECT_GT(mem.pool.misses, 0u);  // the experts came from the pool
    EXPECT_EQ(mem.pool.pinned_experts, 0u);
    std::printf("%s: %llu MoE blocks on the device, %llu on the host, %llu bytes published, "
                "%llu loads\n",
                b.pooled_experts.c_str(), static_cast<unsigned long long>(b.pooled_device_batches),
                static_cast<unsigned long long>(b.pooled_host_batches),
                static_cast<unsigned long long>(b.pooled_published_bytes),
                static_cast<unsigned long long>(mem.pool.misses));
  }
  EXPECT_EQ(gpu->backend_stats().pooled_experts, "device (zero-copy)");
  EXPECT_EQ(copy->backend_stats().pooled_experts, "device (copied per load)");
  EXPECT_EQ(host->backend_stats().pooled_experts.rfind("host: ", 0), 0u);
  for (Model* m : {gpu.get(), copy.get(), prefetch.get()}) {
    const BackendStats b = m->backend_stats();
    EXPECT_GT(b.pooled_device_batches, 0u);
    EXPECT_EQ(b.pooled_host_batches, 0u);
    EXPECT_GT(b.pooled_published_bytes, 0u);
  }
  EXPECT_EQ(host->backend_stats().pooled_device_batches, 0u);
  EXPECT_GT(host->backend_stats().pooled_host_batches, 0u);
}

// A driver whose zero-copy view of the pool shows stale bytes (it copied or pinned
// the region's pages when it was wrapped; injected): the first expert published is
// read back and compared, the region becomes a device copy, and the results are the
// copy placement's, bit for bit.
TEST_F(OpenClPoolTest, StaleZeroCopyViewFallsBackToADeviceCopy) {
  std::string skip;
  auto faults = std::make_shared<backend::testing::FaultState>();
  faults->spoil_wrapped_reads = true;
  std::unique_ptr<Model> gpu =
      Load(Backend::kOpenCl, PooledExperts::kDevice, false, &skip, 0, 0.25, faults);
  MOERT_SKIP_WITHOUT_DEVICE(skip);
  ASSERT_NE(gpu, nullptr);
  std::unique_ptr<Model> copy = Load(Backend::kOpenCl, PooledExperts::kDeviceCopy, false, &skip);
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(gpu->backend_stats().pooled_experts, "device (zero-copy)");
  const Score g = Run(*gpu);
  const Score c = Run(*copy);
  EXPECT_EQ(g.top1, c.top1);
  EXPECT_EQ(g.nll, c.nll);
  EXPECT_EQ(gpu->backend_stats().pooled_experts,
            "device (copied per load: the zero-copy view read stale bytes)");
  EXPECT_EQ(gpu->backend_stats().pooled_host_batches, 0u);
  // Without the injection the check passes and zero-copy stays.
  std::unique_ptr<Model> clean = Load(Backend::kOpenCl, PooledExperts::kDevice, false, &skip);
  ASSERT_NE(clean, nullptr);
  const Score z = Run(*clean);
  EXPECT_EQ(z.nll, c.nll);
  EXPECT_EQ(clean->backend_stats().pooled_experts, "device (zero-copy)");
}

// Dynamic k (the router may leave slots empty: expert -1, and give a token more slots
// than the model's k) with the experts on the device: the CPU's tokens.
TEST_F(OpenClPoolSlowTest, DynamicKWithEmptySlotsOnTheDevice) {
  std::string skip;
  std::unique_ptr<Model> gpu =
      Load(Backend::kOpenCl, PooledExperts::kDevice, false, &skip, /*dynamic_k_p=*/0.6f);
  MOERT_SKIP_WITHOUT_DEVICE(skip);
  ASSERT_NE(gpu, nullptr);
  std::unique_ptr<Model> cpu =
      Load(Backend::kCpu, PooledExperts::kDevice, false, &skip, /*dynamic_k_p=*/0.6f);
  ASSERT_NE(cpu, nullptr);
  ExpectAgreement(Run(*cpu), Run(*gpu), StrCat(kName, ", pool 25%, dynamic k"));
  EXPECT_GT(gpu->backend_stats().pooled_device_batches, 0u);
}

// A pool too small for a prefill batch's experts: that batch's experts run on the host
// (in subsets that fit), the decode steps' on the device; the CPU's greedy tokens, and
// logits within a Q4_0 run's device-versus-CPU rounding.
TEST_F(OpenClPoolTest, BatchesTooBigForThePoolRunOnTheHost) {
  std::string skip;
  std::unique_ptr<Model> gpu =
      Load(Backend::kOpenCl, PooledExperts::kDevice, false, &skip, 0, /*pool=*/0.125);
  MOERT_SKIP_WITHOUT_DEVICE(skip);
  ASSERT_NE(gpu, nullptr);
  std::unique_ptr<Model> cpu = Load(Backend::kCpu, PooledExperts::kDevice, false, &skip, 0, 0.125);
  ASSERT_NE(cpu, nullptr);
  const uint64_t capacity = gpu->memory_stats().pool.capacity_experts;
  ASSERT_GE(capacity, 2u);
  ASSERT_LT(capacity, 8u);  // a 24-token batch routes to more experts of a layer
  const test_util::GreedyRun c = test_util::RunGreedy(*cpu, 24, 8);
  const test_util::GreedyRun g = test_util::RunGreedy(*gpu, 24, 8);
  EXPECT_EQ(g.tokens, c.tokens);
  ASSERT_EQ(g.decode.size(), c.decode.size());
  float worst = 0;
  for (size_t i = 0; i < c.decode.size(); ++i) worst = std::max(worst, std::fabs(g.decode[i] - c.decode[i]));
  EXPECT_LT(worst, 1e-3f);
  const BackendStats b = gpu->backend_stats();
  std::printf("pool of %llu experts: %llu MoE blocks on the device, %llu on the host, "
              "decode logits within %g of the CPU's\n",
              static_cast<unsigned long long>(capacity),
              static_cast<unsigned long long>(b.pooled_device_batches),
              static_cast<unsigned long long>(b.pooled_host_batches), worst);
  EXPECT_GT(b.pooled_host_batches, 0u);
  EXPECT_GE(b.pooled_device_batches, 8u * gpu->spec().n_layer);  // every decode step
  EXPECT_EQ(gpu->memory_stats().pool.pinned_experts, 0u);
}

// --- A device that fails part-way through a batch (issue 8: "a build failure, an
// out-of-resources or a lost device returns a Status; auto then falls back to the CPU
// for that request and counts it"). The failures are injected after some of the
// batch's kernels ran, with the Status a real failed enqueue gives.

const char kF32[] = "tiny-moe-shakespeare-f32.gguf";
const std::vector<int32_t> kRomeo = {1, 826, 2007};  // "ROMEO:"
constexpr int kSteps = 8;
// The device's fp32 logits against the CPU's, as DeviceKeysAndValuesLandInTheHostCache
// (summation orders differ; measured on PoCL: below 4e-6 on this model).
constexpr float kLogitTolerance = 1e-4f;

// Greedy decoding with each step's logits (the last row).
struct Generation {
  std::vector<int> tokens;
  std::vector<std::vector<float>> logits;
};

// One greedy step: `batch` through `model` on `cache`, its argmax and logits to `g`.
absl::Status Step(Model& model, KvCache* cache, const std::vector<int32_t>& batch, Generation* g) {
  std::vector<float> logits;
  const absl::Status s = model.Forward(batch, cache, LogitsFor::kLast, &logits);
  if (!s.ok()) return s;
  g->tokens.push_back(Argmax(logits.data(), static_cast<int64_t>(logits.size())));
  g->logits.push_back(std::move(logits));
  return absl::OkStatus();
}

Generation GreedyWithLogits(Model& model, const std::vector<int32_t>& prompt, int n) {
  auto cache = model.NewKvCache(256).value();
  Generation g;
  std::vector<int32_t> batch = prompt;
  for (int i = 0; i < n; ++i) {
    const absl::Status s = Step(model, cache.get(), batch, &g);
    EXPECT_TRUE(s.ok()) << "step " << i << ": " << s;
    if (!s.ok()) break;
    batch = {g.tokens.back()};
  }
  return g;
}

void ExpectSameGeneration(const Generation& got, const Generation& want, const char* what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
  for (size_t step = 0; step < got.logits.size(); ++step) {
    ASSERT_EQ(got.logits[step].size(), want.logits[step].size());
    float worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < got.logits[step].size(); ++i) {
      const float d = std::fabs(got.logits[step][i] - want.logits[step][i]);
      if (!(d <= worst)) {
        worst = d;
        at = i;
      }
    }
    EXPECT_LE(worst, kLogitTolerance) << what << ": step " << step << ", logit " << at;
  }
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The F32 model on the OpenCL device (PoCL's CPU device here) through a FaultBackend,
// and on the CPU for the expected results; the test is skipped without a device.
class OpenClFallbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string skip;
    device_ = Load(kF32, Backend::kOpenCl, &skip, faults_);
    MOERT_SKIP_WITHOUT_DEVICE(skip);
    ASSERT_NE(device_.model, nullptr);
    cpu_ = Load(kF32, Backend::kCpu, &skip);
    ASSERT_NE(cpu_.model, nullptr);
  }

  // kAuto's failure policy on the device (kAuto itself opens only a GPU: the device
  // is handed to it through ModelLoadOptions::device_backend).
  void UseAutoPolicy() {
    std::string skip;
    device_ = Loaded();  // its FaultBackend lets go of faults_ first
    device_ = Load(kF32, Backend::kAuto, &skip, faults_);
    ASSERT_NE(device_.model, nullptr);
    EXPECT_EQ(device_.model->backend_stats().backend, "OpenCL");
  }

  // The CPU's greedy continuation of kRomeo.
  Generation CpuGreedy(int steps = kSteps) { return GreedyWithLogits(cpu(), kRomeo, steps); }

  // Fills the device's copy of a KV cache of `capacity` positions with another text's
  // keys and values (one device batch), so that rows a failed batch did not write are
  // wrong there, not left over by chance from an identical earlier run (PoCL hands a
  // freed buffer's memory to the next one). Returns the device batches so far, which
  // the test's own batches add to.
  uint64_t SpoilDeviceKvCache(int capacity) {
    std::vector<int32_t> other(32);
    for (size_t i = 0; i < other.size(); ++i) other[i] = static_cast<int32_t>(100 + 37 * i);
    auto cache = device().NewKvCache(capacity).value();
    std::vector<float> logits;
    const absl::Status s = device().Forward(other, cache.get(), LogitsFor::kLast, &logits);
    EXPECT_TRUE(s.ok()) << s;
    return device_batches();
  }

  // A failure injected into the device (FaultState::FailBatches); FailedPrecondition
  // once the model has no device left to fail.
  absl::Status Inject(int after_calls, int layer, int cl_error, int times = 1) {
    if (!faults_->alive) {
      return absl::FailedPreconditionError("the model has no device to inject a failure into");
    }
    faults_->FailBatches(after_calls, layer, cl_error, times);
    return absl::OkStatus();
  }

  Model& device() { return *device_.model; }
  Model& cpu() { return *cpu_.model; }
  uint64_t device_batches() const { return device_.model->backend_stats().device_batches; }

  std::shared_ptr<backend::testing::FaultState> faults_ =
      std::make_shared<backend::testing::FaultState>();
  Loaded device_;
  Loaded cpu_;
};

// One failure at the 3rd decode step, in layer 1 of 4: that step runs on the CPU (counted,
// the Status kept), the steps after it on the device again, which must upload the K/V
// rows the CPU wrote (layers 2 and 3 of that position never reached the device).
TEST_F(OpenClFallbackTest, AutoRunsAFailedDecodeStepOnTheCpuThenReturnsToTheDevice) {
  UseAutoPolicy();
  const Generation want = CpuGreedy();
  const uint64_t batches = SpoilDeviceKvCache(256);

  // Calls: the prefill, decode steps 1 and 2 run; decode step 3 fails.
  ASSERT_TRUE(Inject(3, 1, CL_OUT_OF_RESOURCES).ok());
  const Generation got = GreedyWithLogits(device(), kRomeo, kSteps);
  ExpectSameGeneration(got, want, "a failure at decode step 3");
  const BackendStats stats = device().backend_stats();
  EXPECT_EQ(stats.backend, "OpenCL");
  EXPECT_EQ(stats.fallbacks, 1u);
  EXPECT_TRUE(Contains(stats.last_fallback, "RESOURCE_EXHAUSTED")) << stats.last_fallback;
  EXPECT_TRUE(Contains(stats.last_fallback,
                       "clEnqueueNDRangeKernel(add_inplace) failed: "
                       "CL_OUT_OF_RESOURCES"))
      << stats.last_fallback;
  // Every step but the failed one ran on the device.
  EXPECT_EQ(device_batches() - batches, uint64_t{kSteps - 1});

  // And with no failure, the same model: the CPU's result again, all on the device.
  const Generation clean = GreedyWithLogits(device(), kRomeo, kSteps);
  ExpectSameGeneration(clean, want, "no failure");
  EXPECT_EQ(device().backend_stats().fallbacks, 1u);
  EXPECT_EQ(device_batches() - batches, uint64_t{2 * kSteps - 1});
}

// A failure in a prefill batch (16 tokens, all rows' logits): that batch's logits are
// the CPU's bit for bit (the CPU ran it, from the same empty cache), and the decode
// steps after it run on the device from the K/V rows the CPU wrote.
TEST_F(OpenClFallbackTest, AutoRunsAFailedPrefillOnTheCpuThenDecodesOnTheDevice) {
  UseAutoPolicy();
  const std::vector<int32_t> prompt = {1,    826, 2007, 13,  2010, 270, 1999, 275,
                                       2014, 277, 309,  261, 271,  584, 260,  1992};
  auto run = [&](Model& model, std::vector<float>* prefill_logits) {
    auto cache = model.NewKvCache(64).value();
    const absl::Status s = model.Forward(prompt, cache.get(), LogitsFor::kAll, prefill_logits);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(cache->size(), static_cast<int>(prompt.size()));
    Generation g;
    const int64_t n_vocab = model.spec().n_vocab;
    const int64_t last = static_cast<int64_t>(prompt.size()) - 1;
    std::vector<int32_t> batch = {Argmax(prefill_logits->data() + last * n_vocab, n_vocab)};
    for (int i = 0; i < kSteps; ++i) {
      const absl::Status st = Step(model, cache.get(), batch, &g);
      EXPECT_TRUE(st.ok()) << st;
      if (!st.ok()) break;
      batch = {g.tokens.back()};
    }
    return g;
  };
  std::vector<float> want_prefill, got_prefill;
  const Generation want = run(cpu(), &want_prefill);
  const uint64_t batches = SpoilDeviceKvCache(64);

  ASSERT_TRUE(Inject(0, 2, CL_MEM_OBJECT_ALLOCATION_FAILURE).ok());
  const Generation got = run(device(), &got_prefill);
  ASSERT_EQ(got_prefill.size(), want_prefill.size());
  EXPECT_EQ(
      0, std::memcmp(got_prefill.data(), want_prefill.data(), want_prefill.size() * sizeof(float)))
      << "the prefill that fell back is not the CPU's bit for bit";
  ExpectSameGeneration(got, want, "decode after a failed prefill");
  EXPECT_EQ(device().backend_stats().fallbacks, 1u);
  EXPECT_TRUE(Contains(device().backend_stats().last_fallback,
                       "CL_MEM_OBJECT_ALLOCATION_FAILURE"));
  EXPECT_EQ(device_batches() - batches, uint64_t{kSteps});
}

// A lost device fails every batch: each request falls back and is counted, the CPU's
// tokens come out, and after kDeviceFailuresBeforeCpu in a row the model gives the
// device up for good and says so.
TEST_F(OpenClFallbackTest, AutoGivesALostDeviceUpAfterFailuresInARow) {
  UseAutoPolicy();
  const Generation want = CpuGreedy();

  // The prefill runs on the device; every batch after it fails.
  ASSERT_TRUE(Inject(1, 1, CL_DEVICE_NOT_AVAILABLE, -1).ok());
  Model& model = device();
  auto cache = model.NewKvCache(256).value();
  Generation got;
  std::vector<int32_t> batch = kRomeo;
  constexpr int kGiveUp = backend::DeviceFailurePolicy::kFailuresBeforeCpu;
  for (int i = 0; i < kSteps; ++i) {
    const absl::Status s = Step(model, cache.get(), batch, &got);
    ASSERT_TRUE(s.ok()) << "step " << i << ": " << s;
    batch = {got.tokens.back()};
    const BackendStats stats = model.backend_stats();
    // One fallback per request until the model gives the device up.
    EXPECT_EQ(stats.fallbacks, static_cast<uint64_t>(std::min(i, kGiveUp))) << "step " << i;
    EXPECT_EQ(stats.backend, i < kGiveUp ? "OpenCL" : "CPU") << "step " << i;
  }
  ExpectSameGeneration(got, want, "a lost device");
  const BackendStats stats = model.backend_stats();
  EXPECT_TRUE(Contains(stats.last_fallback, "UNAVAILABLE")) << stats.last_fallback;
  EXPECT_TRUE(Contains(stats.last_fallback, "CL_DEVICE_NOT_AVAILABLE")) << stats.last_fallback;
  EXPECT_TRUE(Contains(stats.cpu_reason, StrCat("failed ", kGiveUp, " requests in a row")))
      << stats.cpu_reason;
  EXPECT_TRUE(Contains(stats.cpu_reason, "CL_DEVICE_NOT_AVAILABLE")) << stats.cpu_reason;
  EXPECT_TRUE(stats.device.empty()) << stats.device;
  EXPECT_EQ(device_batches(), 1u);
  // No device left to fail.
  EXPECT_EQ(Inject(1, 1, CL_DEVICE_NOT_AVAILABLE, -1).code(),
            absl::StatusCode::kFailedPrecondition);
  // A new sequence runs on the CPU, with the CPU's result bit for bit.
  const Generation again = GreedyWithLogits(model, kRomeo, kSteps);
  EXPECT_EQ(again.tokens, want.tokens);
  EXPECT_EQ(again.logits, want.logits);
}

// Failures that are not in a row keep the device: a success in between resets the count.
TEST_F(OpenClFallbackTest, AutoKeepsTheDeviceWhenFailuresAreNotInARow) {
  UseAutoPolicy();
  constexpr int kGiveUp = backend::DeviceFailurePolicy::kFailuresBeforeCpu;
  const Generation want = CpuGreedy(2 * kGiveUp + 2);
  Model& model = device();
  const uint64_t batches = SpoilDeviceKvCache(256);
  auto cache = model.NewKvCache(256).value();
  Generation got;
  std::vector<int32_t> batch = kRomeo;
  for (int round = 0; round < 2; ++round) {
    // kGiveUp - 1 failed requests, then one on the device. In layer 0: the device never
    // sees layers 1..3's rows of the failed positions.
    ASSERT_TRUE(Inject(0, 0, CL_OUT_OF_RESOURCES, kGiveUp - 1).ok());
    for (int i = 0; i < kGiveUp; ++i) {
      ASSERT_TRUE(Step(model, cache.get(), batch, &got).ok());
      batch = {got.tokens.back()};
    }
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(Step(model, cache.get(), batch, &got).ok());
    batch = {got.tokens.back()};
  }
  ExpectSameGeneration(got, want, "failures not in a row");
  EXPECT_EQ(model.backend_stats().backend, "OpenCL");
  EXPECT_EQ(model.backend_stats().fallbacks, static_cast<uint64_t>(2 * (kGiveUp - 1)));
  EXPECT_EQ(device_batches() - batches, 4u);
}

// Backend::kOpenCl does not fall back: the failure is the Forward call's Status, naming
// the OpenCL call and error; the cache keeps the positions it had, and the same model
// and cache carry on (retrying the step) with the CPU's result.
TEST_F(OpenClFallbackTest, OpenClBackendReturnsTheFailureAndStaysUsable) {
  const Generation want = CpuGreedy();

  Model& model = device();
  auto cache = model.NewKvCache(256).value();
  Generation got;
  std::vector<float> logits;
  // A prefill that fails: nothing cached.
  ASSERT_TRUE(Inject(0, 2, CL_OUT_OF_RESOURCES).ok());
  absl::Status s = model.Forward(kRomeo, cache.get(), LogitsFor::kLast, &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(Contains(std::string(s.message()),
                       "OpenCL: clEnqueueNDRangeKernel(add_inplace) failed: CL_OUT_OF_RESOURCES"))
      << s;
  EXPECT_EQ(cache->size(), 0);
  ASSERT_TRUE(Step(model, cache.get(), kRomeo, &got).ok());
  std::vector<int32_t> batch = {got.tokens.back()};
  // A decode step that fails (a command queue gone), then is retried.
  ASSERT_TRUE(Inject(2, 1, CL_INVALID_COMMAND_QUEUE).ok());
  for (int i = 1; i < kSteps; ++i) {
    const int before = cache->size();
    s = Step(model, cache.get(), batch, &got);
    if (i == 3) {
      EXPECT_FALSE(s.ok());
      EXPECT_TRUE(Contains(std::string(s.message()), "CL_INVALID_COMMAND_QUEUE")) << s;
      EXPECT_EQ(cache->size(), before);
      s = Step(model, cache.get(), batch, &got);
    }
    ASSERT_TRUE(s.ok()) << "step " << i << ": " << s;
    EXPECT_EQ(cache->size(), before + 1);
    batch = {got.tokens.back()};
  }
  ExpectSameGeneration(got, want, "kOpenCl after two failures");
  EXPECT_EQ(model.backend_stats().backend, "OpenCL");
  EXPECT_EQ(model.backend_stats().fallbacks, 0u);
  EXPECT_EQ(device_batches(), uint64_t{kSteps});
}

TEST(OpenClForwardTest, BackendNamesParse) {
  EXPECT_EQ(ParseBackend("cpu").value(), Backend::kCpu);
  EXPECT_EQ(ParseBackend("opencl").value(), Backend::kOpenCl);
  EXPECT_EQ(ParseBackend("auto").value(), Backend::kAuto);
  EXPECT_EQ(ParseBackend("gpu").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moert::model
