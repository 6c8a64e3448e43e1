// Weight packing into the kernels' tile layouts (kernels/ukernel.h). Every path goes
// through one GGUF row at a time: a row whose 32-value blocks already are what a
// layout stores (Q4_0 for W4, Q4_1 for W4M, Q8_0 for W8) is scattered into its 8-row
// tiles byte for byte; any other row is dequantized and requantized to that type
// first with llama.cpp's reference quantizer (format/quantize.h), except Q4_K -> W4M,
// which keeps Q4_K's nibbles and rounds each sub-block's scale and min to fp16.
#include "backend/packing.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "core/status.h"
#include "core/strings.h"
#include "format/dequant.h"
#include "format/quantize.h"
#include "kernels/ukernel.h"

namespace moert::backend {
namespace {

using format::GgmlType;

constexpr int64_t kNr = MOERT_NR;
constexpr int64_t kQk = MOERT_QK;
constexpr int64_t kQkK = 256;  // values per Q4_K super-block

size_t BlockBytes(WeightFormat format) {
  switch (format) {
    case WeightFormat::kW4:
      return sizeof(moert_w4_block);
    case WeightFormat::kW4M:
      return sizeof(moert_w4m_block);
    case WeightFormat::kW8:
      return sizeof(moert_w8_block);
    case WeightFormat::kW4S24:
      return sizeof(moert_w4s24_block);
  }
  return 0;
}

// The GGUF type whose 32-value blocks hold exactly what one row of a layout's block
// holds (W4S24 has none: it is made from W4).
GgmlType LegacyTypeOf(WeightFormat format) {
  switch (format) {
    case WeightFormat::kW4:
    case WeightFormat::kW4S24:
      return GgmlType::kQ4_0;
    case WeightFormat::kW4M:
      return GgmlType::kQ4_1;
    case WeightFormat::kW8:
      return GgmlType::kQ8_0;
  }
  return GgmlType::kQ4_0;
}

// Byte offsets inside one tile block of row r's fields. The blocks are read and
// written with memcpy: a GGUF mapping or a caller's buffer need not be aligned.
constexpr size_t kW4Qs = offsetof(moert_w4_block, qs);
constexpr size_t kW4mM = offsetof(moert_w4m_block, m);
constexpr size_t kW4mQs = offsetof(moert_w4m_block, qs);
constexpr size_t kW8Qs = offsetof(moert_w8_block, qs);
constexpr size_t kW4s24Qs = offsetof(moert_w4s24_block, qs);
constexpr size_t kW4s24Pc = offsetof(moert_w4s24_block, pc);

// The W4S24 pair code of the columns lo < hi of a group of 4.
int W4s24PairCode(int lo, int hi) {
  for (int c = 0; c < 6; ++c) {
    if (moert_w4s24_pairs[c][0] == lo && moert_w4s24_pairs[c][1] == hi) return c;
  }
  return 0;  // Unreachable for 0 <= lo < hi <= 3.
}

// The column (0..31) of kept value k (0..15) of a row whose codes are at pc.
int W4s24Column(const uint8_t* pc, int k) {
  return 4 * (k / 2) + moert_w4s24_pairs[moert_w4s24_code(pc, k / 2)][k % 2];
}

// The tile block holding rows [8 * (row / 8), +8) and columns [32 * b, +32).
template <typename Byte>
Byte* BlockAt(Byte* base, WeightFormat format, int64_t kb, int64_t row, int64_t b) {
  return base + static_cast<size_t>((row / kNr) * kb + b) * BlockBytes(format);
}

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

void StoreU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, sizeof(v)); }

std::string Label(GgmlType type, WeightFormat target) {
  return StrCat("PackRows(", format::GgmlTypeName(type), " -> ", WeightFormatName(target), ")");
}

// rows * cols fits int64 and a size_t byte count (checked by callers before they
// compute sizes).
bool ShapeFits(int64_t rows, int64_t cols) {
  if (rows < 0 || cols <= 0) return false;
  constexpr int64_t kMax = int64_t{1} << 40;  // far above any real matrix, no overflow below
  return rows <= kMax && cols <= kMax && rows <= kMax / cols;
}

