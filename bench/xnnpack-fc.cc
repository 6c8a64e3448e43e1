// XNNPACK's fully-connected operators on the same expert shapes as moert's kernels,
// for a side-by-side baseline: f32 (4 bytes a weight) and qs8 (1 byte a weight, int8
// activations), batch 1 (decode) on every shape and batch M = 16, 128, 512 (prefill) on
// OLMoE's, with a pthreadpool of 1 and 2 threads. Counters as in bench-utils.h: GB/s
// of weight bytes (n*k*4 or n*k; the packed bias XNNPACK adds is left out) and
// bw_fraction, plus GOPS for M > 1.
// Like the moert benchmarks it cycles through more weight bytes than the last-level
// cache: WorkingSetBytes() / weight bytes operators of one shape are created from the
// same random weights, each packing its own copy, and every iteration runs the next.
// Debian 12's XNNPACK (2022) has the create / setup / run API, without reshape.
// Run: <build>/bin/moert-bench-xnnpack-fc
#include <xnnpack.h>

#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "bench/bench-utils.h"
#include "core/strings.h"

namespace {

using moert::StrCat;
namespace bench = moert::bench;

enum class Dtype { kF32, kQs8 };

const char* DtypeName(Dtype d) { return d == Dtype::kF32 ? "f32" : "qs8"; }
size_t WeightBytes(Dtype d, const bench::Shape& s) {
  return s.n * s.k * (d == Dtype::kF32 ? sizeof(float) : sizeof(int8_t));
}

xnn_status g_init_status = xnn_status_uninitialized;

// The operators of one (dtype, shape), built on first use and kept until a benchmark
// asks for another (the benchmarks of one shape are registered next to each other).
class OperatorSet {
 public:
  ~OperatorSet() { Clear(); }

  // Empty (with `error` set) when XNNPACK refused.
  const std::vector<xnn_operator_t>& Get(Dtype dtype, const bench::Shape& shape,
                                         std::string* error) {
    if (dtype == dtype_ && shape.n == n_ && shape.k == k_ && !ops_.empty()) return ops_;
    Clear();
    dtype_ = dtype;
    n_ = shape.n;
    k_ = shape.k;
    const size_t count = bench::WorkingSetBytes() / WeightBytes(dtype, shape);
    if (count < 2) {
      *error =
          "the working set holds fewer than two matrices of this shape; raise "
          "MOERT_BENCH_WORKING_SET_BYTES";
      return ops_;
    }
    bench::AlignedBytes weights = bench::AllocateAligned(WeightBytes(dtype, shape));
    bench::FillRandom(weights.get(), WeightBytes(dtype, shape), 3);
    if (dtype == Dtype::kF32) {
      // Random bytes as floats would include NaNs and subnormals: use [-1, 1).
      auto* w = reinterpret_cast<float*>(weights.get());
      for (size_t i = 0; i < shape.n * shape.k; ++i) {
        uint32_t bits;
        std::memcpy(&bits, w + i, sizeof(bits));
        w[i] = static_cast<float>(bits >> 8) * 0x1p-23f - 1.0f;
      }
    }
    for (size_t i = 0; i < count; ++i) {
      xnn_operator_t op = nullptr;
      xnn_status status;
      if (dtype == Dtype::kF32) {
        status = xnn_create_fully_connected_nc_f32(
            shape.k, shape.n, shape.k, shape.n, reinterpret_cast<const float*>(weights.get()),
            /*bias=*/nullptr, -std::numeric_limits<float>::infinity(),
            std::numeric_limits<float>::infinity(), /*flags=*/0, &op);
      } else {
        // Scales with input_scale * kernel_scale / output_scale < 1, as XNNPACK's
        // requantization needs.
        status = xnn_create_fully_connected_nc_qs8(
            shape.k, shape.n, shape.k, shape.n, /*input_zero_point=*/0, /*input_scale=*/0.05f,
            /*kernel_scale=*/0.01f, reinterpret_cast<const int8_t*>(weights.get()),
            /*bias=*/nullptr, /*output_zero_point=*/0, /*output_scale=*/1.0f, -128, 127,
            /*flags=*/0, &op);
      }
      if (status != xnn_status_success) {
        *error = StrCat("xnn_create_fully_connected_nc_", DtypeName(dtype), " failed (status ",
                        static_cast<int>(status), ")");
        Clear();
        return ops_;
      }
      ops_.push_back(op);
    }
    return ops_;
  }

