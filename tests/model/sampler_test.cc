// Tests of the token sampler (greedy, temperature, top-k / top-p / min-p candidate
// sets, repetition penalty, seeds, bad options and bad logits) and of StopMatcher.
#include "model/sampler.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/stop.h"

namespace moert::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// Every filter off: temperature sampling over the whole softmax.
SamplerOptions PlainOptions(float temperature, uint64_t seed = 1234) {
  SamplerOptions options;
  options.temperature = temperature;
  options.top_k = 0;
  options.top_p = 1.0f;
  options.min_p = 0.0f;
  options.repeat_penalty = 1.0f;
  options.seed = seed;
  return options;
}

Sampler MakeSampler(const SamplerOptions& options) {
  absl::StatusOr<Sampler> sampler = Sampler::Create(options);
  EXPECT_TRUE(sampler.ok()) << sampler.status();
  return *std::move(sampler);
}

std::vector<float> RandomLogits(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(n);
  for (float& l : logits) l = normal(rng);
  return logits;
}

int32_t Argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

std::vector<int32_t> Ids(const std::vector<TokenProbability>& distribution) {
  std::vector<int32_t> ids;
  for (const TokenProbability& t : distribution) ids.push_back(t.id);
  return ids;
}

// The ids Distribution keeps for `logits` under `options`.
std::vector<int32_t> KeptIds(const SamplerOptions& options, const std::vector<float>& logits,
                             const std::vector<int32_t>& history = {}) {
  Sampler sampler = MakeSampler(options);
  absl::StatusOr<std::vector<TokenProbability>> distribution =
      sampler.Distribution(logits, history);
  EXPECT_TRUE(distribution.ok()) << distribution.status();
  return distribution.ok() ? Ids(*distribution) : std::vector<int32_t>{};
}

// The ids that ever come out of `draws` samples.
std::set<int32_t> SampledIds(const SamplerOptions& options, const std::vector<float>& logits,
                             int draws = 4000) {
  Sampler sampler = MakeSampler(options);
  std::set<int32_t> seen;
  for (int i = 0; i < draws; ++i) seen.insert(sampler.Sample(logits, {}));
  return seen;
}

// Hand-built probabilities, shuffled over the ids so that sorting is exercised:
// id 2 = 0.5, id 0 = 0.25, id 3 = 0.15, id 1 = 0.1.
std::vector<float> FourTokenLogits() {
  return {std::log(0.25f), std::log(0.1f), std::log(0.5f), std::log(0.15f)};
}

TEST(SamplerTest, GreedyIsArgmax) {
  std::mt19937 rng(7);
  SamplerOptions options;  // defaults (top-k, top-p, min-p on) but temperature 0
  options.temperature = 0.0f;
  Sampler sampler = MakeSampler(options);
  const std::vector<int32_t> history = {3, 17, 17, 99, 500};  // no penalty: ignored
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<float> logits = RandomLogits(rng, 1000);
    EXPECT_EQ(sampler.Sample(logits, history), Argmax(logits)) << "trial " << trial;
  }
}

TEST(SamplerTest, GreedyTiesGoToTheLowestId) {
  Sampler sampler = MakeSampler(PlainOptions(0.0f));
  EXPECT_EQ(sampler.Sample(std::vector<float>{1.0f, 5.0f, 5.0f, 2.0f}, {}), 1);
  EXPECT_EQ(sampler.Sample(std::vector<float>{-2.0f, -2.0f}, {}), 0);
}