// Bytes of one GGUF block of LegacyTypeOf(kFormat).
template <WeightFormat kFormat>
constexpr size_t kGgufBlockBytes = kFormat == WeightFormat::kW8    ? 34   // Q8_0: d | qs[32]
                                   : kFormat == WeightFormat::kW4M ? 20   // Q4_1: d | m | qs[16]
                                                                   : 18;  // Q4_0: d | qs[16]

// One GGUF block of LegacyTypeOf(kFormat) at `in` as row r's share (0..7) of the tile
// block at `blk`.
template <WeightFormat kFormat>
void PutBlockRow(const uint8_t* in, size_t r, uint8_t* blk) {
  std::memcpy(blk + 2 * r, in, 2);
  if constexpr (kFormat == WeightFormat::kW8) {
    std::memcpy(blk + kW8Qs + 32 * r, in + 2, 32);
  } else if constexpr (kFormat == WeightFormat::kW4M) {
    std::memcpy(blk + kW4mM + 2 * r, in + 2, 2);
    std::memcpy(blk + kW4mQs + 16 * r, in + 4, 16);
  } else {
    std::memcpy(blk + kW4Qs + 16 * r, in + 2, 16);
  }
}

// Row `row` of the packed matrix from one GGUF row of LegacyTypeOf(kFormat) (`src`:
// cols / 32 blocks), block after block.
template <WeightFormat kFormat>
void ScatterRowOf(const uint8_t* src, int64_t row, int64_t kb, uint8_t* dst) {
  const size_t r = static_cast<size_t>(row % kNr);
  for (int64_t b = 0; b < kb; ++b, src += kGgufBlockBytes<kFormat>) {
    PutBlockRow<kFormat>(src, r, BlockAt(dst, kFormat, kb, row, b));
  }
}

// Rows [8 * tile, +8) of the packed matrix, all present, from their GGUF rows (`src`:
// the tile's first row, rows `src_row` bytes apart). The same bytes as ScatterRowOf on
// each row, written block after block: the writes run straight through the tile's
// blocks while the reads follow eight rows, which streams both ways where a row at a
// time strides its writes across every block of the tile.
template <WeightFormat kFormat>
void ScatterTile(const uint8_t* src, size_t src_row, int64_t tile, int64_t kb, uint8_t* dst) {
  uint8_t* blk = BlockAt(dst, kFormat, kb, tile * kNr, 0);
  const size_t block_bytes = BlockBytes(kFormat);
  for (int64_t b = 0; b < kb; ++b, blk += block_bytes) {
    const uint8_t* in = src + static_cast<size_t>(b) * kGgufBlockBytes<kFormat>;
    for (size_t r = 0; r < static_cast<size_t>(kNr); ++r, in += src_row) {
      PutBlockRow<kFormat>(in, r, blk);
    }
  }
}

// `rows` rows of the packed matrix: every whole tile by ScatterTile, the rows of a last
// partial tile by ScatterRowOf.
template <WeightFormat kFormat>
void ScatterRowsOf(const uint8_t* src, size_t src_row, int64_t rows, int64_t kb, uint8_t* dst) {
  const int64_t tiles = rows / kNr;
  for (int64_t t = 0; t < tiles; ++t) {
    ScatterTile<kFormat>(src + static_cast<size_t>(t * kNr) * src_row, src_row, t, kb, dst);
  }
  for (int64_t row = tiles * kNr; row < rows; ++row) {
    ScatterRowOf<kFormat>(src + static_cast<size_t>(row) * src_row, row, kb, dst);
  }
}

// ScatterRowOf and ScatterRowsOf for `format`. W4S24 is never scattered directly (it is
// pruned from a W4 copy) and takes W4's layout here.
void ScatterRow(WeightFormat format, const uint8_t* src, int64_t row, int64_t kb, uint8_t* dst) {
  switch (format) {
    case WeightFormat::kW4:
    case WeightFormat::kW4S24:
      return ScatterRowOf<WeightFormat::kW4>(src, row, kb, dst);
    case WeightFormat::kW4M:
      return ScatterRowOf<WeightFormat::kW4M>(src, row, kb, dst);
    case WeightFormat::kW8:
      return ScatterRowOf<WeightFormat::kW8>(src, row, kb, dst);
  }
}

