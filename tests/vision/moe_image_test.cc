// An image on a MoE language model of the oracle's width (moert-synth's minicpmv-moe:
// qwen2moe, n_embd 3584, 8 experts top-2, the oracle's vocabulary) with the oracle's
// projector: with every expert resident, in an expert pool, and with the modality bias
// moert-pack --modality-bias computes. With lambda 0 the pool and the bias change
// nothing, bit for bit; with lambda > 0 the bias moves image turns' routing and leaves
// text turns' alone. Slow (a 3584-wide MoE and the 330 MB projector): the x86 step.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "minicpmv_oracle.h"
#include "modality_calib.h"
#include "moert/runtime.h"
#include "synth.h"
#include "tokenizer/tokenizer.h"
#include "vision/oracle_files.h"

namespace moert {
namespace {

using vision::testing::kOracleDir;

class MoeImageSlowTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const vision::testing::OracleFiles& files = vision::testing::GetOracleFiles();
    ASSERT_FALSE(files.mmproj.empty());
    mmproj_ = new std::string(files.mmproj);
    moe_ = new std::string(files.llm + ".moe.gguf");
    bias_ = new std::string(files.llm + ".moe.bias");
    synth::SynthOptions o;
    o.shape = synth::FindShape("minicpmv-moe");
    ASSERT_NE(o.shape, nullptr);
    o.type = format::GgmlType::kQ4_0;
    o.threads = 2;
    auto vocab = synth::ReadOracleVocab(kOracleDir + "vocab.json");
    ASSERT_TRUE(vocab.ok()) << vocab.status();
    synth::SynthOptions::BpeVocab bpe;
    bpe.tokens = vocab->tokens;
    bpe.types = vocab->token_type;
    bpe.merges = vocab->merges;
    bpe.bos = 376;
    bpe.eos = 378;
    o.bpe_vocab = bpe;
    auto model = synth::SynthModel::Plan(o);
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_TRUE(model->Write(*moe_).ok());
  }
  static void TearDownTestSuite() {
    delete mmproj_;
    delete moe_;
    delete bias_;
  }

  static std::unique_ptr<MoERuntime> Runtime(double pool, float lambda, bool bias) {
    RuntimeOptions options;
    options.threads = 2;
    options.context_length = 1024;
    options.expert_pool_fraction = pool;
    options.router_alpha = 0;  // residency does not steer routing: pooled == resident
    options.hot_set = false;
    options.modality_lambda = lambda;
    if (bias) options.modality_bias_path = *bias_;
    std::unique_ptr<MoERuntime> runtime;
    EXPECT_TRUE(MoERuntime::Create(options, &runtime).ok());
    Status s = runtime->LoadModel(*moe_);
    EXPECT_TRUE(s.ok()) << s.ToString();
    s = runtime->LoadMmproj(*mmproj_);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return runtime;
  }

  struct Turn {
    std::vector<int32_t> tokens;
    GenerationStats stats;
  };
  static Turn Generate(MoERuntime& runtime, bool image) {
    std::unique_ptr<Session> session;
    EXPECT_TRUE(runtime.CreateSession(&session).ok());
    GenerateRequest request;
    request.prompt = image ? "Describe the image." : "Describe the picture in words.";
    if (image) request.images = {Image::FromFile(kOracleDir + "test_small.png")};
    request.temperature = 0;
    request.max_tokens = 8;
    GenerateResult result;
    Status s = session->Generate(request, {}, &result);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return {result.tokens, session->Stats()};
  }

  static std::string* mmproj_;
  static std::string* moe_;
  static std::string* bias_;
};

std::string* MoeImageSlowTest::mmproj_ = nullptr;
std::string* MoeImageSlowTest::moe_ = nullptr;
std::string* MoeImageSlowTest::bias_ = nullptr;

TEST_F(MoeImageSlowTest, ImagesRunOnAMoeWithAPoolAndTheModalityBias) {
  // The bias from routing statistics over text and the three images.
  auto file = format::GgufFile::Open(*moe_);
  ASSERT_TRUE(file.ok());
  auto tok = tokenizer::Tokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok());
  tools::ModalityCalibOptions calib;
  calib.text_tokens = tok->Encode(
      "ROMEO: But soft, what light through yonder window breaks? It is the east, and Juliet "
      "is the sun. Arise, fair sun, and kill the envious moon.",
      false, false);
  calib.n_ctx = 64;
  calib.mmproj = *mmproj_;
  calib.images = {kOracleDir + "test_small.png"};
  calib.threads = 2;
  calib.clip = 3.0f;
  auto bias = tools::ComputeModalityBias(**file, calib);
  ASSERT_TRUE(bias.ok()) << bias.status();
  ASSERT_EQ(bias->bias.size(), 2u * 8u);
  EXPECT_EQ(bias->image_token_layers, 2u * 64u);
  EXPECT_EQ(bias->text_token_layers,
            2u * (calib.text_tokens.size() + (87 - 64)));  // the image turn's text too
  float largest = 0;
  for (float b : bias->bias) {
    EXPECT_TRUE(std::isfinite(b));
    EXPECT_LE(std::fabs(b), 3.0f);
    largest = std::max(largest, std::fabs(b));
  }
  EXPECT_GT(largest, 0.1f);  // random routers do not route both modalities alike
  {
    std::ofstream out(*bias_);
    for (float b : bias->bias) out << b << "\n";
  }

  std::unique_ptr<MoERuntime> resident = Runtime(0, 0, false);
  const Turn want = Generate(*resident, true);
  const Turn want_text = Generate(*resident, false);
  ASSERT_EQ(want.tokens.size(), 8u);
  EXPECT_EQ(want.stats.image_tokens, 64);
  EXPECT_EQ(want.stats.expert_pool_bytes, 0);

  // A pool of half the experts, the bias loaded, lambda 0: the same tokens.
  std::unique_ptr<MoERuntime> pooled = Runtime(0.5, 0, true);
  const Turn got = Generate(*pooled, true);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_GT(got.stats.expert_pool_bytes, 0);
  EXPECT_LT(got.stats.expert_hit_rate, 1.0);
  EXPECT_GT(got.stats.expert_bytes_read_per_token, 0);
  EXPECT_EQ(got.stats.router_changed_fraction, 0);

  // Lambda 4: image turns route differently; a text turn (share 0) does not.
  std::unique_ptr<MoERuntime> biased = Runtime(0.5, 4.0f, true);
  const Turn image = Generate(*biased, true);
  EXPECT_GT(image.stats.router_changed_fraction, 0);
  EXPECT_NEAR(image.stats.image_share, 64.0 / 87.0, 1e-6);
  const Turn text = Generate(*biased, false);
  EXPECT_EQ(text.stats.router_changed_fraction, 0);
  EXPECT_EQ(text.stats.image_share, 0);
  EXPECT_EQ(text.tokens, want_text.tokens);
}

}  // namespace
}  // namespace moert
