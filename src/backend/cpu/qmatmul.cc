// The CPU operators over the integer microkernels (see qmatmul.h).
#include "backend/cpu/qmatmul.h"

#include "backend/expert_groups.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace moert::backend::cpu {
namespace {

// Weight tiles (8 rows each) per task: small enough that 2+ threads share even a
// 128-row matrix, large enough that a task streams a few KiB.
constexpr int64_t kTilesPerTask = 4;

// Bytes of one block of 8 rows by 32 columns (kernels/ukernel.h's structs).
size_t BlockBytes(WeightFormat format) { return PackedBytes(format, MOERT_NR, MOERT_QK); }

const kernels::GemmConfig& Family(const kernels::KernelConfig& config, WeightFormat format) {
  switch (format) {
    case WeightFormat::kW4:
      return config.q4;
    case WeightFormat::kW4M:
      return config.q4m;
    case WeightFormat::kW8:
      return config.q8;
    case WeightFormat::kW4S24:
      return config.q4s24;
  }
  return config.q8;
}

int64_t Tiles(int64_t rows) { return (rows + MOERT_NR - 1) / MOERT_NR; }

// Rows [tile0 * 8, tile0 * 8 + nc) of w times the m activation rows starting at row
// i0 of a: y row i (of the m) at y + i * y_stride. Uses the GEMV for one row, the
// GEMM (mr rows at a time) for more; both give the same bits.
void RunTiles(const kernels::KernelConfig& config, const PackedView& w, int64_t tile0,
              int64_t nc, const A8Matrix& a, int64_t i0, int64_t m, float* y, size_t y_stride) {
  const kernels::GemmConfig& family = Family(config, w.format);
  const size_t kb = static_cast<size_t>(w.cols / MOERT_QK);
  const uint8_t* tiles = w.data + static_cast<size_t>(tile0) * kb * BlockBytes(w.format);
  if (m == 1) {
    family.gemv(1, static_cast<size_t>(nc), kb, a.row(i0), a.stride_bytes(), tiles, y, y_stride);
    return;
  }
  for (int64_t i = 0; i < m; i += family.mr) {
    const int64_t rows = std::min<int64_t>(family.mr, m - i);
    family.gemm(static_cast<size_t>(rows), static_cast<size_t>(nc), kb, a.row(i0 + i),
                a.stride_bytes(), tiles, y + static_cast<size_t>(i) * y_stride, y_stride);
  }
}

// Task t of a dispatch over several ranges: which range, and the index within it.
struct TaskIndex {
  explicit TaskIndex(std::vector<size_t> counts) : first(counts.size() + 1, 0) {
    for (size_t j = 0; j < counts.size(); ++j) first[j + 1] = first[j] + counts[j];
  }
  size_t total() const { return first.back(); }
  std::pair<size_t, size_t> operator()(size_t task) const {
    const size_t j = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), task) -
                                         first.begin()) - 1;
    return {j, task - first[j]};
  }
  std::vector<size_t> first;
};

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace

void A8Matrix::Quantize(const kernels::KernelConfig& config, core::ThreadPool& pool,
                        const float* x, int64_t n, int64_t k) {
  n_ = n;
  kb_ = k / MOERT_QK;
  blocks_.resize(static_cast<size_t>(n * kb_));
  const auto quantize_row = [&](size_t i) {
    config.q8_quant.quant(static_cast<size_t>(k), x + static_cast<int64_t>(i) * k,
                          blocks_.data() + static_cast<int64_t>(i) * kb_);
  };
  if (n == 1) {
    quantize_row(0);
  } else {
    pool.ParallelFor(static_cast<size_t>(n), quantize_row);
  }
}

void A8Matrix::Gather(const A8Matrix& src, std::span<const int64_t> rows) {
  n_ = static_cast<int64_t>(rows.size());
  kb_ = src.kb_;
  blocks_.resize(static_cast<size_t>(n_ * kb_));
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(blocks_.data() + static_cast<int64_t>(i) * kb_, src.row(rows[i]),
                src.stride_bytes());
  }
}

