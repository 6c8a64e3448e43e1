// The f32 top-k microkernels (every ISA variant this build has, the scalar reference
// included) against an oracle written here: a std::stable_sort of the indices under
// the contract's order (kernels/ukernel.h: descending value, +0.0 == -0.0, NaN below
// every number, ties to the lower index). Exact index equality, on every n that
// changes a vector tail and every k the router uses, over value sets made of ties,
// signed zeros, infinities, NaNs of any payload, denormals and arbitrary bit patterns.
// The input ends at a page boundary followed by an inaccessible page, so that a
// kernel reading past x[n) crashes; words past indices[k) must stay untouched.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/config.h"
#include "kernels/ukernel.h"

namespace moert::kernels {
namespace {

enum class Values {
  kRandom,       // normal(0, 3)
  kTies,         // from {0, 1, 2}
  kAllEqual,     // all 1.5
  kSignedZeros,  // +0.0 and -0.0, a few +-1
  kInfinities,   // +-inf, +-FLT_MAX and random
  kNaNs,         // NaNs of random sign and payload among numbers and infinities
  kAllNaN,       // NaNs only
  kNegative,     // negative only, -0.0 and negative denormals included
  kExtremes,     // huge, denormal, FLT_MIN and zero magnitudes, both signs
  kAdjacent,     // within a few ulps of each other, across zero and at 1.0
  kRandomBits,   // any 32-bit pattern
};

const char* ValuesName(Values v) {
  switch (v) {
    case Values::kRandom:
      return "random";
    case Values::kTies:
      return "ties";
    case Values::kAllEqual:
      return "all_equal";
    case Values::kSignedZeros:
      return "signed_zeros";
    case Values::kInfinities:
      return "infinities";
    case Values::kNaNs:
      return "nans";
    case Values::kAllNaN:
      return "all_nan";
    case Values::kNegative:
      return "negative";
    case Values::kExtremes:
      return "extremes";
    case Values::kAdjacent:
      return "adjacent";
    case Values::kRandomBits:
      return "random_bits";
  }
  return "?";
}

constexpr Values kAllValues[] = {Values::kRandom,      Values::kTies,       Values::kAllEqual,
                                 Values::kSignedZeros, Values::kInfinities, Values::kNaNs,
                                 Values::kAllNaN,      Values::kNegative,   Values::kExtremes,
                                 Values::kAdjacent,    Values::kRandomBits};

float FromBits(uint32_t bits) { return std::bit_cast<float>(bits); }

// A NaN of random sign and payload (quiet or signalling).
float RandomNaN(std::mt19937& rng) {
  const uint32_t payload = (static_cast<uint32_t>(rng()) & 0x7FFFFF) | 1;  // never inf
  const uint32_t sign = (rng() & 1) << 31;
  return FromBits(sign | 0x7F800000 | payload);
}

std::vector<float> MakeValues(Values kind, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  auto pick = [&](size_t count) { return static_cast<size_t>(rng() % count); };
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr float kMax = std::numeric_limits<float>::max();
  constexpr float kMin = std::numeric_limits<float>::min();  // smallest normal
  constexpr float kDenorm = std::numeric_limits<float>::denorm_min();
  std::vector<float> x(n);
  for (float& v : x) {
    switch (kind) {
      case Values::kRandom:
        v = normal(rng);
        break;
      case Values::kTies:
        v = static_cast<float>(pick(3));
        break;
      case Values::kAllEqual:
        v = 1.5f;
        break;
      case Values::kSignedZeros: {
        static constexpr float kSet[] = {0.0f, -0.0f, 0.0f, -0.0f, 1.0f, -1.0f};
        v = kSet[pick(6)];
        break;
      }
      case Values::kInfinities: {
        static constexpr float kSet[] = {kInf, -kInf, kMax, -kMax};
        v = pick(2) == 0 ? kSet[pick(4)] : normal(rng);
        break;
      }
      case Values::kNaNs: {
        const size_t r = pick(6);
        v = r < 2 ? RandomNaN(rng) : r == 2 ? (pick(2) ? kInf : -kInf) : normal(rng);
        break;
      }
      case Values::kAllNaN:
        v = RandomNaN(rng);
        break;
      case Values::kNegative: {
        static constexpr float kSet[] = {-0.0f, -kDenorm, -2 * kDenorm, -kMin, -kInf};
        v = pick(4) == 0 ? kSet[pick(5)] : -std::fabs(normal(rng));
        break;
      }
      case Values::kExtremes: {
        static constexpr float kSet[] = {kMax,   -kMax,   1e38f,    -1e38f,      kMin,
                                         -kMin,  kDenorm, -kDenorm, 3 * kDenorm, -3 * kDenorm,
                                         1e-40f, -1e-40f, 0.0f,     -0.0f};
        v = kSet[pick(std::size(kSet))];
        break;
      }
      case Values::kAdjacent: {
        // A few ulps either side of 0 (through the denormals and both zeros) or of 1.
        const int steps = static_cast<int>(pick(7)) - 3;
        float base = pick(2) == 0 ? 0.0f : 1.0f;
        if (base == 0.0f && pick(2) == 0) base = -0.0f;
        v = base;
        for (int s = 0; s < std::abs(steps); ++s) v = std::nextafter(v, steps > 0 ? kInf : -kInf);
        break;
      }
      case Values::kRandomBits:
        v = FromBits(static_cast<uint32_t>(rng()));
        break;
    }
  }
  return x;
}

// The contract's order as a sort: numbers above NaNs, then larger values first;
// stable_sort keeps equal values (and NaNs) in index order.
std::vector<uint32_t> Oracle(const std::vector<float>& x, size_t k) {
  std::vector<uint32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const bool a_number = !std::isnan(x[a]);
    const bool b_number = !std::isnan(x[b]);
    if (a_number != b_number) return a_number;
    return a_number && x[a] > x[b];
  });
  order.resize(k);
  return order;
}

