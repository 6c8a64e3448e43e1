// The reference forward pass against the oracle (../shared/models/REFERENCE.md):
// llama.cpp's logits for the tiny MoE Shakespeare model in every tensor type, its
// greedy continuations, and the invariants of batching, threading and the KV cache.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/model.h"
#include "model/perplexity.h"
#include "tokenizer/tokenizer.h"

namespace moert::model {
namespace {

using ::testing::HasSubstr;

const std::string kModels = std::string(MOERT_SHARED_DIR) + "/models/";
constexpr int kVocab = 2048;
constexpr size_t kEmbd = 256;  // the oracle model: n_embd

struct Loaded {
  std::unique_ptr<format::GgufFile> file;
  std::optional<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<Model> model;
};

// Each model file is loaded once for the whole binary (threads: 1, or 2 for "#2"), on
// the reference path: these tests pin down the fp32 oracle. The integer kernels'
// path is kernels_forward_test.cc's.
const Loaded& Get(const std::string& name, int threads = 1) {
  static std::map<std::string, std::unique_ptr<Loaded>>* cache =
      new std::map<std::string, std::unique_ptr<Loaded>>();
  const std::string key = name + "#" + std::to_string(threads);
  auto it = cache->find(key);
  if (it != cache->end()) return *it->second;
  auto loaded = std::make_unique<Loaded>();
  auto file = format::GgufFile::Open(kModels + name);
  EXPECT_TRUE(file.ok()) << file.status();
  loaded->file = std::move(*file);
  auto tok = tokenizer::Tokenizer::FromGguf(*loaded->file);
  EXPECT_TRUE(tok.ok()) << tok.status();
  loaded->tokenizer.emplace(std::move(*tok));
  ModelLoadOptions options;
  options.threads = threads;
  options.quantized_kernels = false;
  auto model = Model::Load(*loaded->file, options);
  EXPECT_TRUE(model.ok()) << model.status();
  loaded->model = std::move(*model);
  return *cache->emplace(key, std::move(loaded)).first->second;
}

struct OraclePrompt {
  std::string prompt;  // unescaped
  std::vector<float> logits;
};

// logits/*.txt: per line the prompt (newlines written as \n) and 2048 logits.
std::vector<OraclePrompt> ReadOracle(const std::string& name) {
  std::ifstream in(kModels + "logits/" + name);
  EXPECT_TRUE(in) << name;
  std::vector<OraclePrompt> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    // The logits are the last kVocab space-separated fields.
    size_t pos = line.size();
    for (int i = 0; i < kVocab; ++i) {
      pos = line.rfind(' ', pos - 1);
      if (pos == std::string::npos) {
        ADD_FAILURE() << name << ": a line with fewer than " << kVocab << " fields";
        return out;
      }
    }
    OraclePrompt p;
    const std::string escaped = line.substr(0, pos);
    for (size_t i = 0; i < escaped.size(); ++i) {
      if (escaped[i] == '\\' && i + 1 < escaped.size() && escaped[i + 1] == 'n') {
        p.prompt += '\n';
        ++i;
      } else {
        p.prompt += escaped[i];
      }
    }
    std::istringstream fields(line.substr(pos + 1));
    float v;
    while (fields >> v) p.logits.push_back(v);
    EXPECT_EQ(p.logits.size(), static_cast<size_t>(kVocab)) << name;
    out.push_back(std::move(p));
  }
  EXPECT_EQ(out.size(), 3u) << name;
  return out;
}

std::vector<int32_t> TopK(const std::vector<float>& logits, int k) {
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  ids.resize(k);
  return ids;
}

int32_t Argmax(const float* logits, int n) {
  return static_cast<int32_t>(std::max_element(logits, logits + n) - logits);
}

std::vector<float> LastLogits(Model& model, const std::vector<int32_t>& ids) {
  auto cache = model.NewKvCache(static_cast<int>(ids.size()));
  EXPECT_TRUE(cache.ok());
  std::vector<float> logits;
  absl::Status s = model.Forward(ids, cache->get(), LogitsFor::kLast, &logits);
  EXPECT_TRUE(s.ok()) << s;
  return logits;
}

struct Agreement {
  double max_abs = 0;
  double max_rel = 0;  // |ours - ref| / max(|ref|, 1)
  bool top1 = true;
  bool top10 = true;
};

// Runs every oracle prompt of `logits_file` through `model_file`.
Agreement Compare(const std::string& model_file, const std::string& logits_file) {
  const Loaded& m = Get(model_file);
  Agreement a;
  for (const OraclePrompt& p : ReadOracle(logits_file)) {
    const std::vector<int32_t> ids = m.tokenizer->Encode(p.prompt, true, false);
    const std::vector<float> ours = LastLogits(*m.model, ids);
    if (ours.size() != p.logits.size()) {
      ADD_FAILURE() << "logits size " << ours.size();
      return a;
    }
    for (int i = 0; i < kVocab; ++i) {
      const double d = std::abs(static_cast<double>(ours[i]) - p.logits[i]);
      a.max_abs = std::max(a.max_abs, d);
      a.max_rel = std::max(a.max_rel, d / std::max(1.0, std::abs(double{p.logits[i]})));
    }
    a.top1 = a.top1 && TopK(ours, 1) == TopK(p.logits, 1);
    a.top10 = a.top10 && TopK(ours, 10) == TopK(p.logits, 10);
  }
  std::printf("%s vs %s: max |dlogit| %.3g, max relative %.3g, top-1 %s, top-10 %s\n",
              model_file.c_str(), logits_file.c_str(), a.max_abs, a.max_rel,
              a.top1 ? "same" : "differs", a.top10 ? "same" : "differs");
  return a;
}

TEST(Oracle, PromptsTokenizeAsTheReference) {
  const Loaded& m = Get("tiny-moe-shakespeare-f32.gguf");
  const std::vector<OraclePrompt> prompts = ReadOracle("llama_f32kv.txt");
  ASSERT_EQ(prompts.size(), 3u);
  EXPECT_EQ(m.tokenizer->Encode(prompts[0].prompt, true, false),
            (std::vector<int32_t>{1, 826, 2007}));
  EXPECT_EQ(m.tokenizer->Encode(prompts[1].prompt, true, false),
            (std::vector<int32_t>{1, 650, 996, 2007, 13, 2026, 1985, 565, 341, 586, 1749}));
  EXPECT_EQ(m.tokenizer->Encode(prompts[2].prompt, true, false),
            (std::vector<int32_t>{1, 499, 745}));
}

// llama.cpp with f32 weights and an f32 KV cache agrees with PyTorch to 3e-6; so
// must we, give or take the order of float sums (measured: 9e-7 and 1.8e-6).
TEST(Oracle, F32MatchesLlamaCpp) {
  const Agreement a = Compare("tiny-moe-shakespeare-f32.gguf", "llama_f32kv.txt");
  EXPECT_TRUE(a.top10);
  EXPECT_LT(a.max_rel, 2e-5);
}

TEST(Oracle, F32MatchesPyTorch) {
  const Agreement a = Compare("tiny-moe-shakespeare-f32.gguf", "torch_f32.txt");
  EXPECT_TRUE(a.top10);
  EXPECT_LT(a.max_rel, 2e-5);
}

// llama.cpp rounds activations to f16 for f16 weights and keeps an f16 KV cache; we
// multiply the same weights in f32, so the gap is llama.cpp's rounding (1.9e-3 from
// PyTorch in REFERENCE.md; measured: 2.0e-3).
TEST(Oracle, F16MatchesLlamaCpp) {
  const Agreement a = Compare("tiny-moe-shakespeare-f16.gguf", "llama_f16.txt");
  EXPECT_TRUE(a.top10);
  EXPECT_LT(a.max_rel, 5e-3);
}

// Quantized weights: llama.cpp also quantizes the activations (to q8_0 / q8_K) for
// its dot products, which we do not, so only the ranking's head and the size of the
// gap are checked: REFERENCE.md has them 2.5e-2 (q8_0) and 2.6e-1 (q4_0) from PyTorch;
// we measure 3.0e-2 and 4.4e-2 from llama.cpp.
TEST(Oracle, Q8_0IsCloseToLlamaCpp) {
  const Agreement a = Compare("tiny-moe-shakespeare-q8_0.gguf", "llama_q8_0.txt");
  EXPECT_TRUE(a.top1);
  EXPECT_LT(a.max_abs, 5e-2);
}

TEST(Oracle, Q4_0IsCloseToLlamaCpp) {
  const Agreement a = Compare("tiny-moe-shakespeare-q4_0.gguf", "llama_q4_0.txt");
  EXPECT_TRUE(a.top1);
  EXPECT_LT(a.max_abs, 1e-1);
}

const std::vector<std::vector<int32_t>> kGreedy = {
    {13, 2010, 270, 1999, 275, 2014, 277, 309, 261, 271, 584,  260,  1992, 1999, 302,  1999,
     13, 2012, 260, 1992, 275, 369,  822, 261, 292, 393, 2014, 1995, 1999, 13,   2010, 270},
    {303,  1999, 302, 275,  2014, 277,  309,  261, 271, 582,  2009, 13,  13,  2018, 653, 518,
     1495, 2007, 13,  2022, 295,  2014, 1990, 269, 893, 1999, 275,  488, 261, 271,  582, 291},
    {964, 13,  13,  2034, 426,  623,  909, 2007, 13,   2022, 295, 1999, 275,  2014, 277, 309,
     261, 271, 584, 260,  1992, 1999, 302, 275,  2014, 277,  309, 13,   2012, 1987, 309, 261},
};

// 32 greedy tokens: the prompt in one batch, then one token per Forward.
void ExpectGreedyContinuations(const std::string& model_file) {
  const Loaded& m = Get(model_file);
  const std::vector<OraclePrompt> prompts = ReadOracle("llama_f32kv.txt");
  ASSERT_EQ(prompts.size(), kGreedy.size());
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::vector<int32_t> ids = m.tokenizer->Encode(prompts[p].prompt, true, false);
    auto cache = m.model->NewKvCache(static_cast<int>(ids.size()) + 32);
    ASSERT_TRUE(cache.ok());
    std::vector<float> logits;
    ASSERT_TRUE(m.model->Forward(ids, cache->get(), LogitsFor::kLast, &logits).ok());
    std::vector<int32_t> generated;
    for (int i = 0; i < 32; ++i) {
      generated.push_back(Argmax(logits.data(), kVocab));
      if (i + 1 < 32) {
        ASSERT_TRUE(
            m.model->Forward({&generated.back(), 1}, cache->get(), LogitsFor::kLast, &logits).ok());
      }
    }
    EXPECT_EQ(generated, kGreedy[p]) << model_file << ", prompt " << p;
  }
}