TEST(SamplerTest, TemperatureFrequenciesMatchSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, 1.5f, -1.0f};
  const float temperature = 0.7f;
  std::vector<double> expected(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    expected[i] = std::exp(logits[i] / temperature);
    total += expected[i];
  }
  for (double& p : expected) p /= total;

  Sampler sampler = MakeSampler(PlainOptions(temperature));
  absl::StatusOr<std::vector<TokenProbability>> distribution = sampler.Distribution(logits, {});
  ASSERT_TRUE(distribution.ok()) << distribution.status();
  ASSERT_EQ(distribution->size(), logits.size());
  for (const TokenProbability& t : *distribution) {
    EXPECT_NEAR(t.probability, expected[static_cast<size_t>(t.id)], 1e-6) << t.id;
  }

  constexpr int kDraws = 20000;
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < kDraws; ++i) {
    const int32_t id = sampler.Sample(logits, {});
    ASSERT_GE(id, 0);
    ASSERT_LT(id, static_cast<int32_t>(logits.size()));
    ++counts[static_cast<size_t>(id)];
  }
  for (size_t i = 0; i < logits.size(); ++i) {
    // Five standard deviations of a binomial frequency: loose, and the seed is
    // fixed, so this never flakes.
    const double p = expected[i];
    const double bound = 5.0 * std::sqrt(p * (1.0 - p) / kDraws) + 1e-3;
    EXPECT_NEAR(static_cast<double>(counts[i]) / kDraws, p, bound) << "token " << i;
  }
}

TEST(SamplerTest, SameSeedSameSequence) {
  std::mt19937 rng(11);
  const std::vector<float> logits = RandomLogits(rng, 300);
  SamplerOptions options;  // llama.cpp-like defaults, with a penalty on
  options.temperature = 1.0f;
  options.repeat_penalty = 1.1f;
  options.seed = 42;
  auto run = [&](uint64_t seed) {
    options.seed = seed;
    Sampler sampler = MakeSampler(options);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 300; ++i) tokens.push_back(sampler.Sample(logits, tokens));
    return tokens;
  };
  const std::vector<int32_t> first = run(42);
  EXPECT_EQ(run(42), first);
  EXPECT_NE(run(43), first);
  // Seeds that differ only in the high 32 bits differ too.
  EXPECT_NE(run(42 + (uint64_t{1} << 32)), first);
}

TEST(SamplerTest, DistributionLeavesTheRngAlone) {
  const std::vector<float> logits = {0.3f, 1.0f, 0.9f, -0.2f, 0.6f};
  Sampler a = MakeSampler(PlainOptions(1.0f, 5));
  Sampler b = MakeSampler(PlainOptions(1.0f, 5));
  ASSERT_TRUE(a.Distribution(logits, {}).ok());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.Sample(logits, {}), b.Sample(logits, {}));
}

TEST(SamplerTest, TopKOneIsGreedy) {
  std::mt19937 rng(3);
  SamplerOptions options = PlainOptions(1.5f);
  options.top_k = 1;
  Sampler sampler = MakeSampler(options);
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<float> logits = RandomLogits(rng, 500);
    EXPECT_EQ(sampler.Sample(logits, {}), Argmax(logits)) << "trial " << trial;
  }
}

TEST(SamplerTest, TopKKeepsTheKHighest) {
  SamplerOptions options = PlainOptions(1.0f);
  options.top_k = 3;
  EXPECT_THAT(KeptIds(options, {0.1f, 3.0f, 2.0f, 1.0f, 2.5f}), ElementsAre(1, 4, 2));
  EXPECT_THAT(SampledIds(options, {0.1f, 3.0f, 2.0f, 1.0f, 2.5f}), UnorderedElementsAre(1, 4, 2));
  // Ties at the cut keep the lower ids.
  options.top_k = 2;
  EXPECT_THAT(KeptIds(options, {1.0f, 2.0f, 2.0f, 2.0f}), ElementsAre(1, 2));
  // k above the vocabulary keeps everything.
  options.top_k = 100;
  EXPECT_THAT(KeptIds(options, {1.0f, 2.0f}), ElementsAre(1, 0));
}

TEST(SamplerTest, TopPKeepsTheSmallestSetReachingP) {
  const std::vector<float> logits = FourTokenLogits();
  SamplerOptions options = PlainOptions(1.0f);
  options.top_p = 0.4f;  // 0.5 >= 0.4
  EXPECT_THAT(KeptIds(options, logits), ElementsAre(2));
  options.top_p = 0.7f;  // 0.5 + 0.25
  EXPECT_THAT(KeptIds(options, logits), ElementsAre(2, 0));
  EXPECT_THAT(SampledIds(options, logits), UnorderedElementsAre(2, 0));
  options.top_p = 0.8f;  // 0.5 + 0.25 + 0.15
  EXPECT_THAT(KeptIds(options, logits), ElementsAre(2, 0, 3));
  EXPECT_THAT(SampledIds(options, logits), UnorderedElementsAre(2, 0, 3));
  options.top_p = 1.0f;
  EXPECT_THAT(KeptIds(options, logits), ElementsAre(2, 0, 3, 1));
}

