// Tests of moert-pack --dense-fallback (tools/dense_fallback.h): the routing
// frequencies, and a pack of the q4_0 oracle whose fallback tensors are there with the
// experts' shapes and type, are the frequency-weighted mean of the experts within
// Q4_0's error (the mean recomputed here from the dequantized experts and the
// frequencies the tool stored, which the library recomputes from the same text), and
// run in the model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "core/strings.h"
#include "dense_fallback.h"
#include "format/arch.h"
#include "format/dequant.h"
#include "format/ggml_types.h"
#include "format/gguf.h"
#include "format/model_spec.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace moert {
namespace {

using format::GgmlType;
using format::GgufFile;
using format::TensorKind;
using format::TensorWeightName;
using tools::RoutingFrequencies;

const std::string kOracle = StrCat(MOERT_SHARED_DIR, "/models/tiny-moe-shakespeare-q4_0.gguf");
constexpr int kCtx = 128;
constexpr int kChunks = 2;

TEST(RoutingFrequenciesTest, WeighsEachExpertByItsRoutingWeight) {
  RoutingFrequencies f(/*n_layer=*/2, /*n_expert=*/3);
  // Two tokens of two slots in layer 0; the second token's second slot is empty.
  const int experts[] = {0, 1, 1, -1};
  const float weights[] = {0.75f, 0.25f, 1.0f, 0.0f};
  f.Observe(0, 2, 2, experts, weights);
  const std::vector<double> layer0 = f.Of(0);
  ASSERT_EQ(layer0.size(), 3u);
  EXPECT_DOUBLE_EQ(layer0[0], 0.375);
  EXPECT_DOUBLE_EQ(layer0[1], 0.625);
  EXPECT_DOUBLE_EQ(layer0[2], 0.0);
  EXPECT_EQ(f.tokens(0), 2);
  // No token reached layer 1: uniform.
  for (double x : f.Of(1)) EXPECT_DOUBLE_EQ(x, 1.0 / 3);
  const std::vector<float> all = f.All();
  ASSERT_EQ(all.size(), 6u);
  EXPECT_FLOAT_EQ(all[1], 0.625f);
  EXPECT_FLOAT_EQ(all[4], 1.0f / 3);
}

TEST(RoutingFrequenciesTest, FallbackTypes) {
  EXPECT_EQ(tools::FallbackType(GgmlType::kQ4_0, 256), GgmlType::kQ4_0);
  EXPECT_EQ(tools::FallbackType(GgmlType::kQ4_K, 256), GgmlType::kQ4_0);
  EXPECT_EQ(tools::FallbackType(GgmlType::kQ8_0, 256), GgmlType::kQ8_0);
  EXPECT_EQ(tools::FallbackType(GgmlType::kF16, 256), GgmlType::kQ8_0);
  EXPECT_EQ(tools::FallbackType(GgmlType::kQ4_0, 100), GgmlType::kF32);
}

std::string TempPath(const std::string& name) {
  return StrCat(::testing::TempDir(), "/", getpid(), "_", name);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<float> Dequantized(const GgufFile& file, const std::string& name) {
  const format::GgufTensorInfo* t = file.FindTensor(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  std::vector<float> out(static_cast<size_t>(t->n_elements));
  EXPECT_TRUE(format::Dequantize(t->type, file.TensorData(*t), out).ok()) << name;
  return out;
}

// Packs the q4_0 oracle once with --dense-fallback over the first part of valid.txt.
// Slow under the emulator (four passes of the reference model): the *SlowTest suites
// run on x86 only.
class DenseFallbackPackSlowTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    calib_ = new std::string(TempPath("calib.txt"));
    packed_ = new std::string(TempPath("fallback.gguf"));
    std::ofstream(*calib_) << ReadAll(StrCat(MOERT_SHARED_DIR, "/models/valid.txt")).substr(0, 2400);
    const std::string command =
        StrCat(MOERT_PACK_COMMAND, " ", kOracle, " ", *packed_, " --dense-fallback --calib ",
               *calib_, " -c ", kCtx, " --chunks ", kChunks, " -t 2 2>/dev/null");
    stdout_ = new std::string();
    std::FILE* pipe = popen(command.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    char buffer[256];
    while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) *stdout_ += buffer;
    rc_ = pclose(pipe);
  }
  static void TearDownTestSuite() {
    std::remove(packed_->c_str());
    std::remove(calib_->c_str());
  }

  void SetUp() override {
    ASSERT_EQ(rc_, 0) << *stdout_;
    auto in = GgufFile::Open(kOracle);
    ASSERT_TRUE(in.ok()) << in.status();
    in_ = std::move(*in);
    auto out = GgufFile::Open(*packed_);
    ASSERT_TRUE(out.ok()) << out.status();
    out_ = std::move(*out);
    auto spec = format::ReadModelSpec(*in_);
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = *spec;
  }

  static std::string* calib_;
  static std::string* packed_;
  static std::string* stdout_;
  static int rc_;
  std::unique_ptr<GgufFile> in_, out_;
  format::ModelSpec spec_;
};

std::string* DenseFallbackPackSlowTest::calib_ = nullptr;
std::string* DenseFallbackPackSlowTest::packed_ = nullptr;
std::string* DenseFallbackPackSlowTest::stdout_ = nullptr;
int DenseFallbackPackSlowTest::rc_ = -1;

TEST_F(DenseFallbackPackSlowTest, WritesTheTensorsWithTheExpertsShapesInQ4_0) {
  const uint64_t n_embd = spec_.n_embd, n_ff = spec_.n_ff_expert;
  for (int il = 0; il < static_cast<int>(spec_.n_layer); ++il) {
    for (TensorKind kind : {TensorKind::kFfnGateDenseFallback, TensorKind::kFfnUpDenseFallback,
                            TensorKind::kFfnDownDenseFallback}) {
      const std::string name = TensorWeightName(kind, il);
      const format::GgufTensorInfo* t = out_->FindTensor(name);
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(t->type, GgmlType::kQ4_0) << name;
      const std::vector<uint64_t> dims = kind == TensorKind::kFfnDownDenseFallback
                                             ? std::vector<uint64_t>{n_ff, n_embd}
                                             : std::vector<uint64_t>{n_embd, n_ff};
      EXPECT_EQ(t->dims, dims) << name;
    }
  }
  // The three perplexities, the fallback's above the routed experts'.
  double before = 0, fallback = 0;
  ASSERT_EQ(std::sscanf(stdout_->c_str(), "PPL before = %lf", &before), 1) << *stdout_;
  const size_t at = stdout_->find("PPL dense fallback = ");
  ASSERT_NE(at, std::string::npos) << *stdout_;
  ASSERT_EQ(std::sscanf(stdout_->c_str() + at, "PPL dense fallback = %lf", &fallback), 1);
  EXPECT_TRUE(std::isfinite(fallback));
  EXPECT_GT(fallback, before);
}

TEST_F(DenseFallbackPackSlowTest, StoresTheFrequenciesOfTheCalibrationText) {
  auto stored = out_->GetFloatArray(tools::kDenseFallbackFrequencyKey);
  ASSERT_TRUE(stored.ok()) << stored.status();
  const size_t n_expert = spec_.n_expert;
  ASSERT_EQ(stored->size(), spec_.n_layer * n_expert);
  // The library over the same text gives the same numbers.
  auto tokenizer = tokenizer::Tokenizer::FromGguf(*in_);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::vector<int32_t> tokens = tokenizer->Encode(ReadAll(*calib_), true, false);
  const int32_t bos = tokenizer->vocab().add_bos() ? tokenizer->vocab().bos() : -1;
  auto measured = tools::MeasureRoutingFrequencies(*in_, tokens, kCtx, kChunks, bos, 2);
  ASSERT_TRUE(measured.ok()) << measured.status();
  EXPECT_EQ(measured->frequencies.tokens(0), kCtx * kChunks);
  const std::vector<float> again = measured->frequencies.All();
  ASSERT_EQ(again.size(), stored->size());
  double most = 0;
  for (size_t il = 0; il < spec_.n_layer; ++il) {
    double sum = 0;
    for (size_t e = 0; e < n_expert; ++e) {
      const float f = (*stored)[il * n_expert + e];
      EXPECT_NEAR(f, again[il * n_expert + e], 1e-6) << "layer " << il << " expert " << e;
      sum += f;
      most = std::max(most, static_cast<double>(f));
    }
    EXPECT_NEAR(sum, 1.0, 1e-5) << "layer " << il;
  }
  // A trained router is far from uniform: some expert takes well over 1/8.
  EXPECT_GT(most, 1.5 / static_cast<double>(n_expert));
}

// The fallback of one layer is the frequency-weighted mean of its dequantized experts
// within Q4_0's error (at most an eighth of its block's largest magnitude), and nearer
// to it than to the plain mean.
TEST_F(DenseFallbackPackSlowTest, IsTheFrequencyWeightedMeanOfTheExperts) {
  const int layer = 1;
  auto stored = out_->GetFloatArray(tools::kDenseFallbackFrequencyKey);
  ASSERT_TRUE(stored.ok()) << stored.status();
  const size_t n_expert = spec_.n_expert;
  const std::span<const float> freq(stored->data() + layer * n_expert, n_expert);
  const TensorKind pairs[3][2] = {
      {TensorKind::kFfnGateExps, TensorKind::kFfnGateDenseFallback},
      {TensorKind::kFfnUpExps, TensorKind::kFfnUpDenseFallback},
      {TensorKind::kFfnDownExps, TensorKind::kFfnDownDenseFallback}};
  for (const auto& [exps, fallback] : pairs) {
    const std::vector<float> experts = Dequantized(*in_, TensorWeightName(exps, layer));
    const std::vector<float> got = Dequantized(*out_, TensorWeightName(fallback, layer));
    const size_t each = experts.size() / n_expert;
    ASSERT_EQ(got.size(), each);
    std::vector<double> want(each, 0.0), plain(each, 0.0);
    for (size_t e = 0; e < n_expert; ++e) {
      for (size_t i = 0; i < each; ++i) {
        want[i] += static_cast<double>(freq[e]) * experts[e * each + i];
        plain[i] += experts[e * each + i] / static_cast<double>(n_expert);
      }
    }
    double err2 = 0, plain2 = 0;
    for (size_t b = 0; b < each; b += 32) {
      double amax = 0;
      for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::abs(want[i]));
      for (size_t i = b; i < b + 32; ++i) {
        ASSERT_LE(std::abs(got[i] - want[i]), amax / 8 * 1.01 + 1e-6)
            << TensorWeightName(fallback, layer) << " value " << i;
        err2 += (got[i] - want[i]) * (got[i] - want[i]);
        plain2 += (got[i] - plain[i]) * (got[i] - plain[i]);
      }
    }
    EXPECT_LT(err2, plain2) << TensorWeightName(fallback, layer);
  }
}

TEST_F(DenseFallbackPackSlowTest, RunsInTheModelWithAnExpertPool) {
  model::ModelLoadOptions options;
  options.threads = 2;
  options.expert_pool_fraction = 0.25;
  auto model = model::Model::Load(*out_, options);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE((*model)->has_dense_fallback());
  ASSERT_TRUE((*model)->SetDenseFallback(true).ok());
  auto cache = (*model)->NewKvCache(64);
  ASSERT_TRUE(cache.ok()) << cache.status();
  std::vector<float> logits;
  const std::vector<int32_t> prompt = {1, 826, 2007};  // "ROMEO:"
  ASSERT_TRUE((*model)->Forward(prompt, cache->get(), model::LogitsFor::kLast, &logits).ok());
  ASSERT_EQ(logits.size(), spec_.n_vocab);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  EXPECT_EQ((*model)->memory_stats().pool.misses, 0u);
}

}  // namespace
}  // namespace moert