TEST(Oracle, GreedyContinuationsF32) { ExpectGreedyContinuations("tiny-moe-shakespeare-f32.gguf"); }

TEST(Oracle, GreedyContinuationsF16) { ExpectGreedyContinuations("tiny-moe-shakespeare-f16.gguf"); }

const std::vector<int32_t> kSample = {1,    650, 996,  2007, 13,   2026, 1985, 565, 341,  586,
                                      1749, 806, 1918, 711,  1999, 693,  326,  626, 2009, 13,
                                      1984, 499, 745,  964,  1999, 1984, 52,   53,  2045, 55,
                                      1984, 535, 454,  2014, 1990, 373,  2028};

// Every value is computed in one fixed order whatever the batch (layers.h): a batch
// and token-by-token decoding agree bit for bit, and so do all of a batch's rows.
TEST(Forward, PrefillEqualsTokenByTokenDecode) {
  Model& model = *Get("tiny-moe-shakespeare-f32.gguf").model;
  const int n = static_cast<int>(kSample.size());
  auto batch_cache = model.NewKvCache(n);
  ASSERT_TRUE(batch_cache.ok());
  std::vector<float> all;
  ASSERT_TRUE(model.Forward(kSample, batch_cache->get(), LogitsFor::kAll, &all).ok());
  ASSERT_EQ(all.size(), static_cast<size_t>(n) * kVocab);
  EXPECT_EQ((*batch_cache)->size(), n);

  auto step_cache = model.NewKvCache(n);
  ASSERT_TRUE(step_cache.ok());
  std::vector<float> one;
  double max_diff = 0;
  for (int t = 0; t < n; ++t) {
    ASSERT_TRUE(model.Forward({&kSample[t], 1}, step_cache->get(), LogitsFor::kLast, &one).ok());
    ASSERT_EQ(one.size(), static_cast<size_t>(kVocab));
    for (int i = 0; i < kVocab; ++i) {
      max_diff = std::max(max_diff, double{std::abs(one[i] - all[t * kVocab + i])});
    }
  }
  EXPECT_EQ(max_diff, 0.0);

  // Two half batches, and kLast against the last row of kAll.
  auto split_cache = model.NewKvCache(n);
  ASSERT_TRUE(split_cache.ok());
  std::vector<float> first, last;
  ASSERT_TRUE(
      model.Forward(std::span(kSample).first(20), split_cache->get(), LogitsFor::kAll, &first)
          .ok());
  ASSERT_TRUE(
      model.Forward(std::span(kSample).subspan(20), split_cache->get(), LogitsFor::kLast, &last)
          .ok());
  EXPECT_TRUE(std::equal(first.begin(), first.end(), all.begin()));
  EXPECT_TRUE(std::equal(last.begin(), last.end(), all.end() - kVocab));
}