TEST(SamplerTest, TopPUsesProbabilitiesBeforeTemperature) {
  // A high temperature flattens the distribution drawn from, but top-p comes
  // first in the chain and still sees 0.5 / 0.25 / 0.15 / 0.1.
  SamplerOptions options = PlainOptions(3.0f);
  options.top_p = 0.7f;
  Sampler sampler = MakeSampler(options);
  absl::StatusOr<std::vector<TokenProbability>> distribution =
      sampler.Distribution(FourTokenLogits(), {});
  ASSERT_TRUE(distribution.ok()) << distribution.status();
  ASSERT_THAT(Ids(*distribution), ElementsAre(2, 0));
  // Renormalised over the two kept tokens at temperature 3: 2^(1/3) : 1.
  const double ratio = std::cbrt(2.0);
  EXPECT_NEAR((*distribution)[0].probability, ratio / (1.0 + ratio), 1e-6);
  EXPECT_NEAR((*distribution)[1].probability, 1.0 / (1.0 + ratio), 1e-6);
}

TEST(SamplerTest, MinPKeepsTokensAboveAFractionOfTheMax) {
  const std::vector<float> logits = FourTokenLogits();
  SamplerOptions options = PlainOptions(1.0f);
  options.min_p = 0.19f;  // threshold 0.095: all
  EXPECT_THAT(KeptIds(options, logits), ElementsAre(2, 0, 3, 1));
  options.min_p = 0.25f;  // threshold 0.125
  EXPECT_THAT(KeptIds(options, logits), ElementsAre(2, 0, 3));
  EXPECT_THAT(SampledIds(options, logits), UnorderedElementsAre(2, 0, 3));
  options.min_p = 0.4f;  // threshold 0.2
  EXPECT_THAT(KeptIds(options, logits), ElementsAre(2, 0));
  options.min_p = 0.6f;  // threshold 0.3
  EXPECT_THAT(KeptIds(options, logits), ElementsAre(2));
  EXPECT_THAT(SampledIds(options, logits), UnorderedElementsAre(2));
  options.min_p = 1.0f;  // the max and its ties
  EXPECT_THAT(KeptIds(options, logits), ElementsAre(2));
  EXPECT_THAT(KeptIds(options, {1.0f, 3.0f, 3.0f}), ElementsAre(1, 2));
}

TEST(SamplerTest, TopPAndMinPTogetherKeepTheSmallerSet) {
  const std::vector<float> logits = FourTokenLogits();
  SamplerOptions options = PlainOptions(1.0f);
  options.top_p = 0.8f;  // {2, 0, 3}
  options.min_p = 0.4f;  // {2, 0}
  EXPECT_THAT(KeptIds(options, logits), ElementsAre(2, 0));
  options.top_p = 0.4f;   // {2}
  options.min_p = 0.25f;  // {2, 0, 3}
  EXPECT_THAT(KeptIds(options, logits), ElementsAre(2));
  // Top-k first: of {2, 0} top-p 0.8 of the renormalised 2/3, 1/3 keeps both.
  options.top_k = 2;
  options.top_p = 0.8f;
  options.min_p = 0.0f;
  EXPECT_THAT(KeptIds(options, logits), ElementsAre(2, 0));
  options.top_p = 0.6f;  // 2/3 >= 0.6
  EXPECT_THAT(KeptIds(options, logits), ElementsAre(2));
}

TEST(SamplerTest, RepeatPenaltyChangesTheArgmax) {
  const std::vector<float> logits = {3.0f, 2.8f, -1.0f, 2.0f};
  SamplerOptions options = PlainOptions(0.0f);
  options.repeat_penalty = 1.2f;
  Sampler sampler = MakeSampler(options);
  EXPECT_EQ(sampler.Sample(logits, {}), 0);
  EXPECT_EQ(sampler.Sample(logits, std::vector<int32_t>{3, 0}), 1);  // 3.0 / 1.2 = 2.5
  // Negative logits are multiplied (dividing would raise them).
  EXPECT_EQ(sampler.Sample(std::vector<float>{-1.0f, -1.1f}, std::vector<int32_t>{0}),
            1);  // -1.2 < -1.1
  // Without a penalty the history changes nothing.
  Sampler plain = MakeSampler(PlainOptions(0.0f));
  EXPECT_EQ(plain.Sample(logits, std::vector<int32_t>{0, 0, 0}), 0);
}

