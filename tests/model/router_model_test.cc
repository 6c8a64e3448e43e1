// The hardware-aware router inside the oracle models: with no adjustment in force it
// chooses the experts and weights of the reference routing bit for bit (and so the
// logits are the same bits); with pressure it changes choices toward resident
// experts; thermal and dynamic k give fewer experts, and an expert pool gives the same
// output as fully resident experts under them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/model.h"
#include "router/router.h"

namespace moert::model {
namespace {

const std::string kModels = std::string(MOERT_SHARED_DIR) + "/models/";

struct Route {
  int layer;
  std::vector<int> experts;
  std::vector<uint32_t> weight_bits;
  bool operator==(const Route&) const = default;
};

void PrintTo(const Route& r, std::ostream* os) {
  *os << "layer " << r.layer << " experts";
  for (int e : r.experts) *os << " " << e;
}

struct Generation {
  std::vector<Route> routes;
  std::vector<float> logits;  // prefill's, then each decode step's
  std::vector<int32_t> tokens;
};

std::vector<int32_t> Prompt() {
  std::vector<int32_t> ids = {1, 650, 996, 2007, 13, 2026, 1985, 565, 341, 586, 1749};
  uint32_t state = 99;
  while (ids.size() < 40) {
    state = state * 1103515245u + 12345u;
    ids.push_back(static_cast<int32_t>((state >> 8) % 2048));
  }
  return ids;
}

// Loads `name` with `options` (a route observer added), prefills the prompt and
// decodes `steps` greedy tokens. `before_step` runs before every Forward.
Generation Generate(const std::string& name, ModelLoadOptions options, int steps,
             const std::function<void(Model&)>& before_step = {}) {
  Generation run;
  options.route_observer = [&run](int layer, int64_t n, int slots, const int* experts,
                                  const float* weights) {
    for (int64_t t = 0; t < n; ++t) {
      Route r{layer, {}, {}};
      for (int s = 0; s < slots; ++s) {
        r.experts.push_back(experts[t * slots + s]);
        uint32_t bits;
        std::memcpy(&bits, &weights[t * slots + s], 4);
        r.weight_bits.push_back(bits);
      }
      run.routes.push_back(std::move(r));
    }
  };
  auto file = format::GgufFile::Open(kModels + name);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return run;
  auto model = Model::Load(**file, options);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return run;
  auto cache = (*model)->NewKvCache(64);
  EXPECT_TRUE(cache.ok());
  std::vector<int32_t> tokens = Prompt();
  std::vector<float> logits;
  const size_t vocab = (*model)->spec().n_vocab;
  for (int i = 0; i <= steps; ++i) {
    if (before_step) before_step(**model);
    const absl::Status s = (*model)->Forward(tokens, cache->get(), LogitsFor::kLast, &logits);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) return run;
    run.logits.insert(run.logits.end(), logits.begin(), logits.end());
    const int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + vocab) - logits.begin());
    run.tokens.push_back(next);
    tokens = {next};
  }
  return run;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

ModelLoadOptions Options() {
  ModelLoadOptions options;
  options.threads = 2;
  options.kv_cache_positions = 64;
  options.hot_set = false;
  return options;
}

class RouterModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RouterModelTest, WithoutAdjustmentsMatchesTheReferenceRoutingBitForBit) {
  ModelLoadOptions reference = Options();
  reference.reference_routing = true;
  const Generation want = Generate(GetParam(), reference, 8);
  const Generation got = Generate(GetParam(), Options(), 8);
  ASSERT_FALSE(want.routes.empty());
  ASSERT_EQ(got.routes.size(), want.routes.size());
  for (size_t i = 0; i < want.routes.size(); ++i) {
    ASSERT_EQ(got.routes[i], want.routes[i]) << "route " << i << " (layer " << want.routes[i].layer << ")";
  }
  EXPECT_TRUE(SameBits(got.logits, want.logits));
  EXPECT_EQ(got.tokens, want.tokens);
}

INSTANTIATE_TEST_SUITE_P(Oracle, RouterModelTest,
                         ::testing::Values("tiny-moe-shakespeare-f32.gguf",
                                           "tiny-moe-shakespeare-q8_0.gguf",
                                           "tiny-moe-shakespeare-q4_0.gguf"),
                         [](const auto& p) {
                           return std::string(p.param).find("f32") != std::string::npos    ? "f32"
                                  : std::string(p.param).find("q8_0") != std::string::npos ? "q8_0"
                                                                                           : "q4_0";
                         });

const char kQ4[] = "tiny-moe-shakespeare-q4_0.gguf";

