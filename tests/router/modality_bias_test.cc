// The modality bias from routing statistics (router/modality_bias.h).
#include "router/modality_bias.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace moert::router {
namespace {

TEST(ModalityBiasEstimator, LogRatioOfSmoothedFrequencies) {
  ModalityBiasEstimator est(2, 4);
  // Layer 0: text tokens choose experts 0 and 1, image tokens 2 and 3 (top-2).
  const int text[] = {0, 1, 0, 1, 1, 0};
  const int image[] = {2, 3, 3, 2};
  const uint8_t no[3] = {0, 0, 0};
  const uint8_t yes[2] = {1, 1};
  est.Observe(0, 3, 2, text, no);
  est.Observe(0, 2, 2, image, yes);
  // Layer 1: both modalities choose expert 0 in one slot; -1 slots are skipped.
  const int same[] = {0, -1, 0, -1};
  const uint8_t mixed[2] = {0, 1};
  est.Observe(1, 2, 2, same, mixed);
  EXPECT_EQ(est.text_token_layers(), 4u);
  EXPECT_EQ(est.image_token_layers(), 3u);
  auto bias = est.Bias(10.0f);
  ASSERT_TRUE(bias.ok()) << bias.status();
  ASSERT_EQ(bias->size(), 8u);
  // Layer 0: text slots 6, image slots 4; f = (count + 1) / (slots + 4).
  EXPECT_NEAR((*bias)[0], std::log((0 + 1) / 8.0 / ((3 + 1) / 10.0)), 1e-6);
  EXPECT_NEAR((*bias)[2], std::log((2 + 1) / 8.0 / ((0 + 1) / 10.0)), 1e-6);
  EXPECT_GT((*bias)[3], 0.0f);
  EXPECT_LT((*bias)[1], 0.0f);
  // Layer 1: the same choices: no bias.
  for (int e = 4; e < 8; ++e) EXPECT_NEAR((*bias)[static_cast<size_t>(e)], 0.0f, 1e-6) << e;
  // Clipped.
  auto clipped = est.Bias(0.5f);
  ASSERT_TRUE(clipped.ok());
  EXPECT_FLOAT_EQ((*clipped)[2], 0.5f);
  EXPECT_FLOAT_EQ((*clipped)[0], -0.5f);
  EXPECT_EQ(BiasRows(*clipped, 4).size(), 2u);
}

TEST(ModalityBiasEstimator, NeedsBothModalitiesAndAPositiveClip) {
  ModalityBiasEstimator est(1, 4);
  EXPECT_EQ(est.Bias().status().code(), absl::StatusCode::kFailedPrecondition);
  const int chosen[] = {1, 2};
  const uint8_t text[1] = {0};
  est.Observe(0, 1, 2, chosen, text);
  auto none = est.Bias();
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(none.status().message()).find("no image token"), std::string::npos);
  const uint8_t image[1] = {1};
  est.Observe(0, 1, 2, chosen, image);
  est.Observe(5, 1, 2, chosen, image);   // an out-of-range layer is ignored
  const int bad[] = {9, -3};
  est.Observe(0, 1, 2, bad, image);      // so are out-of-range experts
  EXPECT_TRUE(est.Bias().ok());
  EXPECT_EQ(est.Bias(0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moert::router