TEST(SamplerTest, RepeatPenaltyCountsEachTokenOnce) {
  SamplerOptions options = PlainOptions(0.0f);
  options.repeat_penalty = 1.2f;
  Sampler sampler = MakeSampler(options);
  // Once: 3.0 / 1.2 = 2.5 > 2.4. Per occurrence it would be 1.74 < 2.4.
  EXPECT_EQ(sampler.Sample(std::vector<float>{3.0f, 2.4f}, std::vector<int32_t>{0, 0, 0}), 0);
}

TEST(SamplerTest, RepeatPenaltyLooksAtTheLastNTokens) {
  const std::vector<float> logits = {3.0f, 2.8f, 0.0f, 0.0f, 0.0f, 0.0f};
  const std::vector<int32_t> history = {0, 5, 5};
  SamplerOptions options = PlainOptions(0.0f);
  options.repeat_penalty = 1.2f;
  auto greedy = [&](int last_n) {
    options.repeat_last_n = last_n;
    Sampler sampler = MakeSampler(options);
    return sampler.Sample(logits, history);
  };
  EXPECT_EQ(greedy(2), 0);   // token 0 is outside the window
  EXPECT_EQ(greedy(3), 1);   // inside: 2.5 < 2.8
  EXPECT_EQ(greedy(64), 1);  // a window longer than the history
  EXPECT_EQ(greedy(-1), 1);  // the whole history
  EXPECT_EQ(greedy(0), 0);   // off
}

TEST(SamplerTest, RepeatPenaltyIgnoresIdsOutsideTheVocabulary) {
  SamplerOptions options = PlainOptions(1.0f);
  options.repeat_penalty = 1.5f;
  Sampler sampler = MakeSampler(options);
  const std::vector<int32_t> history = {-7, 2, 1000000, -1};
  for (int i = 0; i < 100; ++i) {
    const int32_t id = sampler.Sample(std::vector<float>{0.5f, 0.1f, 0.7f}, history);
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 3);
  }
}

