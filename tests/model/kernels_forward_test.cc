// The forward pass on the integer microkernels (weights repacked to W4/W8 at load,
// activations quantized to A8) against the oracle models: every ISA variant gives the
// scalar kernels' logits bit for bit, batches equal token-by-token decoding, and
// against the fp32 reference path the top-1 token and the perplexity barely move.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/oracle_file.h"
#include "format/gguf.h"
#include "kernels/config.h"
#include "model/model.h"
#include "model/perplexity.h"
#include "tokenizer/tokenizer.h"

namespace moert::model {
namespace {

const std::string kModels = std::string(MOERT_SHARED_DIR) + "/models/";
constexpr int kVocab = 2048;
constexpr int32_t kBos = 1;

const format::GgufFile& File(const std::string& name) { return test_util::OracleFile(name); }

std::unique_ptr<Model> Load(const std::string& name, bool kernels,
                            kernels::Isa isa = kernels::Isa::kScalar, int threads = 1) {
  ModelLoadOptions options;
  options.threads = threads;
  options.quantized_kernels = kernels;
  if (kernels) options.isa = isa;
  auto model = Model::Load(File(name), options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

const std::vector<int32_t>& ValidTokens() {
  static const std::vector<int32_t>* tokens = [] {
    auto tok = tokenizer::Tokenizer::FromGguf(File("tiny-moe-shakespeare-q4_0.gguf"));
    EXPECT_TRUE(tok.ok());
    std::ifstream in(kModels + "valid.txt");
    std::stringstream text;
    text << in.rdbuf();
    return new std::vector<int32_t>(tok->Encode(text.str(), true, false));
  }();
  return *tokens;
}

// All logits of a llama-perplexity chunk: 128 tokens, BOS first.
std::vector<float> ChunkLogits(Model& model, int chunk) {
  std::vector<int32_t> ids(ValidTokens().begin() + chunk * 128,
                           ValidTokens().begin() + (chunk + 1) * 128);
  ids[0] = kBos;
  auto cache = model.NewKvCache(128);
  EXPECT_TRUE(cache.ok());
  std::vector<float> logits;
  absl::Status s = model.Forward(ids, cache->get(), LogitsFor::kAll, &logits);
  EXPECT_TRUE(s.ok()) << s;
  return logits;
}

std::string IsaLabel(kernels::Isa isa) { return kernels::IsaName(isa); }

class KernelsForwardTest : public ::testing::TestWithParam<std::string> {};

// Same integer arithmetic and the same float order on every ISA: the same bits.
TEST_P(KernelsForwardTest, EveryIsaMatchesScalarKernelsBitForBit) {
  const std::string name = GetParam();
  std::unique_ptr<Model> scalar = Load(name, true, kernels::Isa::kScalar);
  ASSERT_NE(scalar, nullptr);
  const std::vector<float> want = ChunkLogits(*scalar, 3);
  int compared = 0;
  for (kernels::Isa isa : kernels::AvailableIsas()) {
    if (isa == kernels::Isa::kScalar) continue;
    std::unique_ptr<Model> model = Load(name, true, isa, 2);
    ASSERT_NE(model, nullptr);
    const std::vector<float> got = ChunkLogits(*model, 3);
    ASSERT_EQ(got.size(), want.size());
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
    EXPECT_EQ(differ, 0u) << name << ": " << IsaLabel(isa) << " differs from scalar in "
                          << differ << " of " << got.size() << " logits";
    ++compared;
  }
  std::printf("%s: %d ISA variant(s) compared with the scalar kernels\n", name.c_str(),
              compared);
}

TEST_P(KernelsForwardTest, PrefillEqualsDecodeAndThreadsDoNotMatter) {
  const std::string name = GetParam();
  std::unique_ptr<Model> one = Load(name, true, kernels::AvailableIsas().back(), 1);
  std::unique_ptr<Model> two = Load(name, true, kernels::AvailableIsas().back(), 2);
  ASSERT_NE(one, nullptr);
  ASSERT_NE(two, nullptr);
  const std::vector<int32_t> ids(ValidTokens().begin(), ValidTokens().begin() + 24);
  auto batch_cache = two->NewKvCache(24);
  std::vector<float> all;
  ASSERT_TRUE(two->Forward(ids, batch_cache->get(), LogitsFor::kAll, &all).ok());
  auto step_cache = one->NewKvCache(24);
  std::vector<float> step;
  size_t differ = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    ASSERT_TRUE(one->Forward({&ids[t], 1}, step_cache->get(), LogitsFor::kLast, &step).ok());
    for (int i = 0; i < kVocab; ++i) differ += step[i] != all[t * kVocab + i];
  }
  EXPECT_EQ(differ, 0u) << name << ": decode on 1 thread vs a batch on 2 threads";
}

// The slow tests' models, loaded once per test binary: the kernels (the best ISA) and
// the fp32 reference path of each oracle model, one thread each: the two run side by
// side (Top1Agreements), which keeps both cores busy without two pools spinning for
// them, and the logits do not depend on the thread count.
Model* SharedModel(const std::string& name, bool kernels) {
  static auto* models = new std::map<std::pair<std::string, bool>, std::unique_ptr<Model>>();
  std::unique_ptr<Model>& slot = (*models)[{name, kernels}];
  if (slot == nullptr) {
    slot = kernels ? Load(name, true, kernels::AvailableIsas().back(), 1)
                   : Load(name, false, kernels::Isa::kScalar, 1);
  }
  return slot.get();
}

// Per chunk of valid.txt, at how many of its 63 scored positions the kernels' top-1
// token is the reference path's: each chunk computed once per test binary, so the
// prefix test and the whole-file test share their first chunks.
int Top1Agreements(const std::string& name, int chunk) {
  static auto* agreements = new std::map<std::string, std::vector<int>>();
  std::vector<int>& done = (*agreements)[name];
  ValidTokens();  // made here, not in two threads at once
  while (static_cast<int>(done.size()) <= chunk) {
    Model* fast = SharedModel(name, true);
    Model* ref = SharedModel(name, false);
    if (fast == nullptr || ref == nullptr) return 0;
    const int c = static_cast<int>(done.size());
    std::vector<float> a;
    std::thread kernels_thread([&] { a = ChunkLogits(*fast, c); });
    const std::vector<float> b = ChunkLogits(*ref, c);
    kernels_thread.join();
    int agree = 0;
    for (int pos = 64; pos < 127; ++pos) {
      const float* pa = a.data() + pos * kVocab;
      const float* pb = b.data() + pos * kVocab;
      agree += (std::max_element(pa, pa + kVocab) - pa) == (std::max_element(pb, pb + kVocab) - pb);
    }
    done.push_back(agree);
  }
  return done[static_cast<size_t>(chunk)];
}

// The kernels quantize activations to int8 and the reference does not: the top-1
// token must agree at >= 97% of the scored positions (here the first 6 chunks of
// valid.txt; the full file is the slow test below).
void ExpectTop1Agreement(const std::string& name, int chunks) {
  ASSERT_NE(SharedModel(name, true), nullptr);
  ASSERT_NE(SharedModel(name, false), nullptr);
  int64_t agree = 0, scored = 0;
  for (int c = 0; c < chunks; ++c) {
    agree += Top1Agreements(name, c);
    scored += 63;
  }
  const double rate = static_cast<double>(agree) / static_cast<double>(scored);
  std::printf("%s: top-1 agrees with the fp32 reference path at %lld of %lld positions (%.2f%%)\n",
              name.c_str(), static_cast<long long>(agree), static_cast<long long>(scored),
              100 * rate);
  EXPECT_GE(rate, 0.97) << name;
}

// The prefix checks below take minutes under ASan and qemu, where the kernels' bits
// are already checked against the scalar ones above: x86 only (label `slow`).
class KernelsForwardPrefixSlowTest : public KernelsForwardTest {};

TEST_P(KernelsForwardPrefixSlowTest, Top1AgreesWithReferencePath) {
  ExpectTop1Agreement(GetParam(), 6);
}

// Perplexity over the first `max_chunks` chunks: the kernels against the reference
// path, within 1%.
void ExpectPerplexityPrefixNearReferencePath(const std::string& name, int max_chunks) {
  Model* fast = SharedModel(name, true);
  ASSERT_NE(fast, nullptr);
  PerplexityOptions options;
  options.n_ctx = 128;
  options.bos = kBos;
  options.max_chunks = max_chunks;
  auto fast_ppl = ComputePerplexity(*fast, ValidTokens(), options);
  ASSERT_TRUE(fast_ppl.ok()) << fast_ppl.status();
  Model* ref = SharedModel(name, false);
  ASSERT_NE(ref, nullptr);
  auto ref_ppl = ComputePerplexity(*ref, ValidTokens(), options);
  ASSERT_TRUE(ref_ppl.ok()) << ref_ppl.status();
  std::printf("%s, first %d chunks: kernels PPL %.4f, reference path %.4f\n", name.c_str(),
              max_chunks, fast_ppl->ppl, ref_ppl->ppl);
  EXPECT_NEAR(fast_ppl->ppl, ref_ppl->ppl, 0.01 * ref_ppl->ppl);
}

TEST_P(KernelsForwardPrefixSlowTest, PerplexityPrefixNearReferencePath) {
  ExpectPerplexityPrefixNearReferencePath(GetParam(), 4);
}

std::string OracleName(const ::testing::TestParamInfo<std::string>& param_info) {
  return param_info.param.find("q4_0") != std::string::npos ? "Q4_0" : "Q8_0";
}
INSTANTIATE_TEST_SUITE_P(Oracle, KernelsForwardTest,
                         ::testing::Values("tiny-moe-shakespeare-q4_0.gguf",
                                           "tiny-moe-shakespeare-q8_0.gguf"),
                         OracleName);
INSTANTIATE_TEST_SUITE_P(Oracle, KernelsForwardPrefixSlowTest,
                         ::testing::Values("tiny-moe-shakespeare-q4_0.gguf",
                                           "tiny-moe-shakespeare-q8_0.gguf"),
                         OracleName);

// The whole of valid.txt (slow: the x86 CI step only, label `slow`). The full
// perplexity of this path against llama.cpp is checked by the tool tests
// tools.perplexity.full_q4_0 / full_q8_0 (moert-perplexity runs these kernels; within
// 0.5%), so it is not repeated here.
TEST(KernelsForwardSlowTest, FullTop1AgreementWithReferencePath) {
  const int chunks = static_cast<int>(ValidTokens().size() / 128);
  for (const char* name : {"tiny-moe-shakespeare-q4_0.gguf", "tiny-moe-shakespeare-q8_0.gguf"}) {
    ExpectTop1Agreement(name, chunks);
  }
}

TEST(KernelsForward, UnavailableIsaIsAClearError) {
  for (kernels::Isa isa : {kernels::Isa::kAvx2, kernels::Isa::kAvxVnni, kernels::Isa::kAvx512Vnni,
                           kernels::Isa::kAvx512Vbmi, kernels::Isa::kAmx, kernels::Isa::kNeonDot,
                           kernels::Isa::kSme2}) {
    if (kernels::IsaAvailable(isa)) continue;
    ModelLoadOptions options;
    options.isa = isa;
    auto model = Model::Load(File("tiny-moe-shakespeare-q4_0.gguf"), options);
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(std::string(model.status().message()).find(kernels::IsaName(isa)),
              std::string::npos)
        << model.status();
  }
}

}  // namespace
}  // namespace moert::model
