// Tests of the models moert-synth writes, as the runtime reads them: the spec and the
// vocabulary load, text tokenizes and decodes back, routing spreads tokens over the
// experts, weights have the intended scale, and a seed fixes the file's bytes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/strings.h"
#include "format/arch.h"
#include "format/dequant.h"
#include "format/gguf.h"
#include "format/model_spec.h"
#include "tokenizer/tokenizer.h"

namespace moert {
namespace {

using format::GgufFile;
using format::GgufTensorInfo;
using format::TensorKind;
using format::TensorWeightName;

// Runs moert-synth with `args`; its exit status.
int Synth(const std::string& args) {
  const std::string command = StrCat(MOERT_SYNTH_COMMAND, " ", args, " 2>/dev/null");
  return std::system(command.c_str());
}

// Unique per process: ctest runs each test of this binary as its own process, in
// parallel.
std::string TempPath(const std::string& name) {
  return StrCat(::testing::TempDir(), "/", getpid(), "_", name);
}

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

std::vector<float> Values(const GgufFile& file, const std::string& name) {
  const GgufTensorInfo* t = file.FindTensor(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  std::vector<float> out(t->n_elements);
  absl::Status status = format::Dequantize(t->type, file.TensorData(*t), out);
  EXPECT_TRUE(status.ok()) << name << ": " << status;
  return out;
}

// One tiny q8_0 model for the tests that only read it.
class SynthTiny : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(TempPath("synth_test_tiny.gguf"));
    ASSERT_EQ(Synth(StrCat("--shape tiny --type q8_0 --seed 7 --threads 2 -o ", *path_)), 0);
    auto file = GgufFile::Open(*path_);
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = file->release();
  }
  static void TearDownTestSuite() {
    delete file_;
    file_ = nullptr;
    std::filesystem::remove(*path_);
    delete path_;
  }
  void SetUp() override { ASSERT_NE(file_, nullptr); }

  static std::string* path_;
  static GgufFile* file_;
};

std::string* SynthTiny::path_ = nullptr;
GgufFile* SynthTiny::file_ = nullptr;

TEST_F(SynthTiny, SpecIsTheOracleModelsShape) {
  auto spec = format::ReadModelSpec(*file_);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->arch->arch, format::Arch::kLlama);
  EXPECT_EQ(spec->n_vocab, 2048u);
  EXPECT_EQ(spec->n_embd, 256u);
  EXPECT_EQ(spec->n_layer, 4u);
  EXPECT_EQ(spec->n_head, 8u);
  EXPECT_EQ(spec->n_head_kv, 4u);
  EXPECT_EQ(spec->n_ctx_train, 256u);
  EXPECT_EQ(spec->n_expert, 8u);
  EXPECT_EQ(spec->n_expert_used, 2u);
  EXPECT_EQ(spec->n_ff_expert, 512u);
  EXPECT_FALSE(spec->tied_embeddings);
  EXPECT_EQ(file_->FindTensor("token_embd.weight")->type, format::GgmlType::kQ8_0);
  EXPECT_EQ(file_->FindTensor("blk.0.ffn_gate_inp.weight")->type, format::GgmlType::kF32);
  EXPECT_EQ(file_->FindTensor("blk.0.attn_norm.weight")->type, format::GgmlType::kF32);
}

TEST_F(SynthTiny, TextTokenizesWithMergesAndDecodesBack) {
  auto tokenizer = tokenizer::Tokenizer::FromGguf(*file_);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(tokenizer->vocab().size(), 2048);
  // Words merge into pieces: far fewer tokens than bytes.
  const std::string words = "the quick brown fox jumps over the lazy dog";
  EXPECT_LT(tokenizer->Encode(words, /*add_special=*/false).size(), words.size() * 2 / 3);
  // Digits, punctuation and non-ASCII bytes (byte fallback) decode back.
  const std::string text = "the quick brown fox, 42 \xC3\xA9t\xC3\xA9s!";
  std::vector<tokenizer::TokenId> ids = tokenizer->Encode(text, /*add_special=*/true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 1);  // BOS
  EXPECT_EQ(tokenizer->Decode(std::span(ids).subspan(1)), text);
}