TEST(SamplerTest, InvalidOptionsAreNamedWithTheirValue) {
  struct Case {
    const char* field;
    const char* value;
    SamplerOptions options;
  };
  std::vector<Case> cases;
  auto add = [&](const char* field, const char* value, auto mutate) {
    SamplerOptions options;
    mutate(options);
    cases.push_back({field, value, options});
  };
  add("temperature", "-0.5", [](SamplerOptions& o) { o.temperature = -0.5f; });
  add("temperature", "nan", [](SamplerOptions& o) { o.temperature = kNan; });
  add("temperature", "inf", [](SamplerOptions& o) { o.temperature = kInf; });
  add("top_p", "0", [](SamplerOptions& o) { o.top_p = 0.0f; });
  add("top_p", "1.5", [](SamplerOptions& o) { o.top_p = 1.5f; });
  add("top_p", "nan", [](SamplerOptions& o) { o.top_p = kNan; });
  add("min_p", "-0.1", [](SamplerOptions& o) { o.min_p = -0.1f; });
  add("min_p", "2", [](SamplerOptions& o) { o.min_p = 2.0f; });
  add("repeat_penalty", "0", [](SamplerOptions& o) { o.repeat_penalty = 0.0f; });
  add("repeat_penalty", "-1", [](SamplerOptions& o) { o.repeat_penalty = -1.0f; });
  add("repeat_penalty", "inf", [](SamplerOptions& o) { o.repeat_penalty = kInf; });
  add("repeat_last_n", "-2", [](SamplerOptions& o) { o.repeat_last_n = -2; });
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.field) + " = " + c.value);
    const absl::Status status = ValidateSamplerOptions(c.options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    const std::string message(status.message());
    EXPECT_THAT(message, HasSubstr(std::string(c.field) + " = " + c.value));
    EXPECT_EQ(Sampler::Create(c.options).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(SamplerTest, EdgeOptionsAreValid) {
  SamplerOptions options;
  EXPECT_TRUE(ValidateSamplerOptions(options).ok());  // the defaults
  options.temperature = 0.0f;
  options.top_k = -5;
  options.top_p = 1.0f;
  options.min_p = 1.0f;
  options.repeat_penalty = 0.5f;
  options.repeat_last_n = -1;
  EXPECT_TRUE(ValidateSamplerOptions(options).ok());
  options.min_p = 0.0f;
  options.repeat_last_n = 0;
  EXPECT_TRUE(Sampler::Create(options).ok());
}

TEST(SamplerTest, NanLogitsAreNeverPicked) {
  const std::vector<float> logits = {kNan, 1.0f, kNan, 0.5f};
  Sampler greedy = MakeSampler(PlainOptions(0.0f));
  EXPECT_EQ(greedy.Sample(logits, {}), 1);
  EXPECT_THAT(SampledIds(PlainOptions(1.0f), logits), UnorderedElementsAre(1, 3));
  EXPECT_THAT(KeptIds(PlainOptions(1.0f), logits), ElementsAre(1, 3));
  // NaN ahead of the max does not fool greedy.
  EXPECT_EQ(greedy.Sample(std::vector<float>{kNan, -3.0f, 2.0f}, {}), 2);
}

TEST(SamplerTest, NegativeInfinityLogitsAreNeverPicked) {
  const std::vector<float> logits = {-kInf, -kInf, 0.5f, -kInf, -2.0f};
  Sampler greedy = MakeSampler(PlainOptions(0.0f));
  EXPECT_EQ(greedy.Sample(logits, {}), 2);
  EXPECT_THAT(SampledIds(PlainOptions(1.0f), logits), UnorderedElementsAre(2, 4));
}

TEST(SamplerTest, PositiveInfinityIsCertain) {
  const std::vector<float> logits = {1.0f, kInf, 2.0f, kInf, kNan};
  Sampler greedy = MakeSampler(PlainOptions(0.0f));
  EXPECT_EQ(greedy.Sample(logits, {}), 1);
  EXPECT_THAT(SampledIds(PlainOptions(1.0f), logits), UnorderedElementsAre(1, 3));
  Sampler sampler = MakeSampler(PlainOptions(0.8f));
  absl::StatusOr<std::vector<TokenProbability>> distribution = sampler.Distribution(logits, {});
  ASSERT_TRUE(distribution.ok()) << distribution.status();
  ASSERT_THAT(Ids(*distribution), ElementsAre(1, 3));
  EXPECT_FLOAT_EQ((*distribution)[0].probability, 0.5f);
  EXPECT_FLOAT_EQ((*distribution)[1].probability, 0.5f);
}

TEST(SamplerTest, NothingToSampleIsAnError) {
  for (float temperature : {0.0f, 1.0f}) {
    SCOPED_TRACE(temperature);
    Sampler sampler = MakeSampler(PlainOptions(temperature));
    const std::vector<float> dead = {-kInf, kNan, -kInf};
    absl::StatusOr<int32_t> token = sampler.TrySample(dead, {});
    EXPECT_EQ(token.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(token.status().message()), HasSubstr("NaN or -inf"));
    EXPECT_EQ(sampler.Sample(dead, {}), -1);
    EXPECT_FALSE(sampler.Distribution(dead, {}).ok());

    const std::vector<float> empty;
    token = sampler.TrySample(empty, {});
    EXPECT_EQ(token.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(token.status().message()), HasSubstr("empty"));
    EXPECT_EQ(sampler.Sample(empty, {}), -1);
    // The sampler still works afterwards.
    EXPECT_EQ(sampler.Sample(std::vector<float>{kNan, 7.0f}, {}), 1);
  }
}

TEST(SamplerTest, ExtremeValuesStayFinite) {
  // A tiny temperature is greedy in effect, without inf / NaN weights.
  Sampler cold = MakeSampler(PlainOptions(1e-20f));
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(cold.Sample(std::vector<float>{1.0f, 1.0001f, 0.5f}, {}), 1);
  }
  // Logits near the float range.
  const std::vector<float> huge = {3e38f, -3e38f, 3e38f, 0.0f};
  EXPECT_THAT(SampledIds(PlainOptions(0.5f), huge), UnorderedElementsAre(0, 2));
  SamplerOptions options = PlainOptions(0.5f);
  options.top_p = 0.9f;
  options.min_p = 0.1f;
  options.repeat_penalty = 3.0f;
  Sampler sampler = MakeSampler(options);
  for (int i = 0; i < 100; ++i) {
    const int32_t id = sampler.Sample(huge, std::vector<int32_t>{1});
    EXPECT_TRUE(id == 0 || id == 2) << id;
  }
  // A single token.
  Sampler single = MakeSampler(PlainOptions(1.0f));
  EXPECT_EQ(single.Sample(std::vector<float>{-50.0f}, {}), 0);
}

TEST(SamplerTest, DefaultOptionsSampleOnARealisticVocabulary) {
  std::mt19937 rng(99);
  std::vector<float> logits = RandomLogits(rng, 151936);
  logits[1234] = 40.0f;  // a confident model
  SamplerOptions options;
  options.repeat_penalty = 1.1f;
  Sampler sampler = MakeSampler(options);
  std::vector<int32_t> history;
  for (int i = 0; i < 20; ++i) {
    const int32_t id = sampler.Sample(logits, history);
    EXPECT_EQ(id, 1234);
    history.push_back(id);
  }
}

// ---------------------------------------------------------------------------
// StopMatcher

// Feeds `pieces`; the concatenated output.
std::string FeedAll(StopMatcher& matcher, const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& piece : pieces) out += matcher.Push(piece);
  return out;
}

