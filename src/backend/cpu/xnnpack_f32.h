// Dense fp32 matmuls through XNNPACK's fully-connected operator (Debian's libxnnpack),
// for batches large enough that its packed GEMM microkernels pay: the vision tower and
// resampler multiply 1024 patches by 3584-wide fp32 matrices, where XNNPACK runs 2-3x
// our own fp32 loop (cpu::MatMul). Its sums run in another order, so results are
// within float rounding of cpu::MatMul's, not its bits: the CPU backend uses it only
// when asked (CpuBackend::set_xnnpack_f32), never on the model's reference path.
#ifndef MOERT_BACKEND_CPU_XNNPACK_F32_H_
#define MOERT_BACKEND_CPU_XNNPACK_F32_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct xnn_operator;
struct pthreadpool;

namespace moert::backend::cpu {

class XnnpackF32Gemm {
 public:
  // y[t][r] = dot(w row r, x[t]) for a row-major [rows][cols] `w` (XNNPACK packs its
  // own copy). Unavailable when XNNPACK cannot initialize on this CPU.
  static absl::StatusOr<std::unique_ptr<XnnpackF32Gemm>> Create(const float* w, int64_t rows,
                                                                int64_t cols);
  ~XnnpackF32Gemm();
  XnnpackF32Gemm(const XnnpackF32Gemm&) = delete;
  XnnpackF32Gemm& operator=(const XnnpackF32Gemm&) = delete;

  // x [n][cols] -> y [n][rows] on `pool` (null: the calling thread).
  absl::Status Run(const float* x, int64_t n, float* y, pthreadpool* pool);

  // Batches from this many rows go to XNNPACK; fewer run on cpu::MatMul.
  static constexpr int64_t kMinRows = 8;

 private:
  explicit XnnpackF32Gemm(xnn_operator* op) : op_(op) {}
  xnn_operator* op_;
};

}  // namespace moert::backend::cpu

#endif  // MOERT_BACKEND_CPU_XNNPACK_F32_H_