void ScatterRows(WeightFormat format, const uint8_t* src, size_t src_row, int64_t rows, int64_t kb,
                 uint8_t* dst) {
  switch (format) {
    case WeightFormat::kW4:
    case WeightFormat::kW4S24:
      return ScatterRowsOf<WeightFormat::kW4>(src, src_row, rows, kb, dst);
    case WeightFormat::kW4M:
      return ScatterRowsOf<WeightFormat::kW4M>(src, src_row, rows, kb, dst);
    case WeightFormat::kW8:
      return ScatterRowsOf<WeightFormat::kW8>(src, src_row, rows, kb, dst);
  }
}

// Q4_K row -> W4M row: sub-block j of a super-block becomes block 8 * sb + j with
// d = fp16(d * sc_j), m = fp16(-(dmin * m_j)) and the same nibbles, reordered from
// Q4_K's (sub-blocks 2i and 2i + 1 share 32 bytes, low and high nibbles) to W4M's
// (value l of a block in byte l % 16, low nibble for l < 16).
absl::Status ScatterQ4KRow(const uint8_t* src, int64_t row, int64_t cols, uint8_t* dst) {
  const int64_t kb = cols / kQk;
  const size_t r = static_cast<size_t>(row % kNr);
  for (int64_t sb = 0; sb < cols / kQkK; ++sb) {
    const uint8_t* block = src + sb * 144;
    const uint8_t* q = block + 16;
    for (size_t j = 0; j < 8; ++j) {
      const format::KSubBlockScaleMin sm = format::QKSubBlockScaleMin(block, j);
      const uint16_t d = core::FloatToFp16(sm.scale);
      const uint16_t m = core::FloatToFp16(-sm.min);
      if (std::isfinite(sm.scale) && std::isfinite(sm.min) &&
          (!std::isfinite(core::Fp16ToFloat(d)) || !std::isfinite(core::Fp16ToFloat(m)))) {
        return absl::InvalidArgumentError(
            StrCat("row ", row, ", sub-block ", sb * 8 + static_cast<int64_t>(j), ": scale ",
                   sm.scale, " or min ", sm.min, " does not fit fp16"));
      }
      const uint8_t* sub = q + 32 * (j / 2);
      const int shift = (j % 2) * 4;
      uint8_t* blk = BlockAt(dst, WeightFormat::kW4M, kb, row, sb * 8 + static_cast<int64_t>(j));
      StoreU16(blk + 2 * r, d);
      StoreU16(blk + kW4mM + 2 * r, m);
      uint8_t* qs = blk + kW4mQs + 16 * r;
      for (size_t l = 0; l < 16; ++l) {
        const int lo = (sub[l] >> shift) & 0x0F;
        const int hi = (sub[l + 16] >> shift) & 0x0F;
        qs[l] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
  return absl::OkStatus();
}

// W4's nibble of column c (0..31) of row r in a block.
int W4Nibble(const uint8_t* blk, size_t r, int c) {
  const uint8_t byte = blk[kW4Qs + 16 * r + static_cast<size_t>(c % 16)];
  return c < 16 ? (byte & 0x0F) : (byte >> 4);
}

}  // namespace

std::string_view WeightFormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::kW4:
      return "w4";
    case WeightFormat::kW4M:
      return "w4m";
    case WeightFormat::kW8:
      return "w8";
    case WeightFormat::kW4S24:
      return "w4s24";
  }
  return "?";
}

size_t PackedBytes(WeightFormat format, int64_t rows, int64_t cols) {
  // Not a valid shape: no matrix has this layout (callers check shapes first).
  if (!ShapeFits(rows, cols) || cols % kQk != 0) return 0;
  const int64_t tiles = (rows + kNr - 1) / kNr;
  return static_cast<size_t>(tiles * (cols / kQk)) * BlockBytes(format);
}

WeightFormat NaturalFormat(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
      return WeightFormat::kW4;
    case GgmlType::kQ4_1:
    case GgmlType::kQ4_K:
      return WeightFormat::kW4M;
    default:
      return WeightFormat::kW8;
  }
}

