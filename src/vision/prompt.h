// How an image enters a MiniCPM-V prompt, as llama.cpp's minicpmv-cli lays it out
// (examples/llava/minicpmv-cli.cpp at commit c392e5094; ../shared/mmproj/NOTES.md, 9):
// the overview slice between "<image>" and "</image>", then, when the image was cut
// into tiles, "<slice>", for each grid row each tile between "<image>" and "</image>"
// and a "\n" after the row, and "</slice>". The cli evaluates each literal string on its
// own (tokenized with specials parsed and no BOS), so the pieces here are what it
// tokenizes, one by one.
#ifndef MOERT_VISION_PROMPT_H_
#define MOERT_VISION_PROMPT_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace moert::vision {

// One piece of a prompt: text, tokenized alone, or one slice's embeddings.
struct PromptPiece {
  std::string text;
  int image = -1;  // >= 0: the embeddings of slice `slice` of image `image`
  int slice = -1;

  bool is_text() const { return image < 0; }
};

// The strings around a user turn for a minicpmv_version: 2 (MiniCPM-V 2.5, Llama 3
// headers), 3 (2.6) and 4 (o 2.6), ChatML. InvalidArgument for another version.
struct TurnMarkers {
  std::string user_open;       // "<|im_start|>user\n"
  std::string assistant_open;  // "<|im_end|><|im_start|>assistant\n"
};
absl::StatusOr<TurnMarkers> MinicpmvTurnMarkers(int version);

// Appends image `image`'s pieces: `prefix` + "<image>" (one piece, as the cli
// evaluates its turn opener and the first "<image>" together), slice 0, "</image>"
// and, with n_slices > 1, "<slice>", the tiles (n_slices - 1 of them, `columns` per
// grid row, each between "<image>" and "</image>", "\n" after a row's last) and
// "</slice>". n_slices >= 1, columns >= 1.
void AppendImagePieces(int image, int n_slices, int columns, std::string_view prefix,
                       std::vector<PromptPiece>* pieces);

// An image's slices and tile columns (PreprocessedImage::embeds_columns).
struct ImageLayout {
  int n_slices = 1;
  int columns = 1;
};

// minicpmv-cli's user turn with `images` and `text`: the version's user opener, each
// image's pieces, the text, the assistant opener. InvalidArgument for an unknown
// version.
absl::StatusOr<std::vector<PromptPiece>> MinicpmvUserTurn(int version,
                                                          const std::vector<ImageLayout>& images,
                                                          std::string_view text);

}  // namespace moert::vision

#endif  // MOERT_VISION_PROMPT_H_
