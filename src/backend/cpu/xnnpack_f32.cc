// XNNPACK's fp32 fully-connected operator (see xnnpack_f32.h).
#include "backend/cpu/xnnpack_f32.h"

#include <xnnpack.h>

#include <limits>
#include <mutex>

#include "core/strings.h"

namespace moert::backend::cpu {
namespace {

xnn_status Initialize() {
  static const xnn_status status = xnn_initialize(/*allocator=*/nullptr);
  return status;
}

}  // namespace

absl::StatusOr<std::unique_ptr<XnnpackF32Gemm>> XnnpackF32Gemm::Create(const float* w,
                                                                        int64_t rows,
                                                                        int64_t cols) {
  if (const xnn_status s = Initialize(); s != xnn_status_success) {
    return absl::UnavailableError(StrCat("XNNPACK does not initialize here (status ",
                                         static_cast<int>(s), ")"));
  }
  if (w == nullptr || rows < 1 || cols < 1) {
    return absl::InvalidArgumentError(StrCat("XNNPACK f32 gemm of ", rows, "x", cols));
  }
  xnn_operator_t op = nullptr;
  const xnn_status s = xnn_create_fully_connected_nc_f32(
      static_cast<size_t>(cols), static_cast<size_t>(rows), static_cast<size_t>(cols),
      static_cast<size_t>(rows), w, /*bias=*/nullptr, -std::numeric_limits<float>::infinity(),
      std::numeric_limits<float>::infinity(), /*flags=*/0, &op);
  if (s != xnn_status_success) {
    return absl::ResourceExhaustedError(StrCat("XNNPACK f32 gemm of ", rows, "x", cols,
                                               ": xnn_create_fully_connected_nc_f32 status ",
                                               static_cast<int>(s)));
  }
  return std::unique_ptr<XnnpackF32Gemm>(new XnnpackF32Gemm(op));
}

XnnpackF32Gemm::~XnnpackF32Gemm() { xnn_delete_operator(op_); }

absl::Status XnnpackF32Gemm::Run(const float* x, int64_t n, float* y, pthreadpool* pool) {
  if (n < 1) return absl::OkStatus();
  xnn_status s = xnn_setup_fully_connected_nc_f32(op_, static_cast<size_t>(n), x, y, pool);
  if (s == xnn_status_success) s = xnn_run_operator(op_, pool);
  if (s != xnn_status_success) {
    return absl::InternalError(StrCat("XNNPACK f32 gemm failed (status ", static_cast<int>(s), ")"));
  }
  return absl::OkStatus();
}

}  // namespace moert::backend::cpu