TEST(RouterModel, ResidencyPenaltyChangesChoicesOnlyUnderPressure) {
  // A pool of 25% of the experts: the working set does not fit, pressure > 0.
  ModelLoadOptions pooled = Options();
  pooled.expert_pool_fraction = 0.25;
  pooled.router.alpha = 0;
  const Generation plain = Generate(kQ4, pooled, 8);
  pooled.router.alpha = 4;
  float max_pressure = 0;
  uint64_t changed = 0;
  const Generation penalised = Generate(kQ4, pooled, 8, [&](Model& m) {
    const router::Router* r = m.router();
    ASSERT_NE(r, nullptr);
    max_pressure = std::max(max_pressure, r->pressure());
    changed = r->stats().changed;
  });
  EXPECT_GT(max_pressure, 0.0f);
  EXPECT_GT(changed, 0u);
  EXPECT_NE(penalised.routes, plain.routes);
  for (float v : penalised.logits) ASSERT_TRUE(std::isfinite(v));

  // The whole model resident: pressure 0, so alpha 4 is the reference routing.
  ModelLoadOptions resident = Options();
  resident.router.alpha = 4;
  ModelLoadOptions reference = Options();
  reference.reference_routing = true;
  EXPECT_EQ(Generate(kQ4, resident, 8).routes, Generate(kQ4, reference, 8).routes);
}

TEST(RouterModel, ThermalAndDynamicKWithAPoolMatchFullyResident) {
  // Thermal: k = 2 - 1 = 1 at every token-layer; dynamic k: p = 0.6 leaves some
  // tokens one expert; p = 0.9 with k_max 3 gives tokens 3 slots (more than the
  // model's k). Either way the pool (alpha 0) changes nothing.
  for (int mode = 0; mode < 3; ++mode) {
    ModelLoadOptions options = Options();
    options.router.alpha = 0;
    const auto hot = [&](Model& m) {
      router::ResourceMonitor* monitor = m.resource_monitor();
      ASSERT_NE(monitor, nullptr);
      if (mode == 0) monitor->SetTemperature(95.0f);
    };
    if (mode == 0) {
      options.resource_monitor.thermal_limit_c = 80;
    } else {
      options.router.dynamic_k_p = mode == 1 ? 0.6f : 0.9f;
      options.router.k_max = mode == 1 ? 0 : 3;
    }
    const Generation resident = Generate(kQ4, options, 8, hot);
    options.expert_pool_fraction = 0.25;
    const Generation pooled = Generate(kQ4, options, 8, hot);
    ASSERT_FALSE(resident.routes.empty());
    size_t empty_slots = 0, slots = 0, full_three = 0;
    for (const Route& r : resident.routes) {
      slots += r.experts.size();
      full_three += r.experts.size() == 3 && r.experts[2] != -1;
      empty_slots += static_cast<size_t>(std::count(r.experts.begin(), r.experts.end(), -1));
      ASSERT_NE(r.experts[0], -1);
    }
    if (mode == 0) {
      EXPECT_EQ(empty_slots * 2, slots) << "thermal: one of two slots empty everywhere";
    } else {
      EXPECT_GT(empty_slots, 0u) << "dynamic k";
      EXPECT_LT(empty_slots * 2, slots) << "dynamic k";
    }
    if (mode == 2) {
      EXPECT_GT(full_three, 0u) << "dynamic k: some tokens use 3 experts";
    }
    EXPECT_EQ(pooled.routes, resident.routes) << "mode " << mode;
    EXPECT_TRUE(SameBits(pooled.logits, resident.logits)) << "mode " << mode;
    for (float v : resident.logits) ASSERT_TRUE(std::isfinite(v));
  }
}

TEST(RouterModel, UniformRoutingIsReproducibleAndNotTheModels) {
  // moert-bench --routing uniform: distinct random experts, the same for a seed, with
  // or without a pool (the draw reads no residency), other experts for another seed
  // and than the model's routing.
  ModelLoadOptions options = Options();
  options.router.alpha = 0;
  options.router.routing = router::RoutingOverride::kUniform;
  options.router.routing_seed = 5;
  const Generation uniform = Generate(kQ4, options, 8);
  ASSERT_FALSE(uniform.routes.empty());
  for (const Route& r : uniform.routes) {
    std::vector<int> sorted = r.experts;
    std::sort(sorted.begin(), sorted.end());
    ASSERT_GE(sorted.front(), 0) << ::testing::PrintToString(r);
    ASSERT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end())
        << ::testing::PrintToString(r);
  }
  EXPECT_EQ(Generate(kQ4, options, 8).routes, uniform.routes);
  ModelLoadOptions pooled = options;
  pooled.expert_pool_fraction = 0.25;
  EXPECT_EQ(Generate(kQ4, pooled, 8).routes, uniform.routes);
  ModelLoadOptions other_seed = options;
  other_seed.router.routing_seed = 6;
  EXPECT_NE(Generate(kQ4, other_seed, 8).routes, uniform.routes);
  ModelLoadOptions model_routing = options;
  model_routing.router.routing = router::RoutingOverride::kModel;
  EXPECT_NE(Generate(kQ4, model_routing, 8).routes, uniform.routes);
}

TEST(RouterModel, BadRouterOptionsAreLoadErrors) {
  auto file = format::GgufFile::Open(kModels + kQ4);
  ASSERT_TRUE(file.ok());
  ModelLoadOptions options = Options();
  options.router.alpha = -2;
  auto model = Model::Load(**file, options);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(model.status().message()).find("alpha"), std::string::npos);
  options = Options();
  options.modality_bias_path = "/nonexistent/bias.txt";
  EXPECT_EQ(Model::Load(**file, options).status().code(), absl::StatusCode::kNotFound);
  options = Options();
  options.resource_monitor.thermal_limit_c = -5;
  EXPECT_EQ(Model::Load(**file, options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moert::model