 private:
  void Clear() {
    for (xnn_operator_t op : ops_) xnn_delete_operator(op);
    ops_.clear();
  }

  Dtype dtype_ = Dtype::kF32;
  size_t n_ = 0;
  size_t k_ = 0;
  std::vector<xnn_operator_t> ops_;
};

OperatorSet& Operators() {
  static OperatorSet set;
  return set;
}

void RunFc(benchmark::State& state, Dtype dtype, bench::Shape shape, size_t m, int threads) {
  if (g_init_status != xnn_status_success) {
    bench::Fail(state,
                StrCat("xnn_initialize failed (status ", static_cast<int>(g_init_status), ")"));
    return;
  }
  std::string error;
  const std::vector<xnn_operator_t>& ops = Operators().Get(dtype, shape, &error);
  if (ops.empty()) {
    bench::Fail(state, error);
    return;
  }
  const size_t elem = dtype == Dtype::kF32 ? sizeof(float) : sizeof(int8_t);
  // XNNPACK may read XNN_EXTRA_BYTES past the input.
  bench::AlignedBytes input = bench::AllocateAligned(m * shape.k * elem + XNN_EXTRA_BYTES);
  bench::AlignedBytes output = bench::AllocateAligned(m * shape.n * elem);
  if (dtype == Dtype::kF32) {
    auto* x = reinterpret_cast<float*>(input.get());
    for (size_t i = 0; i < m * shape.k; ++i) {
      x[i] = static_cast<float>(static_cast<int>(i * 2654435761u % 2001u) - 1000) * 1e-3f;
    }
  } else {
    bench::FillRandom(input.get(), m * shape.k, 5);
  }
  pthreadpool_t pool = bench::ThreadPool(threads);
  for (xnn_operator_t op : ops) {
    const xnn_status status =
        dtype == Dtype::kF32
            ? xnn_setup_fully_connected_nc_f32(op, m, reinterpret_cast<const float*>(input.get()),
                                               reinterpret_cast<float*>(output.get()), pool)
            : xnn_setup_fully_connected_nc_qs8(op, m, reinterpret_cast<const int8_t*>(input.get()),
                                               reinterpret_cast<int8_t*>(output.get()), pool);
    if (status != xnn_status_success) {
      bench::Fail(state, StrCat("xnn_setup_fully_connected_nc_", DtypeName(dtype),
                                " failed (status ", static_cast<int>(status), ")"));
      return;
    }
  }
  size_t next = 0;
  bench::LoopTimer timer;
  for (auto _ : state) {
    if (xnn_run_operator(ops[next], pool) != xnn_status_success) {
      bench::Fail(state, "xnn_run_operator failed");
      return;
    }
    if (++next == ops.size()) next = 0;
    benchmark::DoNotOptimize(output.get());
    benchmark::ClobberMemory();
    timer.Lap();
  }
  bench::SetWeightCounters(state, WeightBytes(dtype, shape), threads, timer);
  if (m > 1) {
    bench::SetOpsCounter(
        state,
        2.0 * static_cast<double>(m) * static_cast<double>(shape.n) * static_cast<double>(shape.k),
        timer);
  }
}

void Register() {
  for (Dtype dtype : {Dtype::kF32, Dtype::kQs8}) {
    for (const bench::Shape& shape : bench::kExpertShapes) {
      bool olmoe = false;
      for (const bench::Shape& o : bench::kOlmoeShapes) olmoe |= o.n == shape.n && o.k == shape.k;
      std::vector<size_t> rows = {1};
      if (olmoe) rows.insert(rows.end(), std::begin(bench::kGemmRows), std::end(bench::kGemmRows));
      for (size_t m : rows) {
        for (int threads : bench::kThreadCounts) {
          std::string name = StrCat("xnnpack_fc_", DtypeName(dtype), "/", shape.name);
          if (m > 1) moert::StrAppend(&name, "/m:", m);
          moert::StrAppend(&name, "/threads:", threads);
          bench::Configure(benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& state) {
            RunFc(state, dtype, shape, m, threads);
          }));
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  g_init_status = xnn_initialize(/*allocator=*/nullptr);
  Register();
  return bench::Main(argc, argv);
}