// Router logits of unit-RMS hidden states (what the RMSNorm before the router gives,
// its weight being 1): top-2 over many tokens must reach most experts, and none may
// take most of the picks.
TEST_F(SynthTiny, RoutingSpreadsOverTheExperts) {
  constexpr int kEmbd = 256, kExperts = 8, kTokens = 64;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int il = 0; il < 4; ++il) {
    const std::vector<float> w = Values(*file_, TensorWeightName(TensorKind::kFfnGateInp, il));
    ASSERT_EQ(w.size(), static_cast<size_t>(kEmbd * kExperts));
    std::vector<int> picks(kExperts, 0);
    for (int t = 0; t < kTokens; ++t) {
      std::vector<float> h(kEmbd);
      for (float& v : h) v = normal(rng);
      std::vector<float> logits(kExperts, 0.0f);
      for (int e = 0; e < kExperts; ++e) {
        for (int j = 0; j < kEmbd; ++j) logits[e] += w[e * kEmbd + j] * h[j];
      }
      std::vector<int> order(kExperts);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                        [&](int a, int b) { return logits[a] > logits[b]; });
      ++picks[order[0]];
      ++picks[order[1]];
    }
    const int used =
        static_cast<int>(std::count_if(picks.begin(), picks.end(), [](int p) { return p > 0; }));
    EXPECT_GT(used, kExperts / 2) << "layer " << il;
    EXPECT_LT(*std::max_element(picks.begin(), picks.end()), kTokens) << "layer " << il;
  }
}

TEST_F(SynthTiny, WeightsHaveTheIntendedScale) {
  for (const std::string name : {"blk.0.ffn_gate_exps.weight", "blk.2.attn_q.weight"}) {
    const std::vector<float> w = Values(*file_, name);
    double sum = 0, sum2 = 0;
    for (float v : w) {
      ASSERT_TRUE(std::isfinite(v));
      sum += v;
      sum2 += static_cast<double>(v) * v;
    }
    const double mean = sum / w.size();
    const double std = std::sqrt(sum2 / w.size() - mean * mean);
    EXPECT_NEAR(mean, 0.0, 0.002) << name;
    EXPECT_NEAR(std, 1.0 / 16.0, 0.002) << name;  // 1 / sqrt(fan_in 256)
  }
  const std::vector<float> down = Values(*file_, "blk.1.ffn_down_exps.weight");
  double sum2 = 0;
  for (float v : down) sum2 += static_cast<double>(v) * v;
  EXPECT_NEAR(std::sqrt(sum2 / down.size()), 1.0 / std::sqrt(512.0), 0.002);
  for (float v : Values(*file_, "blk.3.ffn_norm.weight")) ASSERT_EQ(v, 1.0f);
}

// The bytes depend on the seed only: not on the thread count.
TEST(Synth, SeedFixesTheBytes) {
  const std::string a = TempPath("synth_test_a.gguf");
  const std::string b = TempPath("synth_test_b.gguf");
  const std::string c = TempPath("synth_test_c.gguf");
  ASSERT_EQ(Synth(StrCat("--shape tiny --type q4_0 --layers 1 --seed 5 --threads 1 -o ", a)), 0);
  ASSERT_EQ(Synth(StrCat("--shape tiny --type q4_0 --layers 1 --seed 5 --threads 3 -o ", b)), 0);
  ASSERT_EQ(Synth(StrCat("--shape tiny --type q4_0 --layers 1 --seed 6 --threads 1 -o ", c)), 0);
  const std::vector<uint8_t> bytes_a = ReadAll(a);
  EXPECT_FALSE(bytes_a.empty());
  EXPECT_EQ(bytes_a, ReadAll(b));
  const std::vector<uint8_t> bytes_c = ReadAll(c);
  EXPECT_EQ(bytes_c.size(), bytes_a.size());
  EXPECT_NE(bytes_c, bytes_a);
  for (const std::string& path : {a, b, c}) std::filesystem::remove(path);
}

// Every type the tool offers gives a model that loads.
TEST(Synth, EveryTypeLoads) {
  for (const char* type :
       {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_K", "q6_K"}) {
    const std::string path = TempPath(StrCat("synth_test_", type, ".gguf"));
    ASSERT_EQ(Synth(StrCat("--shape tiny --layers 1 --type ", type, " -o ", path)), 0) << type;
    auto file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok()) << type << ": " << file.status();
    auto spec = format::ReadModelSpec(**file);
    EXPECT_TRUE(spec.ok()) << type << ": " << spec.status();
    EXPECT_EQ(format::GgmlTypeName((*file)->FindTensor("blk.0.ffn_up_exps.weight")->type),
              std::string_view(type));
    std::filesystem::remove(path);
  }
}

}  // namespace
}  // namespace moert