bool CanPack(GgmlType type) { return format::CanDequantize(type); }

absl::Status PackRows(GgmlType type, std::span<const uint8_t> src, int64_t rows, int64_t cols,
                      WeightFormat target, std::span<uint8_t> dst) {
  if (!CanPack(type)) {
    return absl::InvalidArgumentError(
        StrCat(Label(type, target), ": cannot pack type ", format::GgmlTypeName(type)));
  }
  if (!ShapeFits(rows, cols) || cols % kQk != 0) {
    return absl::InvalidArgumentError(StrCat(Label(type, target), ": bad shape ", rows, " x ", cols,
                                             " (cols must be a positive multiple of 32)"));
  }
  const std::optional<uint64_t> row_bytes = format::GgmlRowBytes(type, static_cast<uint64_t>(cols));
  if (!row_bytes.has_value()) {
    return absl::InvalidArgumentError(
        StrCat(Label(type, target), ": ", cols, " columns is not a whole number of ",
               format::TraitsOf(type).block_elements, "-value blocks"));
  }
  if (src.size() != static_cast<uint64_t>(rows) * *row_bytes) {
    return absl::InvalidArgumentError(StrCat(Label(type, target), ": ", rows, " rows of ", cols,
                                             " take ", static_cast<uint64_t>(rows) * *row_bytes,
                                             " bytes, source has ", src.size()));
  }
  const size_t need = PackedBytes(target, rows, cols);
  if (dst.size() != need) {
    return absl::InvalidArgumentError(StrCat(Label(type, target), ": destination has ", dst.size(),
                                             " bytes, the packed matrix takes ", need));
  }

  if (target == WeightFormat::kW4S24) {
    std::vector<uint8_t> w4(PackedBytes(WeightFormat::kW4, rows, cols));
    MOERT_RETURN_IF_ERROR(PackRows(type, src, rows, cols, WeightFormat::kW4, w4));
    return PruneW4ToW4S24(w4, rows, cols, {}, dst);
  }

  const int64_t kb = cols / kQk;
  // Padding rows of a last tile of fewer than 8: zero scales and values. A real row's
  // share of every block is written in full below, so the rest of dst (an expert pool's
  // reused block, holding another expert's bytes) need not be cleared first.
  if (rows % kNr != 0) {
    const size_t tile_bytes = static_cast<size_t>(kb) * BlockBytes(target);
    std::fill(dst.end() - static_cast<std::ptrdiff_t>(tile_bytes), dst.end(), uint8_t{0});
  }
  const GgmlType legacy = LegacyTypeOf(target);
  const size_t src_row = static_cast<size_t>(*row_bytes);
  if (type == legacy) {
    ScatterRows(target, src.data(), src_row, rows, kb, dst.data());
    return absl::OkStatus();
  }
  if (type == GgmlType::kQ4_K && target == WeightFormat::kW4M) {
    for (int64_t row = 0; row < rows; ++row) {
      absl::Status status =
          ScatterQ4KRow(src.data() + static_cast<size_t>(row) * src_row, row, cols, dst.data());
      if (!status.ok()) {
        return absl::InvalidArgumentError(
            StrCat(Label(type, target), ": ", std::string(status.message())));
      }
    }
    return absl::OkStatus();
  }
  // Requantize: dequantize the row, quantize it to the layout's GGUF type as
  // llama.cpp would, then scatter that losslessly.
  std::vector<float> values(static_cast<size_t>(cols));
  std::vector<uint8_t> requantized(*format::GgmlRowBytes(legacy, static_cast<uint64_t>(cols)));
  for (int64_t row = 0; row < rows; ++row) {
    absl::Status status =
        format::Dequantize(type, src.subspan(static_cast<size_t>(row) * src_row, src_row), values);
    if (status.ok()) status = format::Quantize(legacy, values, requantized);
    if (!status.ok()) {
      return absl::Status(status.code(), StrCat(Label(type, target), ": row ", row, ": ",
                                                std::string(status.message())));
    }
    ScatterRow(target, requantized.data(), row, kb, dst.data());
  }
  return absl::OkStatus();
}