TEST(Forward, ThreadCountDoesNotChangeTheLogits) {
  Model& one = *Get("tiny-moe-shakespeare-f32.gguf", 1).model;
  Model& two = *Get("tiny-moe-shakespeare-f32.gguf", 2).model;
  auto c1 = one.NewKvCache(64);
  auto c2 = two.NewKvCache(64);
  ASSERT_TRUE(c1.ok() && c2.ok());
  std::vector<float> l1, l2;
  ASSERT_TRUE(one.Forward(kSample, c1->get(), LogitsFor::kAll, &l1).ok());
  ASSERT_TRUE(two.Forward(kSample, c2->get(), LogitsFor::kAll, &l2).ok());
  EXPECT_TRUE(l1 == l2);
  ASSERT_TRUE(one.Forward({&kSample[5], 1}, c1->get(), LogitsFor::kLast, &l1).ok());
  ASSERT_TRUE(two.Forward({&kSample[5], 1}, c2->get(), LogitsFor::kLast, &l2).ok());
  EXPECT_TRUE(l1 == l2);
}

TEST(Forward, ContextOverflowIsOutOfRangeAndLeavesTheCache) {
  Model& model = *Get("tiny-moe-shakespeare-f32.gguf").model;
  auto cache = model.NewKvCache(8);
  ASSERT_TRUE(cache.ok());
  std::vector<float> logits;
  ASSERT_TRUE(
      model.Forward(std::span(kSample).first(6), cache->get(), LogitsFor::kLast, &logits).ok());
  absl::Status s =
      model.Forward(std::span(kSample).subspan(6, 3), cache->get(), LogitsFor::kLast, &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(s.message()), HasSubstr("6..8"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("capacity of 8"));
  EXPECT_EQ((*cache)->size(), 6);

  // The cache still continues the first six tokens: the same logits as one batch.
  ASSERT_TRUE(
      model.Forward(std::span(kSample).subspan(6, 2), cache->get(), LogitsFor::kLast, &logits)
          .ok());
  EXPECT_EQ((*cache)->size(), 8);
  EXPECT_TRUE(logits ==
              LastLogits(model, std::vector<int32_t>(kSample.begin(), kSample.begin() + 8)));
  s = model.Forward({&kSample[0], 1}, cache->get(), LogitsFor::kLast, &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(s.message()), HasSubstr("8..8"));
}

TEST(Forward, BadTokenIdAndEmptyBatchAreInvalidArgument) {
  Model& model = *Get("tiny-moe-shakespeare-f32.gguf").model;
  auto cache = model.NewKvCache(16);
  ASSERT_TRUE(cache.ok());
  std::vector<float> logits;
  ASSERT_TRUE(
      model.Forward(std::span(kSample).first(3), cache->get(), LogitsFor::kLast, &logits).ok());
  for (int32_t bad : {2048, -2}) {
    const std::vector<int32_t> ids = {5, bad};
    absl::Status s = model.Forward(ids, cache->get(), LogitsFor::kLast, &logits);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("token id " + std::to_string(bad)));
    EXPECT_THAT(std::string(s.message()), HasSubstr("batch index 1"));
    EXPECT_EQ((*cache)->size(), 3);
  }
  absl::Status s = model.Forward(std::span<const int32_t>(), cache->get(), LogitsFor::kLast, &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*cache)->size(), 3);
}

