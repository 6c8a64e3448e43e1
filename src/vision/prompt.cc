// minicpmv-cli's prompt layout (see prompt.h).
#include "vision/prompt.h"

#include <string>
#include <vector>

#include "core/status.h"
#include "core/strings.h"

namespace moert::vision {
namespace {

void AddText(std::string text, std::vector<PromptPiece>* pieces) {
  PromptPiece piece;
  piece.text = std::move(text);
  pieces->push_back(std::move(piece));
}

void AddSlice(int image, int slice, std::vector<PromptPiece>* pieces) {
  PromptPiece piece;
  piece.image = image;
  piece.slice = slice;
  pieces->push_back(std::move(piece));
}

}  // namespace

absl::StatusOr<TurnMarkers> MinicpmvTurnMarkers(int version) {
  switch (version) {
    case 2:
      return TurnMarkers{"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n",
                         "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"};
    case 3:
    case 4:
      return TurnMarkers{"<|im_start|>user\n", "<|im_end|><|im_start|>assistant\n"};
    default:
      return absl::InvalidArgumentError(
          StrCat("minicpmv_version ", version, " has no prompt format (2, 3 and 4 do)"));
  }
}

void AppendImagePieces(int image, int n_slices, int columns, std::string_view prefix,
                       std::vector<PromptPiece>* pieces) {
  AddText(StrCat(prefix, "<image>"), pieces);
  AddSlice(image, 0, pieces);
  AddText("</image>", pieces);
  if (n_slices <= 1) return;
  AddText("<slice>", pieces);
  // The cli walks (n_slices - 1) / columns whole rows; a grid always fills them.
  const int rows = (n_slices - 1) / columns;
  int slice = 1;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < columns; ++c) {
      AddText("<image>", pieces);
      AddSlice(image, slice++, pieces);
      AddText("</image>", pieces);
    }
    AddText("\n", pieces);
  }
  AddText("</slice>", pieces);
}

absl::StatusOr<std::vector<PromptPiece>> MinicpmvUserTurn(int version,
                                                          const std::vector<ImageLayout>& images,
                                                          std::string_view text) {
  MOERT_ASSIGN_OR_RETURN(TurnMarkers markers, MinicpmvTurnMarkers(version));
  std::vector<PromptPiece> pieces;
  std::string_view prefix = markers.user_open;
  for (size_t i = 0; i < images.size(); ++i) {
    AppendImagePieces(static_cast<int>(i), images[i].n_slices, images[i].columns, prefix, &pieces);
    prefix = {};
  }
  if (images.empty()) {
    // A turn without an image: the cli evaluates the opener and the text together.
    AddText(StrCat(markers.user_open, text), &pieces);
  } else if (!text.empty()) {
    AddText(std::string(text), &pieces);
  }
  AddText(markers.assistant_open, &pieces);
  return pieces;
}

}  // namespace moert::vision