absl::Status PruneW4ToW4S24(std::span<const uint8_t> w4, int64_t rows, int64_t cols,
                            std::span<const float> importance, std::span<uint8_t> dst) {
  if (!ShapeFits(rows, cols) || cols % kQk != 0) {
    return absl::InvalidArgumentError(StrCat("PruneW4ToW4S24: bad shape ", rows, " x ", cols,
                                             " (cols must be a positive multiple of 32)"));
  }
  if (w4.size() != PackedBytes(WeightFormat::kW4, rows, cols)) {
    return absl::InvalidArgumentError(StrCat("PruneW4ToW4S24: the W4 matrix has ", w4.size(),
                                             " bytes, ", rows, " x ", cols, " takes ",
                                             PackedBytes(WeightFormat::kW4, rows, cols)));
  }
  if (dst.size() != PackedBytes(WeightFormat::kW4S24, rows, cols)) {
    return absl::InvalidArgumentError(StrCat("PruneW4ToW4S24: destination has ", dst.size(),
                                             " bytes, ", rows, " x ", cols, " takes ",
                                             PackedBytes(WeightFormat::kW4S24, rows, cols)));
  }
  if (!importance.empty() && importance.size() != static_cast<size_t>(cols)) {
    return absl::InvalidArgumentError(
        StrCat("PruneW4ToW4S24: ", importance.size(), " importance values for ", cols, " columns"));
  }
  for (size_t c = 0; c < importance.size(); ++c) {
    if (!(importance[c] >= 0.0f) || !std::isfinite(importance[c])) {
      return absl::InvalidArgumentError(StrCat("PruneW4ToW4S24: importance of column ", c, " is ",
                                               importance[c],
                                               " (must be finite and non-negative)"));
    }
  }

  std::fill(dst.begin(), dst.end(), uint8_t{0});
  const int64_t kb = cols / kQk;
  for (int64_t row = 0; row < rows; ++row) {
    const size_t r = static_cast<size_t>(row % kNr);
    for (int64_t b = 0; b < kb; ++b) {
      const uint8_t* in = BlockAt(w4.data(), WeightFormat::kW4, kb, row, b);
      uint8_t* out = BlockAt(dst.data(), WeightFormat::kW4S24, kb, row, b);
      const uint16_t d_bits = LoadU16(in + 2 * r);
      StoreU16(out + 2 * r, d_bits);
      const float d = core::Fp16ToFloat(d_bits);
      uint8_t* qs = out + kW4s24Qs + 8 * r;
      uint32_t codes = 0;  // row r's 24-bit pair codes
      for (int g = 0; g < kQk / 4; ++g) {
        // The two largest |w| * importance of the group; on ties the lower column
        // wins (strict comparisons, columns visited in increasing order).
        std::array<float, 4> score;
        for (int t = 0; t < 4; ++t) {
          const int c = 4 * g + t;
          const float w = static_cast<float>(W4Nibble(in, r, c) - 8) * d;
          const float imp =
              importance.empty() ? 1.0f : importance[static_cast<size_t>(b * kQk + c)];
          score[static_cast<size_t>(t)] = std::fabs(w) * imp;
        }
        int first = 0;
        for (int t = 1; t < 4; ++t) {
          if (score[static_cast<size_t>(t)] > score[static_cast<size_t>(first)]) first = t;
        }
        int second = first == 0 ? 1 : 0;
        for (int t = second + 1; t < 4; ++t) {
          if (t != first && score[static_cast<size_t>(t)] > score[static_cast<size_t>(second)]) {
            second = t;
          }
        }
        const int kept[2] = {std::min(first, second), std::max(first, second)};
        for (int s = 0; s < 2; ++s) {
          const int k = 2 * g + s;  // kept value index, 0..15
          const int nibble = W4Nibble(in, r, 4 * g + kept[s]);
          if (k < 8) {
            qs[k] = static_cast<uint8_t>(qs[k] | nibble);
          } else {
            qs[k - 8] = static_cast<uint8_t>(qs[k - 8] | (nibble << 4));
          }
        }
        codes |= static_cast<uint32_t>(W4s24PairCode(kept[0], kept[1])) << (3 * g);
      }
      uint8_t* pc = out + kW4s24Pc + 3 * r;
      for (int j = 0; j < 3; ++j) pc[j] = static_cast<uint8_t>(codes >> (8 * j));
    }
  }
  return absl::OkStatus();
}

