// Benchmarks of the OpenCL backend on the first device moert opens (a GPU; else a CPU
// device such as PoCL's, so the binary runs unchanged on a phone, a GPU box or CI):
// W4A8 GEMV 4096 x 4096 (decode of a large projection) and the fused MoE expert op for
// one token (OLMoE-like: 2048 wide, 1024-wide experts, 8 of 8 chosen). Each iteration
// enqueues the op and waits for it (Device::Finish), so the time includes the launch
// latency a decode step pays. Reported: GB/s of weight bytes read. The device name,
// driver and kernel variant are in the benchmark context.
// Run: <build>/bin/moert-bench-opencl
#include <benchmark/benchmark.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/opencl/buffer.h"
#include "backend/opencl/device.h"
#include "backend/opencl/ops.h"
#include "backend/packing.h"
#include "backend/cpu/qmatmul.h"
#include "kernels/ukernel.h"

namespace {

using moert::backend::PackedMatrix;
using moert::backend::WeightFormat;
namespace ocl = moert::backend::opencl;

ocl::Device* g_device = nullptr;

// Random W4 bytes with valid fp16 scales (the speed does not depend on the values).
PackedMatrix RandomW4(int64_t groups, int64_t rows, int64_t cols) {
  PackedMatrix m(WeightFormat::kW4, groups, rows, cols);
  std::mt19937 rng(1);
  for (int64_t g = 0; g < groups; ++g) {
    auto* blocks = reinterpret_cast<moert_w4_block*>(m.mutable_group(g));
    const size_t n = m.group_bytes() / sizeof(moert_w4_block);
    for (size_t b = 0; b < n; ++b) {
      for (int r = 0; r < MOERT_NR; ++r) {
        blocks[b].d[r] = 0x2000;  // 2^-7
        for (int j = 0; j < 16; ++j) blocks[b].qs[r][j] = static_cast<uint8_t>(rng());
      }
    }
  }
  return m;
}

ocl::Buffer RandomA8(int64_t n, int64_t k) {
  std::vector<float> x(static_cast<size_t>(n * k));
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  ocl::Buffer xf = ocl::Buffer::FromHost(*g_device, x.data(), x.size() * 4).value();
  ocl::Buffer a =
      ocl::Buffer::Create(*g_device, static_cast<size_t>(n * k / 32) * sizeof(moert_a8_block))
          .value();
  if (!ocl::Q8Quant(*g_device, xf, n, k, a).ok()) std::abort();
  return a;
}

void Check(const absl::Status& s, benchmark::State& state) {
  if (!s.ok()) state.SkipWithError(std::string(s.message()).c_str());
}

void BM_W4A8Gemv(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const PackedMatrix w = RandomW4(1, rows, cols);
  ocl::DeviceMatrix dw = ocl::DeviceMatrix::Upload(*g_device, w).value();
  ocl::Buffer a = RandomA8(1, cols);
  ocl::Buffer y = ocl::Buffer::Create(*g_device, static_cast<size_t>(rows) * 4).value();
  for (auto _ : state) {
    Check(ocl::QMatMul(*g_device, dw.ref, 0, a, 1, y), state);
    Check(g_device->Finish(), state);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(w.group_bytes()));
}
BENCHMARK(BM_W4A8Gemv)->ArgNames({"n", "k"})->Args({4096, 4096})->UseRealTime();

void BM_FusedExpertDecode(benchmark::State& state) {
  const int64_t n_embd = state.range(0), n_ff = state.range(1);
  const int n_expert = static_cast<int>(state.range(2)), k = static_cast<int>(state.range(3));
  const PackedMatrix gate = RandomW4(n_expert, n_ff, n_embd);
  const PackedMatrix up = RandomW4(n_expert, n_ff, n_embd);
  const PackedMatrix down = RandomW4(n_expert, n_embd, n_ff);
  ocl::DeviceMatrix dg = ocl::DeviceMatrix::Upload(*g_device, gate).value();
  ocl::DeviceMatrix du = ocl::DeviceMatrix::Upload(*g_device, up).value();
  ocl::DeviceMatrix dd = ocl::DeviceMatrix::Upload(*g_device, down).value();
  ocl::Buffer a = RandomA8(1, n_embd);
  std::vector<int> experts(static_cast<size_t>(k));
  std::vector<float> weights(static_cast<size_t>(k), 1.0f / static_cast<float>(k));
  for (int s = 0; s < k; ++s) experts[static_cast<size_t>(s)] = s % n_expert;
  ocl::Buffer de = ocl::Buffer::FromHost(*g_device, experts.data(), experts.size() * 4).value();
  ocl::Buffer dwt = ocl::Buffer::FromHost(*g_device, weights.data(), weights.size() * 4).value();
  ocl::Buffer out = ocl::Buffer::Create(*g_device, static_cast<size_t>(n_embd) * 4).value();
  ocl::Scratch scratch;
  for (auto _ : state) {
    Check(ocl::FusedMoe(*g_device, {dg.ref, du.ref, dd.ref, {}}, a, 1, k, de, dwt, out, scratch),
          state);
    Check(g_device->Finish(), state);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * k *
                          static_cast<int64_t>(gate.group_bytes() * 3));
}
BENCHMARK(BM_FusedExpertDecode)
    ->ArgNames({"embd", "ff", "experts", "k"})
    ->Args({2048, 1024, 8, 8})
    ->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  ocl::DeviceOptions options;
  options.allow_cpu = true;
  auto device = ocl::Device::Open(options);
  if (!device.ok()) {
    std::fprintf(stderr, "moert-bench-opencl: %s\n",
                 std::string(device.status().message()).c_str());
    return 1;
  }
  g_device = device->get();
  const ocl::DeviceInfo& info = g_device->info();
  benchmark::AddCustomContext("opencl_device",
                              info.name + " (" + std::string(info.TypeName()) + ")");
  benchmark::AddCustomContext("opencl_driver", info.driver_version);
  benchmark::AddCustomContext("opencl_c", info.opencl_c_version);
  benchmark::AddCustomContext("opencl_variant", g_device->variant().BuildOptions());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_device = nullptr;
  return 0;
}