// The rows of token_embd.weight (F32) for `ids`, as embedding input.
std::vector<float> EmbeddingRows(const Loaded& m, const std::vector<int32_t>& ids) {
  const format::GgufTensorInfo* t = m.file->FindTensor("token_embd.weight");
  EXPECT_NE(t, nullptr);
  if (t == nullptr) return {};
  EXPECT_EQ(t->type, format::GgmlType::kF32);
  const size_t width = static_cast<size_t>(t->dims[0]);
  const std::span<const uint8_t> data = m.file->TensorData(*t);
  std::vector<float> rows(ids.size() * width);
  for (size_t i = 0; i < ids.size(); ++i) {
    std::memcpy(rows.data() + i * width, data.data() + static_cast<size_t>(ids[i]) * width * 4,
                width * 4);
  }
  return rows;
}

// Embedding rows at some positions (an image's tokens): a row equal to a token's
// embedding gives that token's logits bit for bit, in one batch or step by step, at
// any mix of positions.
TEST(Forward, EmbeddingRowsAtPositionsMatchTheirTokens) {
  const Loaded& m = Get("tiny-moe-shakespeare-f32.gguf");
  Model& model = *m.model;
  const std::vector<int32_t> ids(kSample.begin(), kSample.begin() + 10);
  std::vector<float> want;
  {
    auto cache = model.NewKvCache(32);
    ASSERT_TRUE(cache.ok());
    ASSERT_TRUE(model.Forward(ids, cache->get(), LogitsFor::kAll, &want).ok());
  }
  // Positions 0, 3, 4, 5 and 9 as embeddings.
  std::vector<int32_t> mixed = ids;
  std::vector<int32_t> replaced;
  for (size_t i : {0, 3, 4, 5, 9}) {
    replaced.push_back(ids[i]);
    mixed[i] = kEmbeddingToken;
  }
  const std::vector<float> rows = EmbeddingRows(m, replaced);
  ForwardInput input;
  input.tokens = mixed;
  input.embeddings = rows;
  auto cache = model.NewKvCache(32);
  ASSERT_TRUE(cache.ok());
  std::vector<float> got;
  ASSERT_TRUE(model.Forward(input, cache->get(), LogitsFor::kAll, &got).ok());
  EXPECT_TRUE(got == want);
  // Step by step: each position alone, its row when it has one.
  auto step_cache = model.NewKvCache(32);
  ASSERT_TRUE(step_cache.ok());
  size_t row = 0;
  for (size_t t = 0; t < mixed.size(); ++t) {
    ForwardInput one;
    one.tokens = std::span(mixed).subspan(t, 1);
    if (mixed[t] == kEmbeddingToken) {
      one.embeddings = std::span(rows).subspan(row++ * kEmbd, kEmbd);
    }
    std::vector<float> step;
    ASSERT_TRUE(model.Forward(one, step_cache->get(), LogitsFor::kLast, &step).ok()) << t;
    EXPECT_TRUE(std::equal(step.begin(), step.end(), want.begin() + t * kVocab)) << t;
  }
  // Rows that are not a token's change the logits.
  std::vector<float> other = rows;
  for (float& v : other) v *= 0.5f;
  input.embeddings = other;
  auto other_cache = model.NewKvCache(32);
  ASSERT_TRUE(other_cache.ok());
  ASSERT_TRUE(model.Forward(input, other_cache->get(), LogitsFor::kAll, &got).ok());
  EXPECT_FALSE(got == want);
}

