// minicpmv-cli's prompt layout (vision/prompt.h) and the pruning rule's token choice
// (vision/image_embedding.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "vision/image_embedding.h"
#include "vision/prompt.h"

namespace moert::vision {
namespace {

// The pieces as one string: text as it is, slice s of image i as [i:s].
std::string Flatten(const std::vector<PromptPiece>& pieces) {
  std::string out;
  for (const PromptPiece& p : pieces) {
    out += p.is_text() ? p.text
                       : "[" + std::to_string(p.image) + ":" + std::to_string(p.slice) + "]";
    out += "|";
  }
  return out;
}

TEST(MinicpmvPrompt, OneSliceIsTheOverviewOnly) {
  auto turn = MinicpmvUserTurn(3, {{1, 2}}, "Describe the image.");
  ASSERT_TRUE(turn.ok()) << turn.status();
  EXPECT_EQ(Flatten(*turn),
            "<|im_start|>user\n<image>|[0:0]|</image>|Describe the image.|"
            "<|im_end|><|im_start|>assistant\n|");
}

// test.png: 3 slices, tiles in one row of 2 (reference.txt's input ids: 380 IMG 381
// 390 380 IMG 381 380 IMG 381 10 391).
TEST(MinicpmvPrompt, TilesGoInsideSliceWithANewlinePerRow) {
  std::vector<PromptPiece> pieces;
  AppendImagePieces(0, 3, 2, "", &pieces);
  EXPECT_EQ(Flatten(pieces),
            "<image>|[0:0]|</image>|<slice>|<image>|[0:1]|</image>|<image>|[0:2]|</image>|\n|"
            "</slice>|");
  pieces.clear();
  AppendImagePieces(1, 7, 3, "P", &pieces);  // two rows of three
  EXPECT_EQ(Flatten(pieces),
            "P<image>|[1:0]|</image>|<slice>|<image>|[1:1]|</image>|<image>|[1:2]|</image>|"
            "<image>|[1:3]|</image>|\n|<image>|[1:4]|</image>|<image>|[1:5]|</image>|<image>|"
            "[1:6]|</image>|\n|</slice>|");
}

TEST(MinicpmvPrompt, VersionsAndTurnsWithoutOrWithSeveralImages) {
  auto v2 = MinicpmvUserTurn(2, {{1, 1}}, "x");
  ASSERT_TRUE(v2.ok());
  EXPECT_EQ(Flatten(*v2),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n<image>|[0:0]|</image>|"
            "x|<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n|");
  auto v4 = MinicpmvUserTurn(4, {}, "hello");
  ASSERT_TRUE(v4.ok());
  // No image: the opener and the text are one piece, as the cli evaluates them.
  EXPECT_EQ(Flatten(*v4), "<|im_start|>user\nhello|<|im_end|><|im_start|>assistant\n|");
  auto two = MinicpmvUserTurn(3, {{1, 1}, {1, 1}}, "");
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(Flatten(*two),
            "<|im_start|>user\n<image>|[0:0]|</image>|<image>|[1:0]|</image>|"
            "<|im_end|><|im_start|>assistant\n|");
  for (int bad : {0, 1, 5, -3}) {
    auto turn = MinicpmvUserTurn(bad, {}, "x");
    EXPECT_EQ(turn.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(std::string(turn.status().message()).find(std::to_string(bad)), std::string::npos);
  }
}

TEST(KeepLowestEntropy, KeepsTheMostFocusedTokensInOrder) {
  const std::vector<float> entropy = {3.0f, 0.5f, 2.0f, 0.1f, 4.0f, 0.5f, 1.0f, 3.5f};
  EXPECT_EQ(KeepLowestEntropy(entropy, 1.0f, 1), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(KeepLowestEntropy(entropy, 0.5f, 1), (std::vector<int>{1, 3, 5, 6}));
  // ceil(0.3 * 8) = 3; ties keep the lower index (1 before 5).
  EXPECT_EQ(KeepLowestEntropy(entropy, 0.3f, 1), (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(KeepLowestEntropy(entropy, 0.2f, 1), (std::vector<int>{1, 3}));
  EXPECT_EQ(KeepLowestEntropy(entropy, 0.01f, 1), (std::vector<int>{3}));
  EXPECT_EQ(KeepLowestEntropy(entropy, 0.01f, 3), (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(KeepLowestEntropy(entropy, 0.01f, 100).size(), 8u);
}

TEST(KeepLowestEntropy, OptionsOutOfRangeAreInvalidArgument) {
  EXPECT_TRUE(ValidateEmbedOptions({}).ok());
  EXPECT_TRUE(ValidateEmbedOptions({0.3f, 4}).ok());
  for (const EmbedOptions& bad : {EmbedOptions{0.0f, 1}, EmbedOptions{1.5f, 1},
                                  EmbedOptions{-0.5f, 1}, EmbedOptions{0.5f, 0}}) {
    EXPECT_EQ(ValidateEmbedOptions(bad).code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace moert::vision