// Reference: the text before the first stop string to complete (the one ending
// first, the longest of those ending together).
std::string ReferenceStop(const std::string& text, const std::vector<std::string>& stops,
                          bool* stopped) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t longest = 0;
    for (const std::string& s : stops) {
      if (!s.empty() && s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0) {
        longest = std::max(longest, s.size());
      }
    }
    if (longest > 0) {
      *stopped = true;
      return text.substr(0, end - longest);
    }
  }
  *stopped = false;
  return text;
}

TEST(StopMatcherTest, WithoutStopStringsEverythingPassesThrough) {
  StopMatcher matcher({});
  EXPECT_EQ(matcher.Push("Hello"), "Hello");
  EXPECT_EQ(matcher.Push(", world"), ", world");
  EXPECT_FALSE(matcher.stopped());
  EXPECT_EQ(matcher.Flush(), "");
}

TEST(StopMatcherTest, StopStringInOnePiece) {
  StopMatcher matcher({"<|end|>"});
  EXPECT_EQ(matcher.Push("Hello<|end|>world"), "Hello");
  EXPECT_TRUE(matcher.stopped());
  EXPECT_EQ(matcher.matched(), 0);
  EXPECT_EQ(matcher.Push("more"), "");
  EXPECT_EQ(matcher.Flush(), "");
}

TEST(StopMatcherTest, StopStringSplitAcrossPieces) {
  StopMatcher matcher({"<|end|>"});
  EXPECT_EQ(matcher.Push("Hi <"), "Hi ");
  EXPECT_EQ(matcher.pending(), "<");
  EXPECT_EQ(matcher.Push("|en"), "");
  EXPECT_FALSE(matcher.stopped());
  EXPECT_EQ(matcher.Push("d|>"), "");
  EXPECT_TRUE(matcher.stopped());
  EXPECT_EQ(matcher.Push("ignored"), "");
}

TEST(StopMatcherTest, PartialPrefixIsHeldBackThenReleased) {
  StopMatcher matcher({"</s>"});
  EXPECT_EQ(matcher.Push("a</"), "a");
  EXPECT_EQ(matcher.Push("s"), "");
  EXPECT_EQ(matcher.pending(), "</s");
  EXPECT_EQ(matcher.Push("!"), "</s!");
  EXPECT_EQ(matcher.pending(), "");
  EXPECT_FALSE(matcher.stopped());
  // Text after the released prefix that starts a new one is held again.
  EXPECT_EQ(matcher.Push(" ok <"), " ok ");
  EXPECT_EQ(matcher.Flush(), "<");
  EXPECT_FALSE(matcher.stopped());
}