// n floats that end where an inaccessible page begins.
class GuardedFloats {
 public:
  explicit GuardedFloats(size_t n) : n_(n) {
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t data_bytes = (n * sizeof(float) + page_ - 1) / page_ * page_;
    bytes_ = data_bytes + page_;
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    base_ = static_cast<char*>(p);
    if (mprotect(base_ + data_bytes, page_, PROT_NONE) != 0) return;
    data_ = reinterpret_cast<float*>(base_ + data_bytes) - n;
  }
  ~GuardedFloats() {
    if (base_ != nullptr) munmap(base_, bytes_);
  }
  GuardedFloats(const GuardedFloats&) = delete;
  GuardedFloats& operator=(const GuardedFloats&) = delete;

  float* data() const { return data_; }  // nullptr if the mapping failed
  size_t size() const { return n_; }

 private:
  size_t n_;
  size_t page_ = 0;
  size_t bytes_ = 0;
  char* base_ = nullptr;
  float* data_ = nullptr;
};

std::string Describe(const std::vector<float>& x) {
  std::string s;
  for (size_t i = 0; i < x.size(); ++i) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%s[%zu]=%a(0x%08x)", i ? " " : "", i, static_cast<double>(x[i]),
                  std::bit_cast<uint32_t>(x[i]));
    s += buf;
  }
  return s;
}

// One case: n values of one kind, k of them asked for.
class TopKTester {
 public:
  TopKTester& n(size_t v) {
    n_ = v;
    return *this;
  }
  TopKTester& k(size_t v) {
    k_ = v;
    return *this;
  }
  TopKTester& values(Values v) {
    values_ = v;
    return *this;
  }
  TopKTester& seed(uint32_t v) {
    seed_ = v;
    return *this;
  }

