// Host side of the OpenCL operators (see ops.h): argument checks, kernel arguments,
// work sizes.
#include "backend/opencl/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "backend/opencl/program_cache.h"
#include "core/status.h"
#include "core/strings.h"
#include "kernels/ukernel.h"

namespace moert::backend::opencl {
namespace {

// __local memory of `bytes` for a kernel argument.
struct Local {
  size_t bytes;
};

absl::Status SetArg(cl_kernel k, cl_uint& i, const BufferRef& b) {
  MOERT_CL_RETURN_IF_ERROR(clSetKernelArg(k, i++, sizeof(cl_mem), &b.mem), "clSetKernelArg");
  const cl_ulong offset = b.offset;
  return ClStatus(clSetKernelArg(k, i++, sizeof(offset), &offset), "clSetKernelArg");
}
absl::Status SetArg(cl_kernel k, cl_uint& i, int v) {
  const cl_int x = v;
  return ClStatus(clSetKernelArg(k, i++, sizeof(x), &x), "clSetKernelArg");
}
absl::Status SetArg(cl_kernel k, cl_uint& i, float v) {
  const cl_float x = v;
  return ClStatus(clSetKernelArg(k, i++, sizeof(x), &x), "clSetKernelArg");
}
absl::Status SetArg(cl_kernel k, cl_uint& i, uint64_t v) {
  const cl_ulong x = v;
  return ClStatus(clSetKernelArg(k, i++, sizeof(x), &x), "clSetKernelArg");
}
absl::Status SetArg(cl_kernel k, cl_uint& i, Local l) {
  return ClStatus(clSetKernelArg(k, i++, l.bytes, nullptr), "clSetKernelArg");
}

template <typename... Args>
absl::Status SetArgs(cl_kernel k, const Args&... args) {
  cl_uint i = 0;
  absl::Status status;
  ((status.ok() ? status = SetArg(k, i, args) : status), ...);
  return status;
}

// Enqueues `kernel` over `global` work-items (rounded up to multiples of `local`).
absl::Status Launch(Device& device, cl_kernel kernel, std::string_view name, cl_uint dims,
                    const size_t* global, const size_t* local) {
  size_t rounded[3];
  for (cl_uint d = 0; d < dims; ++d) {
    rounded[d] = local != nullptr ? (global[d] + local[d] - 1) / local[d] * local[d] : global[d];
  }
  return ClStatus(clEnqueueNDRangeKernel(device.queue(), kernel, dims, nullptr, rounded, local, 0,
                                         nullptr, nullptr),
                  StrCat("clEnqueueNDRangeKernel(", name, ")"));
}

// `bytes` from ref.offset fit in ref's buffer, and the offset is float-aligned.
absl::Status CheckRange(BufferRef ref, size_t bytes, std::string_view what) {
  if (ref.mem == nullptr) return absl::InvalidArgumentError(StrCat("OpenCL: no buffer for ", what));
  size_t size = 0;
  MOERT_CL_RETURN_IF_ERROR(clGetMemObjectInfo(ref.mem, CL_MEM_SIZE, sizeof(size), &size, nullptr),
                           "clGetMemObjectInfo(CL_MEM_SIZE)");
  if (ref.offset % 4 != 0) {
    return absl::InvalidArgumentError(
        StrCat("OpenCL: ", what, " at byte offset ", ref.offset, " (not a multiple of 4)"));
  }
  if (ref.offset > size || bytes > size - ref.offset) {
    return absl::OutOfRangeError(StrCat("OpenCL: ", what, " needs ", bytes, " bytes at offset ",
                                        ref.offset, " of a buffer of ", size));
  }
  return absl::OkStatus();
}

// Work-group size: the largest power of two <= min(want, the device's maximum).
size_t Pow2Group(const Device& device, size_t want) {
  const size_t cap = std::min(want, std::max<size_t>(device.info().max_work_group_size, 1));
  size_t p = 1;
  while (p * 2 <= cap) p *= 2;
  return p;
}

absl::StatusOr<std::string> FormatOption(WeightFormat format) {
  switch (format) {
    case WeightFormat::kW4:
      return std::string("-DMOERT_WFMT=4");
    case WeightFormat::kW8:
      return std::string("-DMOERT_WFMT=8");
    default:
      return absl::UnimplementedError(StrCat("OpenCL: no kernels for weight format ",
                                             WeightFormatName(format), " yet (W4 and W8 only)"));
  }
}

// A matrix's shape (CheckMatrix without the buffer range).
absl::Status CheckShape(const MatrixRef& w, std::string_view what) {
  if (w.rows <= 0 || w.cols <= 0 || w.cols % MOERT_QK != 0 || w.groups <= 0) {
    return absl::InvalidArgumentError(StrCat("OpenCL: ", what, " is ", w.rows, " x ", w.cols,
                                             " (cols must be a positive multiple of 32)"));
  }
  if (w.group_bytes != PackedBytes(w.format, w.rows, w.cols)) {
    return absl::InvalidArgumentError(StrCat("OpenCL: ", what, " group_bytes ", w.group_bytes,
                                             " != ", PackedBytes(w.format, w.rows, w.cols)));
  }
  if (w.rows > std::numeric_limits<int>::max() / 2 || w.cols / MOERT_QK > (1 << 24)) {
    return absl::InvalidArgumentError(StrCat("OpenCL: ", what, " is too large"));
  }
  return absl::OkStatus();
}

absl::Status CheckMatrix(const MatrixRef& w, std::string_view what) {
  MOERT_RETURN_IF_ERROR(CheckShape(w, what));
  return CheckRange(w.data, w.group_bytes * static_cast<size_t>(w.groups), what);
}

// Every expert's part at offsets[e] past w.data lies in the buffer (FfnRef::
// expert_offsets).
absl::Status CheckPlacedExperts(const MatrixRef& w, std::span<const uint64_t> offsets,
                                std::string_view what) {
  MOERT_RETURN_IF_ERROR(CheckShape(w, what));
  if (offsets.size() != static_cast<size_t>(w.groups)) {
    return absl::InvalidArgumentError(StrCat("OpenCL: ", what, ": ", offsets.size(),
                                             " expert offsets for ", w.groups, " experts"));
  }
  for (size_t e = 0; e < offsets.size(); ++e) {
    if (offsets[e] > std::numeric_limits<size_t>::max() - w.data.offset) {
      return absl::OutOfRangeError(
          StrCat("OpenCL: ", what, " of expert ", e, " at offset ", offsets[e]));
    }
    BufferRef part = w.data;
    part.offset += static_cast<size_t>(offsets[e]);
    MOERT_RETURN_IF_ERROR(CheckRange(part, w.group_bytes, StrCat(what, " of expert ", e)));
  }
  return absl::OkStatus();
}

constexpr size_t kA8Bytes = sizeof(moert_a8_block);

}  // namespace

absl::StatusOr<DeviceMatrix> DeviceMatrix::Upload(Device& device, const PackedMatrix& m) {
  DeviceMatrix out;
  MOERT_ASSIGN_OR_RETURN(out.buffer, Buffer::FromHost(device, m.group(0).data, m.size_bytes()));
  out.ref = {BufferRef(out.buffer), m.format(), m.groups(), m.rows(), m.cols(), m.group_bytes()};
  return out;
}

absl::StatusOr<BufferRef> Scratch::Get(Device& device, int slot, size_t bytes) {
  Buffer& b = buffers_[slot];
  if (b.size() < bytes) {
    b = Buffer();
    MOERT_ASSIGN_OR_RETURN(b, Buffer::Create(device, std::max<size_t>(bytes, 256)));
  }
  return BufferRef(b);
}

absl::Status Q8Quant(Device& device, BufferRef x, int64_t n, int64_t k, BufferRef a) {
  if (n <= 0 || k <= 0 || k % MOERT_QK != 0) {
    return absl::InvalidArgumentError(
        StrCat("OpenCL q8_quant: n = ", n, ", k = ", k, " (k must be a multiple of 32)"));
  }
  const int64_t blocks = n * (k / MOERT_QK);
  if (blocks > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError("OpenCL q8_quant: too many blocks");
  }
  MOERT_RETURN_IF_ERROR(CheckRange(x, static_cast<size_t>(n * k) * 4, "q8_quant input"));
  MOERT_RETURN_IF_ERROR(CheckRange(a, static_cast<size_t>(blocks) * kA8Bytes, "q8_quant output"));
  MOERT_ASSIGN_OR_RETURN(cl_kernel kernel, device.programs().Kernel("q8_quant", "q8_quant"));
  MOERT_RETURN_IF_ERROR(SetArgs(kernel, x, a, static_cast<int>(blocks)));
  const size_t global = static_cast<size_t>(blocks);
  const size_t local = Pow2Group(device, 64);
  return Launch(device, kernel, "q8_quant", 1, &global, &local);
}

absl::Status QMatMul(Device& device, const MatrixRef& w, int64_t group, BufferRef a, int64_t n,
                     BufferRef y) {
  MOERT_RETURN_IF_ERROR(CheckMatrix(w, "matmul weights"));
  if (group < 0 || group >= w.groups || n <= 0 || n > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(
        StrCat("OpenCL matmul: group ", group, " of ", w.groups, ", n = ", n));
  }
  MOERT_ASSIGN_OR_RETURN(const std::string option, FormatOption(w.format));
  const int kb = static_cast<int>(w.cols / MOERT_QK);
  MOERT_RETURN_IF_ERROR(
      CheckRange(a, static_cast<size_t>(n) * static_cast<size_t>(kb) * kA8Bytes, "matmul input"));
  MOERT_RETURN_IF_ERROR(
      CheckRange(y, static_cast<size_t>(n) * static_cast<size_t>(w.rows) * 4, "matmul output"));
  BufferRef wg = w.data;
  wg.offset += static_cast<size_t>(group) * w.group_bytes;
  const int rows = static_cast<int>(w.rows);
  const KernelVariant& v = device.variant();
  if (n == 1) {
    MOERT_ASSIGN_OR_RETURN(cl_kernel kernel, device.programs().Kernel("gemv", "gemv", option));
    if (v.gemv_k_split == 1) {
      MOERT_RETURN_IF_ERROR(SetArgs(kernel, wg, a, y, rows, kb));
      const size_t global = static_cast<size_t>(rows);
      const size_t local = Pow2Group(device, v.gemv_wg);
      return Launch(device, kernel, "gemv", 1, &global, &local);
    }
    const size_t split = static_cast<size_t>(v.gemv_k_split);
    const size_t rows_per_group = std::max<size_t>(Pow2Group(device, v.gemv_wg) / split, 1);
    MOERT_RETURN_IF_ERROR(
        SetArgs(kernel, wg, a, y, rows, kb, Local{split * rows_per_group * sizeof(float)}));
    const size_t global[2] = {split, static_cast<size_t>(rows)};
    const size_t local[2] = {split, rows_per_group};
    return Launch(device, kernel, "gemv", 2, global, local);
  }
  MOERT_ASSIGN_OR_RETURN(cl_kernel kernel, device.programs().Kernel("gemm", "gemm", option));
  MOERT_RETURN_IF_ERROR(SetArgs(kernel, wg, a, y, rows, kb, static_cast<int>(n), rows));
  const size_t mr = static_cast<size_t>(v.gemm_mr);
  const size_t local[2] = {Pow2Group(device, v.gemm_wg), 1};
  const size_t global[2] = {static_cast<size_t>(rows), (static_cast<size_t>(n) + mr - 1) / mr};
  return Launch(device, kernel, "gemm", 2, global, local);
}

absl::Status FusedMoe(Device& device, const FfnRef& w, BufferRef x, int64_t n, int k,
                      BufferRef experts, BufferRef weights, BufferRef out, Scratch& scratch) {
  const bool placed = !w.expert_offsets.empty();
  for (const auto& [part, what] : {std::pair{&w.gate, "expert gate weights"},
                                   std::pair{&w.up, "expert up weights"},
                                   std::pair{&w.down, "expert down weights"}}) {
    MOERT_RETURN_IF_ERROR(placed ? CheckPlacedExperts(*part, w.expert_offsets, what)
                                 : CheckMatrix(*part, what));
  }
  const int64_t n_embd = w.gate.cols;
  const int64_t n_ff = w.gate.rows;
  if (w.up.rows != n_ff || w.up.cols != n_embd || w.down.rows != n_embd || w.down.cols != n_ff ||
      w.gate.format != w.up.format || w.gate.groups != w.up.groups ||
      w.gate.groups != w.down.groups) {
    return absl::InvalidArgumentError("OpenCL fused MoE: gate/up/down shapes do not match");
  }
  if (n <= 0 || k <= 0 || n * k > std::numeric_limits<int>::max() / 2 ||
      (weights.empty() && k != 1)) {
    return absl::InvalidArgumentError(
        StrCat("OpenCL fused MoE: n = ", n, ", k = ", k, " (k must be 1 without weights)"));
  }
  MOERT_ASSIGN_OR_RETURN(const std::string option, FormatOption(w.gate.format));
  MOERT_ASSIGN_OR_RETURN(const std::string down_option, FormatOption(w.down.format));
  const int64_t pairs = n * k;
  const int kb_embd = static_cast<int>(n_embd / MOERT_QK);
  const int kb_ff = static_cast<int>(n_ff / MOERT_QK);
  MOERT_RETURN_IF_ERROR(CheckRange(x, static_cast<size_t>(n * kb_embd) * kA8Bytes, "MoE input"));
  MOERT_RETURN_IF_ERROR(CheckRange(out, static_cast<size_t>(n * n_embd) * 4, "MoE output"));
  if (!experts.empty()) {
    MOERT_RETURN_IF_ERROR(CheckRange(experts, static_cast<size_t>(pairs) * 4, "MoE experts"));
  }
  if (!weights.empty()) {
    MOERT_RETURN_IF_ERROR(CheckRange(weights, static_cast<size_t>(pairs) * 4, "MoE weights"));
  }
  MOERT_ASSIGN_OR_RETURN(BufferRef h,
                         scratch.Get(device, 0, static_cast<size_t>(pairs * n_ff) * 4));
  MOERT_ASSIGN_OR_RETURN(BufferRef hq,
                         scratch.Get(device, 1, static_cast<size_t>(pairs * kb_ff) * kA8Bytes));
  const int n_expert = static_cast<int>(w.gate.groups);
  BufferRef offsets;  // empty: stacked experts
  if (placed) {
    const size_t bytes = w.expert_offsets.size() * sizeof(uint64_t);
    MOERT_ASSIGN_OR_RETURN(offsets, scratch.Get(device, 2, bytes));
    MOERT_CL_RETURN_IF_ERROR(clEnqueueWriteBuffer(device.queue(), offsets.mem, CL_TRUE,
                                                  offsets.offset, bytes, w.expert_offsets.data(),
                                                  0, nullptr, nullptr),
                             "clEnqueueWriteBuffer(expert offsets)");
  }
  const size_t wg = Pow2Group(device, device.variant().gemm_wg);
  {
    MOERT_ASSIGN_OR_RETURN(cl_kernel kernel,
                           device.programs().Kernel("moe_gate_up", "moe_gate_up", option));
    BufferRef gate = w.gate.data, up = w.up.data;
    MOERT_RETURN_IF_ERROR(SetArgs(kernel, gate, up, static_cast<uint64_t>(w.gate.group_bytes),
                                  offsets, static_cast<int>(placed), x, experts, static_cast<int>(!experts.empty()), h,
                                  static_cast<int>(n_ff), kb_embd, k, static_cast<int>(pairs),
                                  n_expert));
    const size_t global[2] = {static_cast<size_t>(n_ff), static_cast<size_t>(pairs)};
    const size_t local[2] = {wg, 1};
    MOERT_RETURN_IF_ERROR(Launch(device, kernel, "moe_gate_up", 2, global, local));
  }
  MOERT_RETURN_IF_ERROR(Q8Quant(device, h, pairs, n_ff, hq));
  MOERT_ASSIGN_OR_RETURN(cl_kernel kernel,
                         device.programs().Kernel("moe_down", "moe_down", down_option));
  MOERT_RETURN_IF_ERROR(SetArgs(kernel, w.down.data, static_cast<uint64_t>(w.down.group_bytes),
                                offsets, static_cast<int>(placed), hq, experts, static_cast<int>(!experts.empty()), weights,
                                static_cast<int>(!weights.empty()), out, static_cast<int>(n_embd),
                                kb_ff, k, static_cast<int>(n), n_expert));
  const size_t global[2] = {static_cast<size_t>(n_embd), static_cast<size_t>(n)};
  const size_t local[2] = {wg, 1};
  return Launch(device, kernel, "moe_down", 2, global, local);
}

absl::Status RmsNorm(Device& device, BufferRef x, int64_t n_rows, int64_t width, BufferRef weight,
                     float eps, BufferRef y) {
  if (n_rows <= 0 || width <= 0 || n_rows > std::numeric_limits<int>::max() ||
      width > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(StrCat("OpenCL rms_norm: ", n_rows, " rows of ", width));
  }
  const size_t bytes = static_cast<size_t>(n_rows * width) * 4;
  MOERT_RETURN_IF_ERROR(CheckRange(x, bytes, "rms_norm input"));
  MOERT_RETURN_IF_ERROR(CheckRange(y, bytes, "rms_norm output"));
  MOERT_RETURN_IF_ERROR(CheckRange(weight, static_cast<size_t>(width) * 4, "rms_norm weight"));
  MOERT_ASSIGN_OR_RETURN(cl_kernel kernel, device.programs().Kernel("rms_norm", "rms_norm"));
  const size_t local = Pow2Group(device, device.variant().row_wg);
  MOERT_RETURN_IF_ERROR(
      SetArgs(kernel, x, weight, y, static_cast<int>(width), eps, Local{local * sizeof(float)}));
  const size_t global = static_cast<size_t>(n_rows) * local;
  return Launch(device, kernel, "rms_norm", 1, &global, &local);
}

absl::Status Rope(Device& device, const RopeArgs& rope, int64_t pos0, int64_t n, int n_heads,
                  int head_dim, BufferRef x) {
  if (n <= 0 || n_heads <= 0 || head_dim <= 0 || rope.n_rot <= 0 || rope.n_rot % 2 != 0 ||
      rope.n_rot > head_dim || pos0 < 0 || pos0 + n > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(StrCat("OpenCL rope: n_rot ", rope.n_rot, ", head_dim ",
                                             head_dim, ", heads ", n_heads, ", n ", n));
  }
  MOERT_RETURN_IF_ERROR(CheckRange(
      x, static_cast<size_t>(n) * static_cast<size_t>(n_heads * head_dim) * 4, "rope x"));
  if (!rope.freq_factors.empty()) {
    MOERT_RETURN_IF_ERROR(CheckRange(rope.freq_factors, static_cast<size_t>(rope.n_rot / 2) * 4,
                                     "rope freq_factors"));
  }
  // The CPU's theta_scale, computed the same way on the host.
  const float theta_scale = std::pow(rope.theta_base, -2.0f / static_cast<float>(rope.n_rot));
  MOERT_ASSIGN_OR_RETURN(cl_kernel kernel, device.programs().Kernel("rope", "rope"));
  MOERT_RETURN_IF_ERROR(SetArgs(kernel, x, rope.freq_factors,
                                static_cast<int>(!rope.freq_factors.empty()),
                                static_cast<int>(pos0), n_heads, head_dim, rope.n_rot, theta_scale,
                                rope.freq_scale, static_cast<int>(rope.neox), static_cast<int>(n)));
  const size_t global[3] = {static_cast<size_t>(rope.n_rot / 2), static_cast<size_t>(n_heads),
                            static_cast<size_t>(n)};
  return Launch(device, kernel, "rope", 3, global, nullptr);
}

absl::Status Softmax(Device& device, BufferRef x, int64_t n_rows, int64_t width, BufferRef y) {
  if (n_rows <= 0 || width <= 0 || n_rows > std::numeric_limits<int>::max() ||
      width > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(StrCat("OpenCL softmax: ", n_rows, " rows of ", width));
  }
  const size_t bytes = static_cast<size_t>(n_rows * width) * 4;
  MOERT_RETURN_IF_ERROR(CheckRange(x, bytes, "softmax input"));
  MOERT_RETURN_IF_ERROR(CheckRange(y, bytes, "softmax output"));
  MOERT_ASSIGN_OR_RETURN(cl_kernel kernel, device.programs().Kernel("softmax", "softmax"));
  const size_t local = Pow2Group(device, device.variant().row_wg);
  MOERT_RETURN_IF_ERROR(
      SetArgs(kernel, x, y, static_cast<int>(width), Local{local * sizeof(float)}));
  const size_t global = static_cast<size_t>(n_rows) * local;
  return Launch(device, kernel, "softmax", 1, &global, &local);
}

absl::Status Attention(Device& device, const AttentionArgs& s, BufferRef q, int64_t n, int64_t pos0,
                       BufferRef k_cache, BufferRef v_cache, BufferRef out, Scratch& scratch) {
  if (n <= 0 || pos0 < 0 || s.n_head <= 0 || s.n_head_kv <= 0 || s.n_head % s.n_head_kv != 0 ||
      s.head_dim_k <= 0 || s.head_dim_v <= 0 || pos0 + n > std::numeric_limits<int>::max() / 2) {
    return absl::InvalidArgumentError(StrCat("OpenCL attention: n_head ", s.n_head, ", n_head_kv ",
                                             s.n_head_kv, ", dims ", s.head_dim_k, "/",
                                             s.head_dim_v, ", n ", n, ", pos0 ", pos0));
  }
  const size_t n_kv = static_cast<size_t>(pos0 + n);
  const size_t heads = static_cast<size_t>(s.n_head);
  const size_t kv_heads = static_cast<size_t>(s.n_head_kv);
  const size_t dk = static_cast<size_t>(s.head_dim_k), dv = static_cast<size_t>(s.head_dim_v);
  MOERT_RETURN_IF_ERROR(CheckRange(q, static_cast<size_t>(n) * heads * dk * 4, "attention q"));
  const size_t kv_elem = s.kv_half ? 2 : 4;
  MOERT_RETURN_IF_ERROR(CheckRange(k_cache, n_kv * kv_heads * dk * kv_elem, "attention k cache"));
  MOERT_RETURN_IF_ERROR(CheckRange(v_cache, n_kv * kv_heads * dv * kv_elem, "attention v cache"));
  MOERT_RETURN_IF_ERROR(CheckRange(out, static_cast<size_t>(n) * heads * dv * 4, "attention out"));
  MOERT_ASSIGN_OR_RETURN(BufferRef scores,
                         scratch.Get(device, 2, static_cast<size_t>(n) * heads * n_kv * 4));
  MOERT_ASSIGN_OR_RETURN(cl_kernel kernel,
                         device.programs().Kernel("attention", "attention",
                                                  s.kv_half ? "-DMOERT_KV_HALF=1" : ""));
  const size_t local = Pow2Group(device, device.variant().row_wg);
  MOERT_RETURN_IF_ERROR(SetArgs(kernel, q, k_cache, v_cache, out, scores, s.n_head, s.n_head_kv,
                                s.head_dim_k, s.head_dim_v, static_cast<int>(pos0),
                                static_cast<int>(n_kv), s.scale, 0, Local{local * sizeof(float)}));
  const size_t global[2] = {heads * local, static_cast<size_t>(n)};
  const size_t locals[2] = {local, 1};
  return Launch(device, kernel, "attention", 2, global, locals);
}

absl::Status FullAttention(Device& device, const AttentionArgs& s, BufferRef q, int64_t n,
                           BufferRef k, BufferRef v, int64_t n_kv, BufferRef out,
                           Scratch& scratch) {
  if (n <= 0 || n_kv <= 0 || s.kv_half || s.n_head <= 0 || s.n_head_kv <= 0 ||
      s.n_head % s.n_head_kv != 0 || s.head_dim_k <= 0 || s.head_dim_v <= 0 ||
      n > std::numeric_limits<int>::max() || n_kv > std::numeric_limits<int>::max() / 2) {
    return absl::InvalidArgumentError(StrCat("OpenCL full_attention: n_head ", s.n_head,
                                             ", n_head_kv ", s.n_head_kv, ", dims ", s.head_dim_k,
                                             "/", s.head_dim_v, ", n ", n, ", n_kv ", n_kv));
  }
  const size_t heads = static_cast<size_t>(s.n_head);
  const size_t kv_heads = static_cast<size_t>(s.n_head_kv);
  const size_t dk = static_cast<size_t>(s.head_dim_k), dv = static_cast<size_t>(s.head_dim_v);
  const size_t keys = static_cast<size_t>(n_kv);
  MOERT_RETURN_IF_ERROR(CheckRange(q, static_cast<size_t>(n) * heads * dk * 4, "full_attention q"));
  MOERT_RETURN_IF_ERROR(CheckRange(k, keys * kv_heads * dk * 4, "full_attention k"));
  MOERT_RETURN_IF_ERROR(CheckRange(v, keys * kv_heads * dv * 4, "full_attention v"));
  MOERT_RETURN_IF_ERROR(
      CheckRange(out, static_cast<size_t>(n) * heads * dv * 4, "full_attention out"));
  MOERT_ASSIGN_OR_RETURN(BufferRef scores,
                         scratch.Get(device, 2, static_cast<size_t>(n) * heads * keys * 4));
  MOERT_ASSIGN_OR_RETURN(cl_kernel kernel, device.programs().Kernel("attention", "attention", ""));
  const size_t local = Pow2Group(device, device.variant().row_wg);
  MOERT_RETURN_IF_ERROR(SetArgs(kernel, q, k, v, out, scores, s.n_head, s.n_head_kv, s.head_dim_k,
                                s.head_dim_v, 0, static_cast<int>(n_kv), s.scale,
                                static_cast<int>(n_kv), Local{local * sizeof(float)}));
  const size_t global[2] = {heads * local, static_cast<size_t>(n)};
  const size_t locals[2] = {local, 1};
  return Launch(device, kernel, "full_attention", 2, global, locals);
}

absl::Status LayerNorm(Device& device, BufferRef x, int64_t n_rows, int64_t width, BufferRef weight,
                       BufferRef bias, float eps, BufferRef y) {
  if (n_rows <= 0 || width <= 0 || n_rows > std::numeric_limits<int>::max() ||
      width > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(StrCat("OpenCL layer_norm: ", n_rows, " rows of ", width));
  }
  const size_t bytes = static_cast<size_t>(n_rows * width) * 4;
  MOERT_RETURN_IF_ERROR(CheckRange(x, bytes, "layer_norm input"));
  MOERT_RETURN_IF_ERROR(CheckRange(y, bytes, "layer_norm output"));
  MOERT_RETURN_IF_ERROR(CheckRange(weight, static_cast<size_t>(width) * 4, "layer_norm weight"));
  const bool has_bias = !bias.empty();
  if (has_bias) {
    MOERT_RETURN_IF_ERROR(CheckRange(bias, static_cast<size_t>(width) * 4, "layer_norm bias"));
  }
  MOERT_ASSIGN_OR_RETURN(cl_kernel kernel, device.programs().Kernel("layer_norm", "layer_norm"));
  const size_t local = Pow2Group(device, device.variant().row_wg);
  // Without a bias the kernel never reads it: the weight stands in for the argument.
  MOERT_RETURN_IF_ERROR(SetArgs(kernel, x, weight, has_bias ? bias : weight,
                                static_cast<int>(has_bias), y, static_cast<int>(width), eps,
                                Local{local * sizeof(float)}));
  const size_t global = static_cast<size_t>(n_rows) * local;
  return Launch(device, kernel, "layer_norm", 1, &global, &local);
}

absl::Status Gelu(Device& device, BufferRef x, int64_t count, BufferRef y) {
  if (count <= 0 || count > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(StrCat("OpenCL gelu: count ", count));
  }
  MOERT_RETURN_IF_ERROR(CheckRange(x, static_cast<size_t>(count) * 4, "gelu x"));
  MOERT_RETURN_IF_ERROR(CheckRange(y, static_cast<size_t>(count) * 4, "gelu y"));
  MOERT_ASSIGN_OR_RETURN(cl_kernel kernel, device.programs().Kernel("elementwise", "gelu"));
  const size_t local = Pow2Group(device, 64);
  MOERT_RETURN_IF_ERROR(SetArgs(kernel, x, y, static_cast<int>(count)));
  const size_t global = (static_cast<size_t>(count) + local - 1) / local * local;
  return Launch(device, kernel, "gelu", 1, &global, &local);
}

absl::Status TopKRoute(Device& device, BufferRef logits, int64_t n, int n_expert, int k,
                       bool renormalize, BufferRef experts, BufferRef weights) {
  if (n <= 0 || n > std::numeric_limits<int>::max() || n_expert <= 0 || n_expert > 256 || k <= 0 ||
      k > n_expert) {
    return absl::InvalidArgumentError(StrCat("OpenCL top-k: n ", n, ", n_expert ", n_expert, ", k ",
                                             k, " (n_expert <= 256, k <= n_expert)"));
  }
  MOERT_RETURN_IF_ERROR(CheckRange(
      logits, static_cast<size_t>(n) * static_cast<size_t>(n_expert) * 4, "top-k logits"));
  const size_t out_bytes = static_cast<size_t>(n) * static_cast<size_t>(k) * 4;
  MOERT_RETURN_IF_ERROR(CheckRange(experts, out_bytes, "top-k experts"));
  MOERT_RETURN_IF_ERROR(CheckRange(weights, out_bytes, "top-k weights"));
  MOERT_ASSIGN_OR_RETURN(cl_kernel kernel, device.programs().Kernel("topk", "topk_route"));
  MOERT_RETURN_IF_ERROR(SetArgs(kernel, logits, experts, weights, n_expert, k,
                                static_cast<int>(renormalize), static_cast<int>(n)));
  const size_t global = static_cast<size_t>(n);
  const size_t local = Pow2Group(device, 64);
  return Launch(device, kernel, "topk_route", 1, &global, &local);
}

namespace {

// count in (0, INT_MAX].
absl::Status CheckCount(int64_t count, std::string_view what) {
  if (count <= 0 || count > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(StrCat("OpenCL ", what, ": count ", count));
  }
  return absl::OkStatus();
}

absl::Status Launch1D(Device& device, cl_kernel kernel, std::string_view name, int64_t count) {
  const size_t global = static_cast<size_t>(count);
  const size_t local = Pow2Group(device, 64);
  return Launch(device, kernel, name, 1, &global, &local);
}

}  // namespace

absl::Status F32MatMul(Device& device, BufferRef w, int64_t rows, int64_t cols, BufferRef x,
                       int64_t n, BufferRef y, bool half_weights) {
  if (rows <= 0 || cols <= 0 || n <= 0 || rows > std::numeric_limits<int>::max() ||
      cols > std::numeric_limits<int>::max() || n > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(
        StrCat("OpenCL f32 matmul: ", rows, " x ", cols, " weights, n = ", n));
  }
  const size_t w_bytes = static_cast<size_t>(rows * cols) * (half_weights ? 2 : 4);
  MOERT_RETURN_IF_ERROR(CheckRange(w, w_bytes, "f32 matmul weights"));
  MOERT_RETURN_IF_ERROR(CheckRange(x, static_cast<size_t>(n * cols) * 4, "f32 matmul input"));
  MOERT_RETURN_IF_ERROR(CheckRange(y, static_cast<size_t>(n * rows) * 4, "f32 matmul output"));
  MOERT_ASSIGN_OR_RETURN(cl_kernel kernel,
                         device.programs().Kernel("f32_gemm", "f32_matmul",
                                                  half_weights ? "-DMOERT_W_HALF=1" : ""));
  MOERT_RETURN_IF_ERROR(SetArgs(kernel, w, x, y, static_cast<int>(rows), static_cast<int>(cols),
                                static_cast<int>(n)));
  const size_t local[2] = {Pow2Group(device, 64), 1};
  const size_t global[2] = {static_cast<size_t>(rows), static_cast<size_t>(n)};
  return Launch(device, kernel, "f32_matmul", 2, global, local);
}

namespace {

// elementwise.cl's kernel `name` over `count` items of x and y, with x_elem / y_elem
// bytes each (the (x, y, count) kernels: to_half, add_inplace, silu_mul).
absl::Status TwoBufferOp(Device& device, const char* name, BufferRef x, size_t x_elem,
                         BufferRef y, size_t y_elem, int64_t count) {
  MOERT_RETURN_IF_ERROR(CheckCount(count, name));
  MOERT_RETURN_IF_ERROR(
      CheckRange(x, static_cast<size_t>(count) * x_elem, StrCat(name, " first operand")));
  MOERT_RETURN_IF_ERROR(
      CheckRange(y, static_cast<size_t>(count) * y_elem, StrCat(name, " second operand")));
  MOERT_ASSIGN_OR_RETURN(cl_kernel kernel, device.programs().Kernel("elementwise", name));
  MOERT_RETURN_IF_ERROR(SetArgs(kernel, x, y, static_cast<int>(count)));
  return Launch1D(device, kernel, name, count);
}

}  // namespace

absl::Status ToHalf(Device& device, BufferRef x, int64_t count, BufferRef y) {
  return TwoBufferOp(device, "to_half", x, 4, y, 2, count);
}

absl::Status AddInPlace(Device& device, BufferRef x, BufferRef y, int64_t count) {
  return TwoBufferOp(device, "add_inplace", x, 4, y, 4, count);
}

absl::Status AddBias(Device& device, BufferRef y, BufferRef b, int64_t n, int64_t width) {
  MOERT_RETURN_IF_ERROR(CheckCount(width, "add_bias"));
  MOERT_RETURN_IF_ERROR(CheckCount(n * width, "add_bias"));
  MOERT_RETURN_IF_ERROR(CheckRange(y, static_cast<size_t>(n * width) * 4, "add_bias y"));
  MOERT_RETURN_IF_ERROR(CheckRange(b, static_cast<size_t>(width) * 4, "add_bias b"));
  MOERT_ASSIGN_OR_RETURN(cl_kernel kernel, device.programs().Kernel("elementwise", "add_bias"));
  MOERT_RETURN_IF_ERROR(
      SetArgs(kernel, y, b, static_cast<int>(width), static_cast<int>(n * width)));
  return Launch1D(device, kernel, "add_bias", n * width);
}

absl::Status SiluMul(Device& device, BufferRef g, BufferRef u, int64_t count) {
  return TwoBufferOp(device, "silu_mul", g, 4, u, 4, count);
}

absl::Status GatherRows(Device& device, BufferRef src, int64_t src_rows, BufferRef idx,
                        int64_t n, int64_t width, BufferRef dst) {
  MOERT_RETURN_IF_ERROR(CheckCount(n * width, "gather_rows"));
  MOERT_RETURN_IF_ERROR(CheckCount(src_rows * width, "gather_rows"));
  MOERT_RETURN_IF_ERROR(CheckRange(src, static_cast<size_t>(src_rows * width) * 4, "gather src"));
  MOERT_RETURN_IF_ERROR(CheckRange(idx, static_cast<size_t>(n) * 4, "gather idx"));
  MOERT_RETURN_IF_ERROR(CheckRange(dst, static_cast<size_t>(n * width) * 4, "gather dst"));
  MOERT_ASSIGN_OR_RETURN(cl_kernel kernel, device.programs().Kernel("elementwise", "gather_rows"));
  MOERT_RETURN_IF_ERROR(
      SetArgs(kernel, src, idx, dst, static_cast<int>(width), static_cast<int>(n),
              static_cast<int>(src_rows)));
  const size_t local[2] = {Pow2Group(device, 64), 1};
  const size_t global[2] = {static_cast<size_t>(width), static_cast<size_t>(n)};
  return Launch(device, kernel, "gather_rows", 2, global, local);
}

absl::Status MoeCombine(Device& device, BufferRef y, BufferRef experts, BufferRef weights,
                        int64_t n, int k, int64_t width, BufferRef out) {
  MOERT_RETURN_IF_ERROR(CheckCount(n * k * width, "moe_combine"));
  if (k <= 0) return absl::InvalidArgumentError(StrCat("OpenCL moe_combine: k = ", k));
  const size_t pairs = static_cast<size_t>(n * k);
  MOERT_RETURN_IF_ERROR(CheckRange(y, pairs * static_cast<size_t>(width) * 4, "combine y"));
  MOERT_RETURN_IF_ERROR(CheckRange(experts, pairs * 4, "combine experts"));
  MOERT_RETURN_IF_ERROR(CheckRange(weights, pairs * 4, "combine weights"));
  MOERT_RETURN_IF_ERROR(CheckRange(out, static_cast<size_t>(n * width) * 4, "combine out"));
  MOERT_ASSIGN_OR_RETURN(cl_kernel kernel, device.programs().Kernel("elementwise", "moe_combine"));
  MOERT_RETURN_IF_ERROR(SetArgs(kernel, y, experts, weights, out, static_cast<int>(width), k,
                                static_cast<int>(n)));
  const size_t local[2] = {Pow2Group(device, 64), 1};
  const size_t global[2] = {static_cast<size_t>(width), static_cast<size_t>(n)};
  return Launch(device, kernel, "moe_combine", 2, global, local);
}

}  // namespace moert::backend::opencl
