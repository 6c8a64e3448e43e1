// A scalar model of the AMX tile instructions kernels/amx-qgemm.h uses, as the Intel
// SDM defines them (ldtilecfg palette 1, tileloadd, tilezero, tdpbssd, tilestored,
// tilerelease): eight tiles of up to 16 rows of 64 bytes, shaped by the config. The
// tests instantiate the AMX GEMM over it (EmulatedTiles), so its loop, its B packing
// and its shapes are checked on machines without AMX; the real instructions are tested
// where the CPU has them. A use the hardware would fault on (a bad config, an unconfigured
// tile, mismatched tdpbssd shapes) aborts with a message.
#ifndef MOERT_KERNELS_AMX_TILE_EMULATOR_H_
#define MOERT_KERNELS_AMX_TILE_EMULATOR_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/amx-qgemm.h"

namespace moert::kernels::amx {
inline namespace isa_amx {

class TileEmulator {
 public:
  static TileEmulator& ThisThread() {
    static thread_local TileEmulator state;
    return state;
  }

  void LoadConfig(const TileConfig& cfg) {
    if (cfg.palette_id == 0) {  // palette 0: the init state
      Release();
      return;
    }
    Check(cfg.palette_id == 1, "ldtilecfg: palette_id must be 0 or 1");
    Check(cfg.start_row == 0, "ldtilecfg: start_row must be 0");
    for (int t = 0; t < 8; ++t) {
      Check(cfg.rows[t] <= 16 && cfg.colsb[t] <= 64 && cfg.colsb[t] % 4 == 0,
            "ldtilecfg: a tile past 16 rows of 64 bytes");
      Check((cfg.rows[t] == 0) == (cfg.colsb[t] == 0), "ldtilecfg: a tile with rows or columns 0");
    }
    for (int t = 8; t < 16; ++t) {
      Check(cfg.rows[t] == 0 && cfg.colsb[t] == 0, "ldtilecfg: tiles 8-15 must be 0");
    }
    cfg_ = cfg;
    configured_ = true;
    std::memset(data_, 0, sizeof(data_));  // ldtilecfg zeroes the tiles
  }

  void Release() {
    configured_ = false;
    cfg_ = TileConfig();
    std::memset(data_, 0, sizeof(data_));
  }

  // tileloadd: rows[t] rows of colsb[t] bytes from base + r * stride; the rest of each
  // row of the tile is zeroed.
  void Load(int t, const void* base, size_t stride) {
    CheckTile(t);
    std::memset(data_[t], 0, sizeof(data_[t]));
    for (int r = 0; r < cfg_.rows[t]; ++r) {
      std::memcpy(data_[t][r], static_cast<const uint8_t*>(base) + static_cast<size_t>(r) * stride,
                  cfg_.colsb[t]);
    }
  }

  void Zero(int t) {
    CheckTile(t);
    std::memset(data_[t], 0, sizeof(data_[t]));
  }

  // tdpbssd dst, a, b: dst[m][n] += sum over k < colsb(a) / 4 and j < 4 of
  // a[m][4k + j] * b[k][4n + j], all signed bytes, int32 wrap-around.
  void DpBssd(int dst, int a, int b) {
    CheckTile(dst);
    CheckTile(a);
    CheckTile(b);
    const int m_rows = cfg_.rows[dst];
    const int n_cols = cfg_.colsb[dst] / 4;
    const int k_dwords = cfg_.colsb[a] / 4;
    Check(cfg_.rows[a] == m_rows, "tdpbssd: rows of a and dst differ");
    Check(cfg_.rows[b] == k_dwords, "tdpbssd: rows of b != colsb of a / 4");
    Check(cfg_.colsb[b] == cfg_.colsb[dst], "tdpbssd: colsb of b and dst differ");
    for (int m = 0; m < m_rows; ++m) {
      for (int n = 0; n < n_cols; ++n) {
        uint32_t sum;
        std::memcpy(&sum, &data_[dst][m][4 * n], 4);
        for (int k = 0; k < k_dwords; ++k) {
          for (int j = 0; j < 4; ++j) {
            const int32_t x = static_cast<int8_t>(data_[a][m][4 * k + j]);
            const int32_t y = static_cast<int8_t>(data_[b][k][4 * n + j]);
            sum += static_cast<uint32_t>(x * y);
          }
        }
        std::memcpy(&data_[dst][m][4 * n], &sum, 4);
      }
    }
  }

  // tilestored: rows[t] rows of colsb[t] bytes to base + r * stride.
  void Store(int t, void* base, size_t stride) const {
    CheckTile(t);
    for (int r = 0; r < cfg_.rows[t]; ++r) {
      std::memcpy(static_cast<uint8_t*>(base) + static_cast<size_t>(r) * stride, data_[t][r],
                  cfg_.colsb[t]);
    }
  }

  bool configured() const { return configured_; }

 private:
  static void Check(bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "AMX tile emulator: %s\n", what);
      std::abort();
    }
  }
  void CheckTile(int t) const {
    Check(configured_, "a tile instruction before ldtilecfg (#UD)");
    Check(t >= 0 && t < 8 && cfg_.rows[t] != 0, "an unconfigured tile");
  }

  TileConfig cfg_;
  bool configured_ = false;
  uint8_t data_[8][16][64] = {};
};

// The policy amx::Gemm takes, over this thread's TileEmulator.
struct EmulatedTiles {
  static void Configure(const TileConfig& cfg) { TileEmulator::ThisThread().LoadConfig(cfg); }
  static void LoadA(const void* base, size_t stride) {
    TileEmulator::ThisThread().Load(kTileA, base, stride);
  }
  static void LoadB(const void* base) { TileEmulator::ThisThread().Load(kTileB, base, 64); }
  static void Multiply() {
    TileEmulator::ThisThread().Zero(kTileC);
    TileEmulator::ThisThread().DpBssd(kTileC, kTileA, kTileB);
  }
  static void StoreC(int32_t* base) { TileEmulator::ThisThread().Store(kTileC, base, 64); }
  static void Release() { TileEmulator::ThisThread().Release(); }
};

}  // namespace isa_amx
}  // namespace moert::kernels::amx

#endif  // MOERT_KERNELS_AMX_TILE_EMULATOR_H_