// Rows that do not match the embedding positions, non-finite rows and a share outside
// [0, 1] are InvalidArgument naming what is wrong; the cache is unchanged.
TEST(Forward, BadEmbeddingRowsAreInvalidArgument) {
  const Loaded& m = Get("tiny-moe-shakespeare-f32.gguf");
  Model& model = *m.model;
  auto cache = model.NewKvCache(16);
  ASSERT_TRUE(cache.ok());
  std::vector<float> logits;
  ASSERT_TRUE(
      model.Forward(std::span(kSample).first(3), cache->get(), LogitsFor::kLast, &logits).ok());
  const std::vector<int32_t> ids = {5, kEmbeddingToken, 7, kEmbeddingToken};
  std::vector<float> rows = EmbeddingRows(m, {5, 7});
  struct Case {
    std::vector<float> rows;
    float share;
    std::string message;
  };
  std::vector<float> nan_rows = rows;
  nan_rows[kEmbd + 3] = std::nanf("");
  const Case cases[] = {
      {{}, 0, "2 embedding positions"},
      {std::vector<float>(rows.begin(), rows.begin() + kEmbd), 0, "256 embedding floats"},
      {std::vector<float>(3 * kEmbd, 0.0f), 0, "768 embedding floats"},
      {nan_rows, 0, "embedding row 1 holds a non-finite value at column 3"},
      {rows, 1.5f, "image_share"},
      {rows, std::nanf(""), "image_share"},
  };
  for (const Case& c : cases) {
    ForwardInput input;
    input.tokens = ids;
    input.embeddings = c.rows;
    input.image_share = c.share;
    absl::Status s = model.Forward(input, cache->get(), LogitsFor::kLast, &logits);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
    EXPECT_EQ((*cache)->size(), 3);
  }
  ForwardInput good;
  good.tokens = ids;
  good.embeddings = rows;
  good.image_share = 0.5f;
  EXPECT_TRUE(model.Forward(good, cache->get(), LogitsFor::kLast, &logits).ok());
  EXPECT_EQ((*cache)->size(), 7);
}