absl::Status UnpackRows(WeightFormat format, std::span<const uint8_t> packed, int64_t rows,
                        int64_t cols, int64_t row0, int64_t n, std::span<float> dst) {
  const std::string label = StrCat("UnpackRows(", WeightFormatName(format), ")");
  if (!ShapeFits(rows, cols) || cols % kQk != 0) {
    return absl::InvalidArgumentError(StrCat(label, ": bad shape ", rows, " x ", cols,
                                             " (cols must be a positive multiple of 32)"));
  }
  if (packed.size() != PackedBytes(format, rows, cols)) {
    return absl::InvalidArgumentError(StrCat(label, ": ", packed.size(), " bytes, ", rows, " x ",
                                             cols, " takes ", PackedBytes(format, rows, cols)));
  }
  if (row0 < 0 || n < 0 || row0 > rows || n > rows - row0) {
    return absl::InvalidArgumentError(
        StrCat(label, ": rows [", row0, ", ", row0 + n, ") are not inside [0, ", rows, ")"));
  }
  if (dst.size() != static_cast<size_t>(n * cols)) {
    return absl::InvalidArgumentError(StrCat(label, ": destination has ", dst.size(), " values, ",
                                             n, " rows of ", cols, " take ", n * cols));
  }
  const int64_t kb = cols / kQk;
  float* y = dst.data();
  for (int64_t row = row0; row < row0 + n; ++row) {
    const size_t r = static_cast<size_t>(row % kNr);
    for (int64_t b = 0; b < kb; ++b, y += kQk) {
      const uint8_t* blk = BlockAt(packed.data(), format, kb, row, b);
      const float d = core::Fp16ToFloat(LoadU16(blk + 2 * r));
      // The same expressions as format::Dequantize of Q4_0, Q4_1 and Q8_0, so the
      // lossless conversions read back bit for bit.
      switch (format) {
        case WeightFormat::kW4:
          for (int c = 0; c < kQk; ++c) {
            y[c] = static_cast<float>(W4Nibble(blk, r, c) - 8) * d;
          }
          break;
        case WeightFormat::kW4M: {
          const float m = core::Fp16ToFloat(LoadU16(blk + kW4mM + 2 * r));
          const uint8_t* qs = blk + kW4mQs + 16 * r;
          for (int j = 0; j < 16; ++j) {
            y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
            y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
          }
          break;
        }
        case WeightFormat::kW8: {
          const uint8_t* qs = blk + kW8Qs + 32 * r;
          for (int c = 0; c < kQk; ++c) {
            y[c] = static_cast<float>(static_cast<int8_t>(qs[c])) * d;
          }
          break;
        }
        case WeightFormat::kW4S24: {
          const uint8_t* qs = blk + kW4s24Qs + 8 * r;
          const uint8_t* pc = blk + kW4s24Pc + 3 * r;
          std::fill(y, y + kQk, 0.0f);
          for (int k = 0; k < 16; ++k) {
            const int nibble = k < 8 ? (qs[k] & 0x0F) : (qs[k - 8] >> 4);
            y[W4s24Column(pc, k)] = static_cast<float>(nibble - 8) * d;
          }
          break;
        }
      }
    }
  }
  return absl::OkStatus();
}

GgmlType LosslessGgmlType(WeightFormat format) { return LegacyTypeOf(format); }