void QMatMuls(core::ThreadPool& pool, const kernels::KernelConfig& config,
              std::span<const QMatMulJob> jobs) {
  std::vector<size_t> counts;
  for (const QMatMulJob& job : jobs) {
    counts.push_back(static_cast<size_t>((Tiles(job.w.rows) + kTilesPerTask - 1) / kTilesPerTask));
  }
  const TaskIndex index(std::move(counts));
  pool.ParallelFor(index.total(), [&](size_t task) {
    const auto [j, chunk] = index(task);
    const QMatMulJob& job = jobs[j];
    const int64_t tile0 = static_cast<int64_t>(chunk) * kTilesPerTask;
    const int64_t nc = std::min<int64_t>(job.w.rows - tile0 * MOERT_NR, kTilesPerTask * MOERT_NR);
    RunTiles(config, job.w, tile0, nc, *job.a, 0, job.a->n(), job.y + tile0 * MOERT_NR,
             static_cast<size_t>(job.w.rows));
  });
}

bool CanFuse(const FfnView& w) {
  return !w.gate.empty() && !w.up.empty() && !w.down.empty() && w.gate.cols % MOERT_QK == 0 &&
         w.down.cols % MOERT_QK == 0 && w.gate.rows == w.up.rows && w.down.cols == w.gate.rows;
}

void CombineSlots(core::ThreadPool& pool, const float* y, const int* experts,
                  const float* weights, int64_t n, int k, int64_t width, float* out) {
  pool.ParallelFor(static_cast<size_t>(n), [&](size_t t) {
    float* o = out + static_cast<int64_t>(t) * width;
    bool first = true;
    for (int s = 0; s < k; ++s) {
      const int64_t pair = static_cast<int64_t>(t) * k + s;
      if (experts[pair] < 0) continue;
      const float* yp = y + pair * width;
      if (weights == nullptr) {
        std::copy(yp, yp + width, o);
      } else if (std::exchange(first, false)) {
        for (int64_t j = 0; j < width; ++j) o[j] = weights[pair] * yp[j];
      } else {
        for (int64_t j = 0; j < width; ++j) o[j] = o[j] + weights[pair] * yp[j];
      }
    }
  });
}