TEST(Forward, KvCacheSizesAndTruncation) {
  Model& model = *Get("tiny-moe-shakespeare-f32.gguf").model;
  EXPECT_EQ(model.NewKvCache(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.NewKvCache(-3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.NewKvCache(1 << 30).status().code(), absl::StatusCode::kInvalidArgument);

  auto cache = model.NewKvCache(32);
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ((*cache)->capacity(), 32);
  EXPECT_EQ((*cache)->size(), 0);
  std::vector<float> a, b;
  ASSERT_TRUE(model.Forward(std::span(kSample).first(10), cache->get(), LogitsFor::kLast, &a).ok());
  // Rewind to 4 and take another path, then rewind again and replay the original.
  (*cache)->Truncate(4);
  EXPECT_EQ((*cache)->size(), 4);
  ASSERT_TRUE(
      model.Forward(std::span(kSample).subspan(20, 3), cache->get(), LogitsFor::kLast, &b).ok());
  EXPECT_EQ((*cache)->size(), 7);
  (*cache)->Truncate(4);
  ASSERT_TRUE(
      model.Forward(std::span(kSample).subspan(4, 6), cache->get(), LogitsFor::kLast, &b).ok());
  EXPECT_TRUE(a == b);
  (*cache)->Truncate(100);  // nothing to forget
  EXPECT_EQ((*cache)->size(), 10);
}

TEST(Forward, CacheFromAnotherModelShapeIsRejected) {
  Model& model = *Get("tiny-moe-shakespeare-f32.gguf").model;
  class OtherCache : public KvCache {
   public:
    int capacity() const override { return 10; }
    void Truncate(int) override {}
    int size() const override { return 0; }
  } other;
  std::vector<float> logits;
  absl::Status s = model.Forward(std::span(kSample).first(2), &other, LogitsFor::kLast, &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

std::vector<int32_t> ValidTokens(const Loaded& m) {
  std::ifstream in(kModels + "valid.txt", std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return m.tokenizer->Encode(text.str(), true, false);
}

// The full runs (all 361 chunks, against llama-perplexity's numbers) are the slow
// tool tests in tests/tools; here the first chunks only (still minutes under ASan and
// qemu: x86 only, label `slow`).
TEST(PerplexitySlowTest, FirstChunksF32AndF16Agree) {
  const Loaded& f32 = Get("tiny-moe-shakespeare-f32.gguf");
  const Loaded& f16 = Get("tiny-moe-shakespeare-f16.gguf");
  const std::vector<int32_t> tokens = ValidTokens(f32);
  ASSERT_EQ(tokens.size(), 46251u);
  PerplexityOptions options;
  options.n_ctx = 128;
  options.n_batch = 64;  // two Forward calls per chunk
  options.bos = 1;
  options.max_chunks = 2;
  int calls = 0;
  options.progress = [&](const PerplexityProgress& p) {
    ++calls;
    EXPECT_EQ(p.chunk, calls);
    EXPECT_EQ(p.n_chunks, 2);
  };
  auto a = ComputePerplexity(*f32.model, tokens, options);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(calls, 2);
  options.progress = nullptr;
  options.n_batch = 0;
  auto b = ComputePerplexity(*f16.model, tokens, options);
  ASSERT_TRUE(b.ok()) << b.status();
  std::printf("first 2 chunks: f32 PPL %.4f +/- %.4f, f16 PPL %.4f +/- %.4f\n", a->ppl,
              a->ppl_error, b->ppl, b->ppl_error);
  EXPECT_EQ(a->n_chunks, 2);
  EXPECT_EQ(a->n_scored, 2 * 63);
  EXPECT_GT(a->ppl, 20);
  EXPECT_LT(a->ppl, 80);
  EXPECT_GT(a->ppl_error, 0);
  EXPECT_LT(a->ppl_error, a->ppl * 0.3);
  EXPECT_NEAR(a->ppl, b->ppl, a->ppl * 1e-3);
  EXPECT_NEAR(std::log(a->ppl), a->mean_nll, 1e-12);
}

TEST(Perplexity, RejectsShortTextsAndBadOptions) {
  Model& model = *Get("tiny-moe-shakespeare-f32.gguf").model;
  PerplexityOptions options;
  options.n_ctx = 32;
  auto r = ComputePerplexity(model, std::span(kSample), options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("37 tokens"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("at least 64"));
  options.n_ctx = 2;
  EXPECT_EQ(ComputePerplexity(model, kSample, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.n_ctx = 8;
  options.n_batch = -1;
  EXPECT_EQ(ComputePerplexity(model, kSample, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moert::model