absl::Status UnpackToGgml(WeightFormat format, std::span<const uint8_t> packed, int64_t rows,
                          int64_t cols, std::span<uint8_t> dst) {
  const std::string label = StrCat("UnpackToGgml(", WeightFormatName(format), ")");
  if (!ShapeFits(rows, cols) || cols % kQk != 0) {
    return absl::InvalidArgumentError(StrCat(label, ": bad shape ", rows, " x ", cols,
                                             " (cols must be a positive multiple of 32)"));
  }
  if (packed.size() != PackedBytes(format, rows, cols)) {
    return absl::InvalidArgumentError(StrCat(label, ": ", packed.size(), " bytes, ", rows, " x ",
                                             cols, " takes ", PackedBytes(format, rows, cols)));
  }
  const GgmlType type = LegacyTypeOf(format);
  const uint64_t row_bytes = *format::GgmlRowBytes(type, static_cast<uint64_t>(cols));
  if (dst.size() != static_cast<uint64_t>(rows) * row_bytes) {
    return absl::InvalidArgumentError(
        StrCat(label, ": destination has ", dst.size(), " bytes, ", rows, " rows of ", cols, " ",
               format::GgmlTypeName(type), " take ", static_cast<uint64_t>(rows) * row_bytes));
  }
  const int64_t kb = cols / kQk;
  uint8_t* y = dst.data();
  for (int64_t row = 0; row < rows; ++row) {
    const size_t r = static_cast<size_t>(row % kNr);
    for (int64_t b = 0; b < kb; ++b) {
      const uint8_t* blk = BlockAt(packed.data(), format, kb, row, b);
      switch (format) {
        case WeightFormat::kW4:
          std::memcpy(y, blk + 2 * r, 2);
          std::memcpy(y + 2, blk + kW4Qs + 16 * r, 16);
          y += 18;
          break;
        case WeightFormat::kW4M:
          std::memcpy(y, blk + 2 * r, 2);
          std::memcpy(y + 2, blk + kW4mM + 2 * r, 2);
          std::memcpy(y + 4, blk + kW4mQs + 16 * r, 16);
          y += 20;
          break;
        case WeightFormat::kW8:
          std::memcpy(y, blk + 2 * r, 2);
          std::memcpy(y + 2, blk + kW8Qs + 32 * r, 32);
          y += 34;
          break;
        case WeightFormat::kW4S24: {
          // Every column starts as nibble 8 (zero); the kept ones take their nibble.
          std::array<int, kQk> nibbles;
          nibbles.fill(8);
          const uint8_t* qs = blk + kW4s24Qs + 8 * r;
          const uint8_t* pc = blk + kW4s24Pc + 3 * r;
          for (int k = 0; k < 16; ++k) {
            nibbles[static_cast<size_t>(W4s24Column(pc, k))] =
                k < 8 ? (qs[k] & 0x0F) : (qs[k - 8] >> 4);
          }
          std::memcpy(y, blk + 2 * r, 2);
          for (size_t j = 0; j < 16; ++j) {
            y[2 + j] = static_cast<uint8_t>(nibbles[j] | (nibbles[j + 16] << 4));
          }
          y += 18;
          break;
        }
      }
    }
  }
  return absl::OkStatus();
}

GgmlType PackedTypeOf(WeightFormat format) {
  switch (format) {
    case WeightFormat::kW4:
      return GgmlType::kMoertW4;
    case WeightFormat::kW4M:
      return GgmlType::kMoertW4M;
    case WeightFormat::kW8:
      return GgmlType::kMoertW8;
    case WeightFormat::kW4S24:
      return GgmlType::kMoertW4S24;
  }
  return GgmlType::kMoertW4;
}

std::optional<WeightFormat> PackedFormatOf(GgmlType type) {
  switch (type) {
    case GgmlType::kMoertW4:
      return WeightFormat::kW4;
    case GgmlType::kMoertW4M:
      return WeightFormat::kW4M;
    case GgmlType::kMoertW8:
      return WeightFormat::kW8;
    case GgmlType::kMoertW4S24:
      return WeightFormat::kW4S24;
    default:
      return std::nullopt;
  }
}

absl::Status DequantizePackedTensor(GgmlType type, std::span<const uint8_t> bytes, int64_t rows,
                                    int64_t cols, std::span<float> dst) {
  const std::optional<WeightFormat> layout = PackedFormatOf(type);
  if (!layout.has_value()) {
    return absl::InvalidArgumentError(StrCat("DequantizePackedTensor: ", format::GgmlTypeName(type),
                                             " is not one of moert's packed types"));
  }
  return UnpackRows(*layout, bytes, rows, cols, 0, rows, dst);
}

}  // namespace moert::backend