void FusedFfn(core::ThreadPool& pool, const kernels::KernelConfig& config, const A8Matrix& x,
              int k, const int* experts, const float* weights,
              absl::FunctionRef<FfnView(int)> expert, int64_t n_embd, float* out) {
  const int64_t n = x.n();
  const int64_t pairs = n * k;
  // Expert of each (token, slot) pair; a dense FFN is "expert 0".
  std::vector<int> expert_of(static_cast<size_t>(pairs), 0);
  if (experts != nullptr) std::copy(experts, experts + pairs, expert_of.begin());

  // Group g runs expert groups.expert[g] over gathered rows [groups.first[g],
  // groups.first[g + 1]); pair_of_row maps a gathered row back to its pair t * k + s.
  const ExpertGroups groups = GroupByExpert(
      expert_of, expert_of.empty() ? 0 : *std::max_element(expert_of.begin(), expert_of.end()) + 1);
  const std::vector<int64_t>& row_pair = groups.pair_of_row;
  const std::vector<int>& group_expert = groups.expert;
  const std::vector<int64_t>& group_first = groups.first;
  const int64_t rows = static_cast<int64_t>(row_pair.size());
  const size_t n_groups = group_expert.size();
  std::vector<FfnView> views(n_groups);
  for (size_t g = 0; g < n_groups; ++g) views[g] = expert(group_expert[g]);
  const int64_t n_ff = views.empty() ? 0 : views[0].gate.rows;

  // Each group's input rows: x's rows for its tokens. One token needs no copy.
  std::vector<A8Matrix> group_x(n == 1 ? 0 : n_groups);
  if (n > 1) {
    for (size_t g = 0; g < n_groups; ++g) {
      std::vector<int64_t> tokens;
      for (int64_t r = group_first[g]; r < group_first[g + 1]; ++r) {
        tokens.push_back(row_pair[static_cast<size_t>(r)] / k);
      }
      group_x[g].Gather(x, tokens);
    }
  }
  const auto input = [&](size_t g) -> const A8Matrix& { return n == 1 ? x : group_x[g]; };

  // gate/up: h[row] = silu(gate . x) * (up . x), one task per (group, tile chunk).
  const int64_t ff_chunks = (Tiles(n_ff) + kTilesPerTask - 1) / kTilesPerTask;
  std::vector<float> h(static_cast<size_t>(rows * n_ff));
  {
    const TaskIndex index(std::vector<size_t>(n_groups, static_cast<size_t>(ff_chunks)));
    pool.ParallelFor(index.total(), [&](size_t task) {
      const auto [g, chunk] = index(task);
      const int64_t tile0 = static_cast<int64_t>(chunk) * kTilesPerTask;
      const int64_t nc = std::min<int64_t>(n_ff - tile0 * MOERT_NR, kTilesPerTask * MOERT_NR);
      const int64_t m = group_first[g + 1] - group_first[g];
      float* h0 = h.data() + group_first[g] * n_ff + tile0 * MOERT_NR;
      std::vector<float> up(static_cast<size_t>(m * nc));
      RunTiles(config, views[g].gate, tile0, nc, input(g), 0, m, h0, static_cast<size_t>(n_ff));
      RunTiles(config, views[g].up, tile0, nc, input(g), 0, m, up.data(),
               static_cast<size_t>(nc));
      for (int64_t i = 0; i < m; ++i) {
        float* hi = h0 + i * n_ff;
        const float* ui = up.data() + i * nc;
        for (int64_t j = 0; j < nc; ++j) hi[j] = Silu(hi[j]) * ui[j];
      }
    });
  }
  A8Matrix hq;
  hq.Quantize(config, pool, h.data(), rows, n_ff);

  // down: one task per (group, tile chunk of n_embd rows).
  const int64_t embd_chunks = (Tiles(n_embd) + kTilesPerTask - 1) / kTilesPerTask;
  if (n == 1) {
    // Straight into the output, experts in slot order (the order a batch sums them in).
    // Slot s is grouped row pair_row[s] of group pair_group[s].
    std::vector<size_t> pair_group(static_cast<size_t>(k));
    std::vector<int64_t> pair_row(static_cast<size_t>(k));
    for (size_t g = 0; g < n_groups; ++g) {
      for (int64_t r = group_first[g]; r < group_first[g + 1]; ++r) {
        pair_group[static_cast<size_t>(row_pair[static_cast<size_t>(r)])] = g;
        pair_row[static_cast<size_t>(row_pair[static_cast<size_t>(r)])] = r;
      }
    }
    pool.ParallelFor(static_cast<size_t>(embd_chunks), [&](size_t chunk) {
      const int64_t tile0 = static_cast<int64_t>(chunk) * kTilesPerTask;
      const int64_t r0 = tile0 * MOERT_NR;
      const int64_t nc = std::min<int64_t>(n_embd - r0, kTilesPerTask * MOERT_NR);
      float y[kTilesPerTask * MOERT_NR];
      bool first = true;
      for (int s = 0; s < k; ++s) {
        if (expert_of[static_cast<size_t>(s)] < 0) continue;
        const size_t g = pair_group[static_cast<size_t>(s)];
        const int64_t row = pair_row[static_cast<size_t>(s)];
        RunTiles(config, views[g].down, tile0, nc, hq, row, 1, y, static_cast<size_t>(nc));
        float* o = out + r0;
        if (weights == nullptr) {
          std::copy(y, y + nc, o);
        } else if (std::exchange(first, false)) {
          for (int64_t j = 0; j < nc; ++j) o[j] = weights[s] * y[j];
        } else {
          for (int64_t j = 0; j < nc; ++j) o[j] = o[j] + weights[s] * y[j];
        }
      }
    });
    return;
  }

  // A batch: each pair's expert output, then the weighted sums in slot order.
  std::vector<float> pair_out(static_cast<size_t>(pairs * n_embd));
  {
    const TaskIndex index(std::vector<size_t>(n_groups, static_cast<size_t>(embd_chunks)));
    pool.ParallelFor(index.total(), [&](size_t task) {
      const auto [g, chunk] = index(task);
      const int64_t tile0 = static_cast<int64_t>(chunk) * kTilesPerTask;
      const int64_t r0 = tile0 * MOERT_NR;
      const int64_t nc = std::min<int64_t>(n_embd - r0, kTilesPerTask * MOERT_NR);
      const int64_t m = group_first[g + 1] - group_first[g];
      std::vector<float> y(static_cast<size_t>(m * nc));
      RunTiles(config, views[g].down, tile0, nc, hq, group_first[g], m, y.data(),
               static_cast<size_t>(nc));
      for (int64_t i = 0; i < m; ++i) {
        const int64_t pair = row_pair[static_cast<size_t>(group_first[g] + i)];
        std::copy(y.begin() + i * nc, y.begin() + (i + 1) * nc,
                  pair_out.begin() + pair * n_embd + r0);
      }
    });
  }
  CombineSlots(pool, pair_out.data(), expert_of.data(), weights, n, k, n_embd, out);
}

}  // namespace moert::backend::cpu