  void Test(moert_f32_topk_ukernel_fn kernel) const {
    ASSERT_TRUE(k_ >= 1 && k_ <= n_ && n_ <= MOERT_TOPK_MAX_N) << Name();
    const std::vector<float> x = MakeValues(values_, n_, seed_);
    GuardedFloats input(n_);
    ASSERT_NE(input.data(), nullptr) << "mmap";
    std::copy(x.begin(), x.end(), input.data());
    constexpr uint32_t kSentinel = 0xDEADBEEF;
    constexpr size_t kSlack = 8;
    std::vector<uint32_t> got(k_ + kSlack, kSentinel);
    kernel(n_, input.data(), k_, got.data());
    for (size_t i = k_; i < got.size(); ++i) {
      ASSERT_EQ(got[i], kSentinel) << Name() << ": wrote indices[" << i << "]";
    }
    got.resize(k_);
    const std::vector<uint32_t> want = Oracle(x, k_);
    ASSERT_EQ(got, want) << Name() << "\n  x: " << Describe(x);
    // The input is not modified.
    ASSERT_EQ(std::memcmp(input.data(), x.data(), n_ * sizeof(float)), 0) << Name();
  }

  std::string Name() const {
    return std::string(ValuesName(values_)) + " n=" + std::to_string(n_) +
           " k=" + std::to_string(k_) + " seed=" + std::to_string(seed_);
  }

 private:
  size_t n_ = 8;
  size_t k_ = 1;
  Values values_ = Values::kRandom;
  uint32_t seed_ = 1;
};

constexpr size_t kSizes[] = {1,  2,  3,  7,  8,  9,   15,  16,  17,  31,
                             32, 33, 63, 64, 65, 127, 128, 129, 255, 256};

// The ks for n: 1, 2, 3, 4, 8 and n itself, those <= n.
std::vector<size_t> KsFor(size_t n) {
  std::vector<size_t> ks;
  for (size_t k : {size_t{1}, size_t{2}, size_t{3}, size_t{4}, size_t{8}, n}) {
    if (k <= n && std::find(ks.begin(), ks.end(), k) == ks.end()) ks.push_back(k);
  }
  return ks;
}

class TopKTest : public ::testing::TestWithParam<Isa> {
 protected:
  // The variant under test; nullptr (with a skip reason) when there is none.
  moert_f32_topk_ukernel_fn Kernel() {
    auto config = KernelConfigFor(GetParam());
    if (!config.ok()) {
      skip_reason_ = std::string(config.status().message());
      return nullptr;
    }
    if (config->topk.isa != GetParam() || config->topk.topk == nullptr) {
      skip_reason_ = std::string("no f32-topk kernel for ") + IsaName(GetParam());
      return nullptr;
    }
    return config->topk.topk;
  }