TEST(StopMatcherTest, OverlappingPrefixHoldsOnlyWhatCanStillMatch) {
  StopMatcher matcher({"aab"});
  EXPECT_EQ(FeedAll(matcher, {"a", "a"}), "");
  EXPECT_EQ(matcher.Push("a"), "a");  // "aaa": only the last "aa" can still match
  EXPECT_EQ(matcher.Push("b"), "");
  EXPECT_TRUE(matcher.stopped());
}

TEST(StopMatcherTest, MultipleStopStrings) {
  StopMatcher matcher({"\n\nUser:", "###"});
  EXPECT_EQ(matcher.Push("The answer is 4.\n"), "The answer is 4.");
  EXPECT_EQ(matcher.pending(), "\n");      // may start "\n\nUser:"
  EXPECT_EQ(matcher.Push("\n#"), "\n\n");  // now only "#" may start a stop string
  EXPECT_EQ(matcher.Push("##"), "");
  EXPECT_TRUE(matcher.stopped());
  EXPECT_EQ(matcher.matched(), 1);
}

TEST(StopMatcherTest, FirstToCompleteWinsWhateverTheSplit) {
  const std::vector<std::string> stops = {"abcd", "bc"};
  const std::string text = "xabcdy";
  // Every split of the text into pieces.
  for (uint32_t mask = 0; mask < (1u << (text.size() - 1)); ++mask) {
    std::vector<std::string> pieces(1);
    for (size_t i = 0; i < text.size(); ++i) {
      pieces.back() += text[i];
      if (i + 1 < text.size() && (mask >> i & 1u)) pieces.emplace_back();
    }
    StopMatcher matcher(stops);
    EXPECT_EQ(FeedAll(matcher, pieces), "xa") << "mask " << mask;
    EXPECT_EQ(matcher.matched(), 1) << "mask " << mask;
  }
}

TEST(StopMatcherTest, MatchesTheReferenceOnRandomText) {
  const std::vector<std::string> stops = {"ab", "bca", "cc", "abcab"};
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 500; ++trial) {
    std::string text;
    const size_t length = 1 + rng() % 20;
    for (size_t i = 0; i < length; ++i) text += static_cast<char>('a' + rng() % 3);
    std::vector<std::string> pieces(1);
    for (char c : text) {
      if (!pieces.back().empty() && rng() % 3 == 0) pieces.emplace_back();
      pieces.back() += c;
    }
    bool stopped = false;
    const std::string expected = ReferenceStop(text, stops, &stopped);
    StopMatcher matcher(stops);
    std::string out = FeedAll(matcher, pieces);
    EXPECT_EQ(matcher.stopped(), stopped) << text;
    out += matcher.Flush();
    EXPECT_EQ(out, expected) << text;
  }
}

TEST(StopMatcherTest, EmptyStopStringsAreIgnored) {
  StopMatcher matcher({"", "STOP"});
  EXPECT_EQ(matcher.Push("go STOP now"), "go ");
  EXPECT_EQ(matcher.matched(), 1);
}

TEST(StopMatcherTest, ResetStartsOver) {
  StopMatcher matcher({"END"});
  EXPECT_EQ(matcher.Push("oneEN"), "one");
  EXPECT_EQ(matcher.Push("D"), "");
  EXPECT_TRUE(matcher.stopped());
  matcher.Reset();
  EXPECT_FALSE(matcher.stopped());
  EXPECT_EQ(matcher.matched(), -1);
  EXPECT_EQ(matcher.Push("two E"), "two ");
  EXPECT_EQ(matcher.Flush(), "E");
}

TEST(StopMatcherTest, MultiByteStopString) {
  StopMatcher matcher(
      {"\xE2\x80\x94"
       "END"});  // "—END"
  EXPECT_EQ(matcher.Push("caf\xC3\xA9 \xE2\x80"), "caf\xC3\xA9 ");
  EXPECT_EQ(matcher.Push("\x94"
                         "EN"),
            "");
  EXPECT_EQ(matcher.Push("D"), "");
  EXPECT_TRUE(matcher.stopped());
}

}  // namespace
}  // namespace moert::model