  void RunAll(Values values, uint32_t seeds) {
    moert_f32_topk_ukernel_fn kernel = Kernel();
    if (kernel == nullptr) GTEST_SKIP() << skip_reason_;
    for (size_t n : kSizes) {
      for (size_t k : KsFor(n)) {
        for (uint32_t s = 0; s < seeds; ++s) {
          const uint32_t seed = static_cast<uint32_t>(n * 1000 + k * 10) + s;
          TopKTester().n(n).k(k).values(values).seed(seed).Test(kernel);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }

  std::string skip_reason_;
};

TEST_P(TopKTest, Random) { RunAll(Values::kRandom, 4); }
TEST_P(TopKTest, ManyTies) { RunAll(Values::kTies, 4); }
TEST_P(TopKTest, AllEqual) { RunAll(Values::kAllEqual, 1); }
TEST_P(TopKTest, SignedZeros) { RunAll(Values::kSignedZeros, 3); }
TEST_P(TopKTest, Infinities) { RunAll(Values::kInfinities, 3); }
TEST_P(TopKTest, NaNs) { RunAll(Values::kNaNs, 4); }
TEST_P(TopKTest, AllNaN) { RunAll(Values::kAllNaN, 2); }
TEST_P(TopKTest, Negative) { RunAll(Values::kNegative, 3); }
TEST_P(TopKTest, LargeAndDenormal) { RunAll(Values::kExtremes, 3); }
TEST_P(TopKTest, AdjacentUlps) { RunAll(Values::kAdjacent, 3); }
TEST_P(TopKTest, RandomBitPatterns) { RunAll(Values::kRandomBits, 4); }

// Every k from 1 to n on a few sizes: the rounds past the first few (all selected
// numbers masked out, NaNs and padding lanes left) must keep the order.
TEST_P(TopKTest, EveryK) {
  moert_f32_topk_ukernel_fn kernel = Kernel();
  if (kernel == nullptr) GTEST_SKIP() << skip_reason_;
  for (size_t n : {size_t{5}, size_t{13}, size_t{64}, size_t{71}}) {
    for (size_t k = 1; k <= n; ++k) {
      for (Values values : kAllValues) {
        TopKTester().n(n).k(k).values(values).seed(static_cast<uint32_t>(7 * n + k)).Test(kernel);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

// Hand-written cases whose answer is known without the oracle, so that the oracle's
// order is itself checked.
TEST_P(TopKTest, KnownAnswers) {
  moert_f32_topk_ukernel_fn kernel = Kernel();
  if (kernel == nullptr) GTEST_SKIP() << skip_reason_;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const struct {
    std::vector<float> x;
    std::vector<uint32_t> want;
  } kCases[] = {
      {{1.0f, 3.0f, 2.0f}, {1, 2, 0}},
      {{-0.0f, 0.0f, -0.0f}, {0, 1, 2}},                           // +0 == -0: index order
      {{nan, -kInf, nan, 0.0f, -nan}, {3, 1, 0, 2, 4}},            // NaN below -inf
      {{2.0f, 5.0f, 5.0f, 2.0f, 5.0f, 1.0f}, {1, 2, 4, 0, 3, 5}},  // ties: lower index
      {{-1.0f, -FLT_MIN, -std::numeric_limits<float>::denorm_min(), -0.0f}, {3, 2, 1, 0}},
      {{kInf, 3.0e38f, std::numeric_limits<float>::max(), kInf}, {0, 3, 2, 1}},
  };
  for (const auto& c : kCases) {
    std::vector<uint32_t> got(c.x.size());
    kernel(c.x.size(), c.x.data(), c.x.size(), got.data());
    EXPECT_EQ(got, c.want) << Describe(c.x);
    EXPECT_EQ(Oracle(c.x, c.x.size()), c.want) << Describe(c.x);
  }
  // n = 256, the largest: the best is last, the second best first.
  std::vector<float> x(MOERT_TOPK_MAX_N, -1.0f);
  x.back() = 10.0f;
  x.front() = 9.0f;
  x[100] = 9.0f;
  uint32_t got[3];
  kernel(x.size(), x.data(), 3, got);
  EXPECT_EQ(got[0], MOERT_TOPK_MAX_N - 1);
  EXPECT_EQ(got[1], 0u);
  EXPECT_EQ(got[2], 100u);
}

INSTANTIATE_TEST_SUITE_P(AllIsas, TopKTest,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kNeonDot, Isa::kNeonI8mm,
                                           Isa::kSme2),
                         [](const ::testing::TestParamInfo<Isa>& param_info) {
                           return std::string(IsaName(param_info.param));
                         });

// The scalar config's top-k is the scalar reference, on every machine.
TEST(TopKConfigTest, ScalarConfigHoldsScalarTopK) {
  auto config = KernelConfigFor(Isa::kScalar);
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->topk.topk, &moert_f32_topk_ukernel__scalar);
  EXPECT_EQ(config->topk.isa, Isa::kScalar);
  EXPECT_NE(GetKernelConfig().topk.topk, nullptr);
}

}  // namespace
}  // namespace moert::kernels
