// The OpenCL backend against the CPU on the same ops and shapes (ggml's backend-ops
// tests in spirit): every kernel in kernels/opencl/ runs on the first OpenCL device
// (PoCL's CPU device here) and is compared with the CPU reference, including edge
// shapes (one row, K = 32, a last partial weight tile, sizes that are not a multiple
// of the work-group size). Bounds, and why:
//  - q8_quant: the A8 blocks are compared byte for byte (the arithmetic is specified
//    exactly; the device divides correctly rounded when it says so).
//  - GEMV/GEMM (one work-item per row): the same bits as the CPU kernels; also
//    NMSE < 1e-12. Split-K GEMV (GPU tiles): NMSE < 1e-10 (only the order of the
//    float additions of exact block products differs).
//  - fused MoE: NMSE < 1e-6 (exp() inside SiLU may differ by ulps, which can move one
//    A8 rounding of the hidden state; the error then is one quantization step).
//  - RMSNorm, RoPE, softmax, attention, routing weights: NMSE < 1e-10 (float
//    reductions in another order than the CPU's, some of which are in double).
//  - top-k: the same expert indices.
//  - the integer dot product path (cl_khr_integer_dot_product), run here through
//    software builtins (KernelVariant::int_dot_polyfill): W4/W8 GEMV, GEMM and fused
//    MoE give the same bits as the baseline path (integer sums are exact), and a probe
//    kernel shows the path was compiled in, so the comparison can fail.
//  - split-K GEMV through the sub-group code (KernelVariant::subgroups_polyfill: the
//    work-group is the sub-group): NMSE < 1e-10 like the local-memory split.
// Without a device the tests skip with the reason, unless MOERT_REQUIRE_OPENCL=1.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "backend/opencl/buffer.h"
#include "backend/opencl/cl_loader.h"
#include "backend/opencl/device.h"
#include "backend/opencl/embedded_sources.h"
#include "backend/opencl/ops.h"
#include "backend/opencl/program_cache.h"
#include "backend/packing.h"
#include "backend/cpu/qmatmul.h"
#include "common/nmse.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "format/arch.h"
#include "format/ggml_types.h"
#include "kernels/config.h"
#include "model/layers.h"

namespace moert::backend::opencl {
namespace {

using cpu::A8Matrix;
using cpu::FusedFfn;
using cpu::QMatMulJob;
using cpu::QMatMuls;

bool RequireOpenCl() {
  const char* v = std::getenv("MOERT_REQUIRE_OPENCL");
  return v != nullptr && std::string(v) == "1";
}

std::string TempDir(const std::string& name) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("moert-opencl-test-" + std::to_string(getpid()) + "-" + name))
                              .string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::vector<float> RandomFloats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// test_util::Nmse, with the sizes checked.
double Nmse(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  return test_util::Nmse(a, b);
}

PackedMatrix MakePacked(WeightFormat format, int64_t groups, int64_t rows, int64_t cols,
                        uint32_t seed) {
  PackedMatrix m(format, groups, rows, cols);
  const std::vector<float> f = RandomFloats(static_cast<size_t>(groups * rows * cols), seed, 0.05f);
  for (int64_t g = 0; g < groups; ++g) {
    std::span<const uint8_t> src(reinterpret_cast<const uint8_t*>(f.data() + g * rows * cols),
                                 static_cast<size_t>(rows * cols) * sizeof(float));
    EXPECT_TRUE(PackRows(format::GgmlType::kF32, src, rows, cols, format,
                         {m.mutable_group(g), m.group_bytes()})
                    .ok());
  }
  return m;
}

template <typename T>
Buffer Upload(Device& device, const std::vector<T>& v) {
  absl::StatusOr<Buffer> b = Buffer::FromHost(device, v.data(), v.size() * sizeof(T));
  EXPECT_TRUE(b.ok()) << b.status();
  return std::move(b).value();
}

template <typename T>
std::vector<T> Download(Device& device, const Buffer& b, size_t n) {
  std::vector<T> v(n);
  const absl::Status s = b.Read(device, v.data(), n * sizeof(T));
  EXPECT_TRUE(s.ok()) << s;
  return v;
}

Buffer Alloc(Device& device, size_t bytes) {
  absl::StatusOr<Buffer> b = Buffer::Create(device, bytes);
  EXPECT_TRUE(b.ok()) << b.status();
  return std::move(b).value();
}

// A8 rows on the device and the CPU's A8Matrix of the same floats.
struct A8Pair {
  A8Matrix cpu;
  Buffer device;
};

A8Pair QuantizeBoth(Device& device, const std::vector<float>& x, int64_t n, int64_t k) {
  A8Pair p;
  core::ThreadPool pool(1);
  p.cpu.Quantize(kernels::GetKernelConfig(), pool, x.data(), n, k);
  p.device = Upload(device, x);  // replaced below by the A8 blocks
  Buffer a = Alloc(device, static_cast<size_t>(n * k / 32) * sizeof(moert_a8_block));
  EXPECT_TRUE(Q8Quant(device, p.device, n, k, a).ok());
  p.device = std::move(a);
  return p;
}

class OpenClTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cache_dir_ = new std::string(TempDir("cache"));
    DeviceOptions options;
    options.allow_cpu = true;
    options.cache_dir = *cache_dir_;
    absl::StatusOr<std::unique_ptr<Device>> d = Device::Open(options);
    if (d.ok()) {
      device_ = d->release();
    } else {
      open_error_ = new std::string(std::string(d.status().message()));
    }
  }
  static void TearDownTestSuite() {
    delete device_;
    device_ = nullptr;
    if (cache_dir_ != nullptr) std::filesystem::remove_all(*cache_dir_);
    delete cache_dir_;
    cache_dir_ = nullptr;
  }
  void SetUp() override {
    if (device_ == nullptr) {
      if (RequireOpenCl()) FAIL() << "MOERT_REQUIRE_OPENCL=1 but: " << *open_error_;
      GTEST_SKIP() << "no OpenCL device: " << *open_error_;
    }
  }
  Device& device() { return *device_; }

  static Device* device_;
  static std::string* open_error_;
  static std::string* cache_dir_;
};

Device* OpenClTest::device_ = nullptr;
std::string* OpenClTest::open_error_ = nullptr;
std::string* OpenClTest::cache_dir_ = nullptr;

// The OpenCL library looked up at run time (backend/opencl/cl_loader.h).
TEST(ClLoaderTest, AMissingLibraryAndOneWithoutOpenClAreNamedWithTheReason) {
  const auto none = OpenClLibrary({"/nonexistent/libOpenCL.so", "libc.so.6"});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  const std::string message(none.status().message());
  EXPECT_NE(message.find("/nonexistent/libOpenCL.so: "), std::string::npos) << message;
  EXPECT_NE(message.find("libc.so.6: has no clGetPlatformIDs"), std::string::npos) << message;
  EXPECT_NE(message.find("MOERT_OPENCL_LIBRARY"), std::string::npos) << message;
}

TEST(ClLoaderTest, TheIcdLoaderOpensWithEveryFunctionAfterAFailedCandidate) {
  const auto api = OpenClLibrary({"/nonexistent/libOpenCL.so", "libOpenCL.so.1"});
  if (!api.ok()) {
    if (RequireOpenCl()) FAIL() << api.status();
    GTEST_SKIP() << api.status();
  }
  EXPECT_EQ(api->library, "libOpenCL.so.1");
  ASSERT_NE(api->clGetPlatformIDs, nullptr);
  ASSERT_NE(api->clFinish, nullptr);
  cl_uint platforms = 0;
  const cl_int err = api->clGetPlatformIDs(0, nullptr, &platforms);
  if ((err != CL_SUCCESS || platforms == 0) && !RequireOpenCl()) {
    GTEST_SKIP() << "the ICD loader opens but finds no platform";
  }
  EXPECT_EQ(err, CL_SUCCESS);
  EXPECT_GE(platforms, 1u);
}

TEST(ClLoaderTest, TheEnvironmentsLibraryIsTheOnlyCandidate) {
  const char* before = std::getenv("MOERT_OPENCL_LIBRARY");
  const std::string saved = before != nullptr ? before : "";
  ASSERT_EQ(::setenv("MOERT_OPENCL_LIBRARY", "/opt/gpu/libOpenCL.so", 1), 0);
  EXPECT_EQ(ClLibraryCandidates(), std::vector<std::string>{"/opt/gpu/libOpenCL.so"});
  ASSERT_EQ(::unsetenv("MOERT_OPENCL_LIBRARY"), 0);
  const std::vector<std::string> defaults = ClLibraryCandidates();
  ASSERT_FALSE(defaults.empty());
#if defined(__ANDROID__)
  EXPECT_EQ(defaults.front(), "libOpenCL.so");
#else
  EXPECT_EQ(defaults.front(), "libOpenCL.so.1");
#endif
  if (before != nullptr) ::setenv("MOERT_OPENCL_LIBRARY", saved.c_str(), 1);
}

TEST_F(OpenClTest, DeviceInfoIsFilledIn) {
  const DeviceInfo& info = device().info();
  EXPECT_FALSE(info.name.empty());
  EXPECT_FALSE(info.driver_version.empty());
  EXPECT_NE(info.opencl_c_version.find("OpenCL C"), std::string::npos) << info.opencl_c_version;
  EXPECT_GT(info.global_mem_bytes, 0u);
  EXPECT_GT(info.max_work_group_size, 0u);
  EXPECT_EQ(device().variant().use_fp16, info.HasExtension("cl_khr_fp16"));
  EXPECT_FALSE(info.HasExtension("cl_not_an_extension"));
  std::cout << "[ device ] " << info.name << " (" << info.TypeName() << ", " << info.vendor
            << ", driver " << info.driver_version << ", " << info.opencl_c_version
            << "), options: " << device().variant().BuildOptions() << "\n";
}

TEST_F(OpenClTest, Q8QuantMatchesCpuBlocksExactly) {
  for (int64_t n : {1, 3}) {
    for (int64_t k : {32, 96, 4096}) {
      std::vector<float> x = RandomFloats(static_cast<size_t>(n * k), static_cast<uint32_t>(n * k));
      // Edge blocks: all zero (d = 0), and exact halves (amax 127 -> d 1 -> ties to even).
      if (k >= 96) {
        for (int j = 0; j < 32; ++j) x[static_cast<size_t>(32 + j)] = 0.0f;
        for (int j = 0; j < 32; ++j)
          x[static_cast<size_t>(64 + j)] = static_cast<float>(j % 8) - 3.5f;
        x[64] = 127.0f;
      }
      const A8Pair a = QuantizeBoth(device(), x, n, k);
      const size_t blocks = static_cast<size_t>(n * k / 32);
      const std::vector<moert_a8_block> got = Download<moert_a8_block>(device(), a.device, blocks);
      for (size_t b = 0; b < blocks; ++b) {
        ASSERT_EQ(std::memcmp(&got[b], a.cpu.row(0) + b, sizeof(moert_a8_block)), 0)
            << "n=" << n << " k=" << k << " block " << b << ": d " << got[b].d << " vs "
            << a.cpu.row(0)[b].d << ", s " << got[b].s << " vs " << a.cpu.row(0)[b].s;
      }
    }
  }
}

class OpenClMatMulTest : public OpenClTest, public ::testing::WithParamInterface<WeightFormat> {};
// The integer-dot paths' polyfill checks: kernel numerics, which the sanitizer step
// adds nothing to (x86 CI step only, label `slow`).
class OpenClSlowTest : public OpenClTest {};
class OpenClMatMulSlowTest : public OpenClMatMulTest {};

// The CPU's y for n A8 rows against one group of w.
std::vector<float> CpuMatMul(const PackedMatrix& w, int64_t group, const A8Matrix& a) {
  std::vector<float> y(static_cast<size_t>(a.n() * w.rows()));
  core::ThreadPool pool(1);
  const QMatMulJob job{w.group(group), &a, y.data()};
  QMatMuls(pool, kernels::GetKernelConfig(), {&job, 1});
  return y;
}

TEST_P(OpenClMatMulTest, GemvAndGemmMatchCpuBits) {
  const WeightFormat format = GetParam();
  for (int64_t rows : {1, 8, 13, 100, 257}) {
    for (int64_t cols : {32, 96, 512}) {
      const PackedMatrix w = MakePacked(format, 1, rows, cols, static_cast<uint32_t>(rows + cols));
      DeviceMatrix dw = DeviceMatrix::Upload(device(), w).value();
      for (int64_t n : {1, 3, 5, 8}) {
        const std::vector<float> x = RandomFloats(static_cast<size_t>(n * cols), 7);
        const A8Pair a = QuantizeBoth(device(), x, n, cols);
        Buffer y = Alloc(device(), static_cast<size_t>(n * rows) * 4);
        ASSERT_TRUE(QMatMul(device(), dw.ref, 0, a.device, n, y).ok());
        const std::vector<float> got = Download<float>(device(), y, static_cast<size_t>(n * rows));
        const std::vector<float> want = CpuMatMul(w, 0, a.cpu);
        EXPECT_LT(Nmse(got, want), 1e-12) << rows << "x" << cols << " n=" << n;
        if (device().variant().gemv_k_split == 1 || n > 1) {
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_EQ(got[i], want[i]) << rows << "x" << cols << " n=" << n << " at " << i;
          }
        }
      }
    }
  }
}

TEST_P(OpenClMatMulTest, StackedGroupAndSplitKVariant) {
  const WeightFormat format = GetParam();
  const int64_t rows = 44, cols = 320;
  const PackedMatrix w = MakePacked(format, 3, rows, cols, 11);
  // A second device handle on the same device with the GPU-style split-K GEMV.
  DeviceOptions options;
  options.allow_cpu = true;
  options.name_filter = device().info().name;
  options.disable_cache = true;
  options.has_variant = true;
  options.variant = device().variant();
  options.variant.gemv_k_split = 4;
  options.variant.gemv_wg = 64;
  std::unique_ptr<Device> split = Device::Open(options).value();
  for (Device* d : {&device(), split.get()}) {
    DeviceMatrix dw = DeviceMatrix::Upload(*d, w).value();
    const std::vector<float> x = RandomFloats(static_cast<size_t>(cols), 3);
    const A8Pair a = QuantizeBoth(*d, x, 1, cols);
    Buffer y = Alloc(*d, static_cast<size_t>(rows) * 4);
    for (int64_t g = 0; g < 3; ++g) {
      ASSERT_TRUE(QMatMul(*d, dw.ref, g, a.device, 1, y).ok());
      const std::vector<float> got = Download<float>(*d, y, static_cast<size_t>(rows));
      EXPECT_LT(Nmse(got, CpuMatMul(w, g, a.cpu)), 1e-10)
          << "group " << g << " k_split " << d->variant().gemv_k_split;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, OpenClMatMulTest,
                         ::testing::Values(WeightFormat::kW4, WeightFormat::kW8),
                         [](const auto& p) { return std::string(WeightFormatName(p.param)); });
INSTANTIATE_TEST_SUITE_P(Formats, OpenClMatMulSlowTest,
                         ::testing::Values(WeightFormat::kW4, WeightFormat::kW8),
                         [](const auto& p) { return std::string(WeightFormatName(p.param)); });

TEST_F(OpenClTest, UnsupportedFormatAndBadArgumentsAreStatuses) {
  const PackedMatrix w = MakePacked(WeightFormat::kW4M, 1, 8, 32, 1);
  DeviceMatrix dw = DeviceMatrix::Upload(device(), w).value();
  Buffer a = Alloc(device(), sizeof(moert_a8_block));
  Buffer y = Alloc(device(), 8 * 4);
  EXPECT_EQ(QMatMul(device(), dw.ref, 0, a, 1, y).code(), absl::StatusCode::kUnimplemented);
  Buffer x = Alloc(device(), 64 * 4);
  EXPECT_EQ(Q8Quant(device(), x, 1, 33, a).code(), absl::StatusCode::kInvalidArgument);
  // Two rows of 32 need two blocks; `a` holds one.
  EXPECT_EQ(Q8Quant(device(), x, 2, 32, a).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(Q8Quant(device(), BufferRef(x, 2), 1, 32, a).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Buffer::Create(device(), 0).status().code(), absl::StatusCode::kInvalidArgument);
  Buffer logits = Alloc(device(), 300 * 4);
  EXPECT_EQ(TopKRoute(device(), logits, 1, 300, 2, false, y, y).code(),
            absl::StatusCode::kInvalidArgument);
}

// FusedMoe against backend::FusedFfn, expert ids and weights on the device.
std::vector<float> CheckFusedMoe(Device& device, WeightFormat format, int64_t n, int k,
                                 bool routed) {
  const int n_expert = 6;
  const int64_t n_embd = 96, n_ff = 160;
  const PackedMatrix gate = MakePacked(format, n_expert, n_ff, n_embd, 1);
  const PackedMatrix up = MakePacked(format, n_expert, n_ff, n_embd, 2);
  const PackedMatrix down = MakePacked(format, n_expert, n_embd, n_ff, 3);
  DeviceMatrix dg = DeviceMatrix::Upload(device, gate).value();
  DeviceMatrix du = DeviceMatrix::Upload(device, up).value();
  DeviceMatrix dd = DeviceMatrix::Upload(device, down).value();
  const std::vector<float> x = RandomFloats(static_cast<size_t>(n * n_embd), 5);
  const A8Pair a = QuantizeBoth(device, x, n, n_embd);
  std::vector<int> experts(static_cast<size_t>(n * k));
  std::vector<float> weights(static_cast<size_t>(n * k));
  std::mt19937 rng(17);
  for (int64_t t = 0; t < n; ++t) {
    for (int s = 0; s < k; ++s) {
      // Distinct experts per token, some shared between tokens.
      experts[static_cast<size_t>(t * k + s)] = static_cast<int>((t + 2 * s) % n_expert);
      weights[static_cast<size_t>(t * k + s)] =
          0.1f + 0.8f * static_cast<float>(rng() % 100) / 100.0f;
    }
  }
  std::vector<float> want(static_cast<size_t>(n * n_embd));
  core::ThreadPool pool(1);
  FusedFfn(
      pool, kernels::GetKernelConfig(), a.cpu, k, routed ? experts.data() : nullptr,
      routed ? weights.data() : nullptr,
      [&](int e) {
        return FfnView{gate.group(e), up.group(e), down.group(e)};
      },
      n_embd, want.data());
  Buffer de = Upload(device, experts);
  Buffer dwt = Upload(device, weights);
  Buffer out = Alloc(device, want.size() * 4);
  Scratch scratch;
  const FfnRef ffn{dg.ref, du.ref, dd.ref, {}};
  const absl::Status s = FusedMoe(device, ffn, a.device, n, k, routed ? BufferRef(de) : BufferRef(),
                                  routed ? BufferRef(dwt) : BufferRef(), out, scratch);
  EXPECT_TRUE(s.ok()) << s;
  if (!s.ok()) return {};
  const std::vector<float> got = Download<float>(device, out, want.size());
  size_t exact = 0;
  for (size_t i = 0; i < got.size(); ++i) exact += got[i] == want[i];
  EXPECT_LT(Nmse(got, want), 1e-6)
      << "n=" << n << " k=" << k << " routed=" << routed << " exact " << exact << "/" << got.size();
  return got;
}

TEST_F(OpenClTest, FusedMoeMatchesCpuFusedFfn) {
  for (WeightFormat format : {WeightFormat::kW4, WeightFormat::kW8}) {
    CheckFusedMoe(device(), format, 1, 2, true);   // decode
    CheckFusedMoe(device(), format, 5, 3, true);   // a batch
    CheckFusedMoe(device(), format, 1, 1, false);  // a dense FFN / shared expert
    CheckFusedMoe(device(), format, 4, 1, false);
  }
}

TEST_F(OpenClTest, RmsNormMatchesCpu) {
  for (int64_t rows : {1, 3}) {
    for (int64_t width : {32, 100, 4096}) {
      const std::vector<float> x = RandomFloats(static_cast<size_t>(rows * width), 1, 3.0f);
      const std::vector<float> w = RandomFloats(static_cast<size_t>(width), 2);
      std::vector<float> want(x.size());
      model::RmsNorm(x.data(), rows, width, w.data(), 1e-5f, want.data());
      Buffer dx = Upload(device(), x), dw = Upload(device(), w), dy = Alloc(device(), x.size() * 4);
      ASSERT_TRUE(RmsNorm(device(), dx, rows, width, dw, 1e-5f, dy).ok());
      EXPECT_LT(Nmse(Download<float>(device(), dy, x.size()), want), 1e-10) << rows << "x" << width;
    }
  }
}

TEST_F(OpenClTest, RopeMatchesCpuInBothLayouts) {
  for (bool neox : {false, true}) {
    for (bool factors : {false, true}) {
      const int n_heads = 3, head_dim = 24, n_rot = 16;
      const int64_t pos0 = 5, n = 4;
      const std::vector<float> x = RandomFloats(static_cast<size_t>(n * n_heads * head_dim), 4);
      std::vector<float> ff(n_rot / 2);
      for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.0f + 0.5f * static_cast<float>(i);
      model::RopeParams p;
      p.layout = neox ? format::RopeLayout::kNeox : format::RopeLayout::kNormal;
      p.n_rot = n_rot;
      p.theta_base = 10000;
      p.freq_scale = 0.5f;
      p.freq_factors = factors ? ff.data() : nullptr;
      std::vector<float> want = x;
      model::ApplyRope(p, pos0, n, n_heads, head_dim, want.data());
      Buffer dx = Upload(device(), x), dff = Upload(device(), ff);
      RopeArgs args;
      args.neox = neox;
      args.n_rot = n_rot;
      args.theta_base = 10000;
      args.freq_scale = 0.5f;
      if (factors) args.freq_factors = dff;
      ASSERT_TRUE(Rope(device(), args, pos0, n, n_heads, head_dim, dx).ok());
      EXPECT_LT(Nmse(Download<float>(device(), dx, x.size()), want), 1e-10)
          << "neox " << neox << " factors " << factors;
    }
  }
}

TEST_F(OpenClTest, SoftmaxMatchesReference) {
  for (int64_t width : {1, 7, 256, 1000}) {
    const int64_t rows = 3;
    const std::vector<float> x = RandomFloats(static_cast<size_t>(rows * width), 8, 4.0f);
    std::vector<float> want(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x.data() + r * width;
      float* yr = want.data() + r * width;
      float m = xr[0];
      for (int64_t i = 1; i < width; ++i) m = std::max(m, xr[i]);
      double sum = 0;
      for (int64_t i = 0; i < width; ++i) sum += yr[i] = std::exp(xr[i] - m);
      for (int64_t i = 0; i < width; ++i) yr[i] *= static_cast<float>(1.0 / sum);
    }
    Buffer dx = Upload(device(), x);
    ASSERT_TRUE(Softmax(device(), dx, rows, width, dx).ok());  // in place
    EXPECT_LT(Nmse(Download<float>(device(), dx, x.size()), want), 1e-10) << width;
  }
}

TEST_F(OpenClTest, AttentionMatchesCpuPrefillAndDecode) {
  struct Case {
    int n_head, n_head_kv, dk, dv;
    int64_t pos0, n;
  };
  // half: the caches hold halves (AttentionArgs::kv_half); the CPU attends over the
  // same values widened back to floats.
  for (bool half : {false, true}) {
    for (const Case& c : {Case{4, 2, 16, 16, 0, 5}, Case{4, 4, 32, 24, 7, 1},
                          Case{6, 2, 64, 64, 70, 3}, Case{2, 1, 8, 8, 0, 1}}) {
      const int64_t n_kv = c.pos0 + c.n;
      const std::vector<float> q = RandomFloats(static_cast<size_t>(c.n * c.n_head * c.dk), 1);
      std::vector<float> k = RandomFloats(static_cast<size_t>(n_kv * c.n_head_kv * c.dk), 2);
      std::vector<float> v = RandomFloats(static_cast<size_t>(n_kv * c.n_head_kv * c.dv), 3);
      std::vector<uint16_t> k16(k.size()), v16(v.size());
      for (size_t i = 0; i < k.size(); ++i) k16[i] = core::FloatToFp16(k[i]);
      for (size_t i = 0; i < v.size(); ++i) v16[i] = core::FloatToFp16(v[i]);
      if (half) {
        for (size_t i = 0; i < k.size(); ++i) k[i] = core::Fp16ToFloat(k16[i]);
        for (size_t i = 0; i < v.size(); ++i) v[i] = core::Fp16ToFloat(v16[i]);
      }
      model::AttentionShape shape;
      shape.n_head = c.n_head;
      shape.n_head_kv = c.n_head_kv;
      shape.head_dim_k = c.dk;
      shape.head_dim_v = c.dv;
      shape.scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
      std::vector<float> want(static_cast<size_t>(c.n * c.n_head * c.dv));
      model::ThreadPool pool(1);
      model::Attention(pool, shape, q.data(), c.n, c.pos0, k.data(), v.data(), want.data());
      Buffer dq = Upload(device(), q);
      Buffer dk = half ? Upload(device(), k16) : Upload(device(), k);
      Buffer dv = half ? Upload(device(), v16) : Upload(device(), v);
      Buffer out = Alloc(device(), want.size() * 4);
      Scratch scratch;
      const AttentionArgs args{c.n_head, c.n_head_kv, c.dk, c.dv, shape.scale, half};
      ASSERT_TRUE(Attention(device(), args, dq, c.n, c.pos0, dk, dv, out, scratch).ok());
      EXPECT_LT(Nmse(Download<float>(device(), out, want.size()), want), 1e-10)
          << "heads " << c.n_head << "/" << c.n_head_kv << " pos0 " << c.pos0 << " n " << c.n
          << " half " << half;
    }
  }
}

// ToHalf rounds as core::FloatToFp16 does (nearest, ties to even; overflow to
// infinity; subnormals), bit for bit.
TEST_F(OpenClTest, ToHalfRoundsLikeTheHost) {
  std::vector<float> x = RandomFloats(1000, 31, 8.0f);
  for (float v : {0.0f, -0.0f, 1.0f, 65504.0f, 65520.0f, 1e6f, -1e6f, 6e-8f, 3e-5f,
                  1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 2049.0f, 2051.0f}) {
    x.push_back(v);
  }
  Buffer dx = Upload(device(), x);
  Buffer dy = Alloc(device(), x.size() * 2);
  ASSERT_TRUE(ToHalf(device(), dx, static_cast<int64_t>(x.size()), dy).ok());
  const std::vector<uint16_t> got = Download<uint16_t>(device(), dy, x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(got[i], core::FloatToFp16(x[i])) << x[i] << " at " << i;
  }
  EXPECT_EQ(ToHalf(device(), dx, static_cast<int64_t>(x.size()) + 1, dy).code(),
            absl::StatusCode::kOutOfRange);
}

TEST_F(OpenClTest, TopKRouteMatchesCpuIndices) {
  for (int n_expert : {8, 60, 256}) {
    for (int k : {1, 2, 8}) {
      for (bool renorm : {false, true}) {
        const int64_t n = 4;
        std::vector<float> logits = RandomFloats(static_cast<size_t>(n * n_expert),
                                                 static_cast<uint32_t>(n_expert * 10 + k), 2.0f);
        // Token 3: all equal (ties go to the lower index).
        for (int e = 0; e < n_expert; ++e) logits[static_cast<size_t>(3 * n_expert + e)] = 0.5f;
        std::vector<int> want_e(static_cast<size_t>(n * k));
        std::vector<float> want_w(want_e.size());
        for (int64_t t = 0; t < n; ++t) {
          model::RouteToken(logits.data() + t * n_expert, n_expert, k, renorm,
                            want_e.data() + t * k, want_w.data() + t * k);
        }
        Buffer dl = Upload(device(), logits);
        Buffer de = Alloc(device(), want_e.size() * 4), dw = Alloc(device(), want_w.size() * 4);
        ASSERT_TRUE(TopKRoute(device(), dl, n, n_expert, k, renorm, de, dw).ok());
        EXPECT_EQ(Download<int>(device(), de, want_e.size()), want_e)
            << "E " << n_expert << " k " << k;
        EXPECT_LT(Nmse(Download<float>(device(), dw, want_w.size()), want_w), 1e-10);
      }
    }
  }
}

// Router -> experts on the device with no host round trip in between.
TEST_F(OpenClTest, RoutedMoeChainsOnTheDevice) {
  const int n_expert = 8, k = 2;
  const int64_t n = 3, n_embd = 64, n_ff = 96;
  const PackedMatrix router = MakePacked(WeightFormat::kW8, 1, n_expert, n_embd, 9);
  const PackedMatrix gate = MakePacked(WeightFormat::kW4, n_expert, n_ff, n_embd, 1);
  const PackedMatrix up = MakePacked(WeightFormat::kW4, n_expert, n_ff, n_embd, 2);
  const PackedMatrix down = MakePacked(WeightFormat::kW4, n_expert, n_embd, n_ff, 3);
  const std::vector<float> x = RandomFloats(static_cast<size_t>(n * n_embd), 4, 3.0f);
  const A8Pair a = QuantizeBoth(device(), x, n, n_embd);
  // CPU
  const std::vector<float> logits = CpuMatMul(router, 0, a.cpu);
  std::vector<int> experts(static_cast<size_t>(n * k));
  std::vector<float> weights(experts.size());
  for (int64_t t = 0; t < n; ++t) {
    model::RouteToken(logits.data() + t * n_expert, n_expert, k, true, experts.data() + t * k,
                      weights.data() + t * k);
  }
  std::vector<float> want(static_cast<size_t>(n * n_embd));
  core::ThreadPool pool(1);
  FusedFfn(
      pool, kernels::GetKernelConfig(), a.cpu, k, experts.data(), weights.data(),
      [&](int e) {
        return FfnView{gate.group(e), up.group(e), down.group(e)};
      },
      n_embd, want.data());
  // Device
  DeviceMatrix dr = DeviceMatrix::Upload(device(), router).value();
  DeviceMatrix dg = DeviceMatrix::Upload(device(), gate).value();
  DeviceMatrix du = DeviceMatrix::Upload(device(), up).value();
  DeviceMatrix dd = DeviceMatrix::Upload(device(), down).value();
  Buffer dl = Alloc(device(), logits.size() * 4);
  Buffer de = Alloc(device(), experts.size() * 4), dw = Alloc(device(), weights.size() * 4);
  Buffer out = Alloc(device(), want.size() * 4);
  Scratch scratch;
  ASSERT_TRUE(QMatMul(device(), dr.ref, 0, a.device, n, dl).ok());
  ASSERT_TRUE(TopKRoute(device(), dl, n, n_expert, k, true, de, dw).ok());
  ASSERT_TRUE(
      FusedMoe(device(), {dg.ref, du.ref, dd.ref, {}}, a.device, n, k, de, dw, out, scratch).ok());
  ASSERT_TRUE(device().Finish().ok());
  EXPECT_EQ(Download<int>(device(), de, experts.size()), experts);
  EXPECT_LT(Nmse(Download<float>(device(), out, want.size()), want), 1e-6);
}

TEST_F(OpenClTest, BadExpertIdGivesNanNotACrash) {
  const PackedMatrix gate = MakePacked(WeightFormat::kW4, 2, 32, 32, 1);
  const PackedMatrix down = MakePacked(WeightFormat::kW4, 2, 32, 32, 3);
  DeviceMatrix dg = DeviceMatrix::Upload(device(), gate).value();
  DeviceMatrix dd = DeviceMatrix::Upload(device(), down).value();
  const A8Pair a = QuantizeBoth(device(), RandomFloats(32, 1), 1, 32);
  Buffer de = Upload(device(), std::vector<int>{7});
  Buffer dw = Upload(device(), std::vector<float>{1.0f});
  Buffer out = Alloc(device(), 32 * 4);
  Scratch scratch;
  ASSERT_TRUE(
      FusedMoe(device(), {dg.ref, dg.ref, dd.ref, {}}, a.device, 1, 1, de, dw, out, scratch).ok());
  for (float v : Download<float>(device(), out, 32)) EXPECT_TRUE(std::isnan(v));
}

// Experts in an expert pool: blocks at scattered offsets of one host region that the
// device reads through a WrapHost buffer (zero-copy where it shares host memory), each
// block [gate | up | down]; routing with an empty slot (-1).
TEST_F(OpenClTest, FusedMoeReadsPooledExpertsFromHostMemory) {
  for (WeightFormat format : {WeightFormat::kW4, WeightFormat::kW8}) {
    const int n_expert = 5, k = 3;
    const int64_t n = 4, n_embd = 64, n_ff = 96;
    const PackedMatrix gate = MakePacked(format, n_expert, n_ff, n_embd, 1);
    const PackedMatrix up = MakePacked(format, n_expert, n_ff, n_embd, 2);
    const PackedMatrix down = MakePacked(format, n_expert, n_embd, n_ff, 3);
    const size_t gb = gate.group_bytes(), db = down.group_bytes();
    const size_t block = 4096 * ((2 * gb + db + 4095) / 4096);
    // Expert e in slot slot_of[e] of 6 (slot 1 free), in a page-aligned region.
    const std::vector<size_t> slot_of = {3, 0, 5, 2, 4};
    const size_t region_bytes = 6 * block;
    std::unique_ptr<uint8_t, decltype(&std::free)> region(
        static_cast<uint8_t*>(std::aligned_alloc(4096, region_bytes)), &std::free);
    std::memset(region.get(), 0xEE, region_bytes);
    std::vector<uint64_t> offsets(n_expert);
    const auto place = [&](int e, int as) {  // expert `as`'s weights into e's block
      uint8_t* b = region.get() + offsets[static_cast<size_t>(e)];
      std::memcpy(b, gate.group(as).data, gb);
      std::memcpy(b + gb, up.group(as).data, gb);
      std::memcpy(b + 2 * gb, down.group(as).data, db);
    };
    for (int e = 0; e < n_expert; ++e) {
      offsets[static_cast<size_t>(e)] = slot_of[static_cast<size_t>(e)] * block;
      place(e, e);
    }
    absl::StatusOr<Buffer> wrapped = Buffer::WrapHost(device(), region.get(), region_bytes);
    ASSERT_TRUE(wrapped.ok()) << wrapped.status();
    ASSERT_TRUE(wrapped->Publish(device(), 0, region_bytes).ok());
    const auto part = [&](const PackedMatrix& m, size_t at) {
      return MatrixRef{BufferRef(*wrapped, at), format, n_expert, m.rows(), m.cols(),
                       m.group_bytes()};
    };
    FfnRef ffn{part(gate, 0), part(up, gb), part(down, 2 * gb), offsets};

    const std::vector<float> x = RandomFloats(static_cast<size_t>(n * n_embd), 5);
    const A8Pair a = QuantizeBoth(device(), x, n, n_embd);
    std::vector<int> experts = {4, 1, 2, /**/ 0, -1, 3, /**/ 2, 4, -1, /**/ 1, 3, 0};
    std::vector<float> weights = {0.5f, 0.3f, 0.2f, 0.6f, 0.0f, 0.4f,
                                  0.7f, 0.3f, 0.0f, 0.2f, 0.3f, 0.5f};
    const auto cpu = [&](std::vector<int> as) {  // FusedFfn with expert e's weights = as[e]'s
      std::vector<float> want(static_cast<size_t>(n * n_embd));
      core::ThreadPool pool(1);
      FusedFfn(
          pool, kernels::GetKernelConfig(), a.cpu, k, experts.data(), weights.data(),
          [&](int e) {
            const int w = as[static_cast<size_t>(e)];
            return FfnView{gate.group(w), up.group(w), down.group(w)};
          },
          n_embd, want.data());
      return want;
    };
    Buffer de = Upload(device(), experts);
    Buffer dw = Upload(device(), weights);
    Buffer out = Alloc(device(), static_cast<size_t>(n * n_embd) * 4);
    Scratch scratch;
    const auto run = [&] {
      const absl::Status s = FusedMoe(device(), ffn, a.device, n, k, de, dw, out, scratch);
      EXPECT_TRUE(s.ok()) << s;
      return Download<float>(device(), out, static_cast<size_t>(n * n_embd));
    };
    EXPECT_LT(Nmse(run(), cpu({0, 1, 2, 3, 4})), 1e-6) << WeightFormatName(format);

    // The host rewrites expert 2's block with expert 0's weights (a new load into a
    // reused block): once published, the device reads the new bytes.
    place(2, 0);
    ASSERT_TRUE(wrapped->Publish(device(), offsets[2], block).ok());
    const std::vector<float> want = cpu({0, 1, 0, 3, 4});
    EXPECT_LT(Nmse(run(), want), 1e-6) << WeightFormatName(format);
    EXPECT_GT(Nmse(want, cpu({0, 1, 2, 3, 4})), 1e-3);  // the change is visible

    // Bad placements are refused before anything runs.
    std::vector<uint64_t> bad = offsets;
    bad[1] = region_bytes - block / 2;  // the block runs past the region
    ffn.expert_offsets = bad;
    EXPECT_EQ(FusedMoe(device(), ffn, a.device, n, k, de, dw, out, scratch).code(),
              absl::StatusCode::kOutOfRange);
    ffn.expert_offsets = std::span<const uint64_t>(offsets).first(3);
    EXPECT_EQ(FusedMoe(device(), ffn, a.device, n, k, de, dw, out, scratch).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST_F(OpenClTest, PublishChecksItsBufferAndRange) {
  std::vector<uint8_t> host(4096, 1);
  absl::StatusOr<Buffer> wrapped = Buffer::WrapHost(device(), host.data(), host.size());
  ASSERT_TRUE(wrapped.ok()) << wrapped.status();
  EXPECT_TRUE(wrapped->Publish(device(), 4000, 96).ok());
  EXPECT_EQ(wrapped->Publish(device(), 4000, 97).code(), absl::StatusCode::kOutOfRange);
  Buffer plain = Alloc(device(), 64);
  EXPECT_EQ(plain.Publish(device(), 0, 4).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Buffer::WrapHost(device(), nullptr, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(OpenClTest, HostVisibleBufferMapsForZeroCopy) {
  absl::StatusOr<Buffer> b = Buffer::Create(device(), 1024, /*host_visible=*/true);
  ASSERT_TRUE(b.ok()) << b.status();
  absl::StatusOr<void*> p = b->Map(device(), /*write=*/true);
  ASSERT_TRUE(p.ok()) << p.status();
  auto* f = static_cast<float*>(*p);
  for (int i = 0; i < 256; ++i) f[i] = static_cast<float>(i);
  ASSERT_TRUE(b->Unmap(device(), *p).ok());
  // A kernel sees what the host wrote through the map.
  ASSERT_TRUE(Softmax(device(), *b, 1, 256, *b).ok());
  const std::vector<float> y = Download<float>(device(), *b, 256);
  EXPECT_GT(y[255], y[254]);
  EXPECT_NEAR(std::accumulate(y.begin(), y.end(), 0.0), 1.0, 1e-5);
}

TEST_F(OpenClTest, SecondStartLoadsProgramsFromTheDiskCache) {
  const std::string dir = TempDir("second-start");
  DeviceOptions options;
  options.allow_cpu = true;
  options.name_filter = device().info().name;
  options.cache_dir = dir;
  {
    std::unique_ptr<Device> first = Device::Open(options).value();
    ASSERT_TRUE(first->programs().Kernel("q8_quant", "q8_quant").ok());
    EXPECT_EQ(first->programs().stats().source_builds, 1);
    EXPECT_EQ(first->programs().stats().disk_hits, 0);
    EXPECT_EQ(first->programs().stats().disk_writes, 1);
  }
  {
    std::unique_ptr<Device> second = Device::Open(options).value();
    ASSERT_TRUE(second->programs().Kernel("q8_quant", "q8_quant").ok());
    EXPECT_EQ(second->programs().stats().source_builds, 0);
    EXPECT_EQ(second->programs().stats().disk_hits, 1);
    // And the cached program computes the same blocks.
    const std::vector<float> x = RandomFloats(64, 2);
    const A8Pair a = QuantizeBoth(*second, x, 1, 64);
    const std::vector<moert_a8_block> got = Download<moert_a8_block>(*second, a.device, 2);
    EXPECT_EQ(std::memcmp(got.data(), a.cpu.row(0), 2 * sizeof(moert_a8_block)), 0);
  }
  // A corrupted cache file is rejected and rebuilt from source.
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ofstream(entry.path(), std::ios::binary | std::ios::trunc) << "garbage";
  }
  {
    std::unique_ptr<Device> third = Device::Open(options).value();
    ASSERT_TRUE(third->programs().Kernel("q8_quant", "q8_quant").ok());
    EXPECT_EQ(third->programs().stats().binaries_rejected, 1);
    EXPECT_EQ(third->programs().stats().source_builds, 1);
  }
  std::filesystem::remove_all(dir);
}

TEST_F(OpenClTest, BuildFailureReturnsTheBuildLog) {
  absl::StatusOr<cl_program> p = device().programs().Build(
      "__kernel void broken(__global float* x) { x[0] = undeclared; }", "");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInternal);
  const std::string message(p.status().message());
  EXPECT_NE(message.find("CL_BUILD_PROGRAM_FAILURE"), std::string::npos) << message;
  EXPECT_NE(message.find("undeclared"), std::string::npos) << message;
  EXPECT_EQ(device().programs().Kernel("no_such_file", "k").status().code(),
            absl::StatusCode::kNotFound);
}

// fp32 matmul (weights kept fp32: the F32 model, routers): bit for bit model::MatMul,
// over K with and without a tail past the blocks of 8, rows and tokens of 1 and more.
TEST_F(OpenClTest, F32MatMulMatchesCpuBitForBit) {
  model::ThreadPool pool(1);
  // half: the weights stored as IEEE half on the device (values that are halves).
  for (bool half : {false, true}) {
    for (int64_t rows : {1, 7, 65}) {
      for (int64_t cols : {8, 44, 256}) {
        for (int64_t n : {1, 3}) {
          std::vector<float> w = RandomFloats(static_cast<size_t>(rows * cols), 11);
          std::vector<uint16_t> w16(w.size());
          for (size_t i = 0; i < w.size(); ++i) {
            w16[i] = core::FloatToFp16(w[i]);
            if (half) w[i] = core::Fp16ToFloat(w16[i]);
          }
          const std::vector<float> x = RandomFloats(static_cast<size_t>(n * cols), 12);
          std::vector<float> want(static_cast<size_t>(n * rows));
          model::MatMul(pool, model::MatrixView(w.data(), rows, cols), x.data(), n, want.data());
          Buffer dw = half ? Upload(device(), w16) : Upload(device(), w);
          Buffer dx = Upload(device(), x);
          Buffer dy = Alloc(device(), want.size() * 4);
          ASSERT_TRUE(F32MatMul(device(), dw, rows, cols, dx, n, dy, half).ok());
          EXPECT_EQ(Download<float>(device(), dy, want.size()), want)
              << rows << " x " << cols << ", n " << n << ", half " << half;
        }
      }
    }
  }
  Buffer small = Alloc(device(), 16);
  EXPECT_EQ(F32MatMul(device(), small, 4, 4, small, 1, small).code(),
            absl::StatusCode::kOutOfRange);
  Buffer halves = Alloc(device(), 32), x = Alloc(device(), 64);
  EXPECT_TRUE(F32MatMul(device(), halves, 4, 4, x, 1, x, /*half_weights=*/true).ok());
  EXPECT_EQ(F32MatMul(device(), halves, 4, 5, x, 1, x, true).code(),
            absl::StatusCode::kOutOfRange);
}

// The elementwise ops the model forward chains: residual add, bias, SiluMul, row
// gather and the slot-ordered weighted sum of expert outputs, against host arithmetic.
TEST_F(OpenClTest, ElementwiseOpsMatchHostArithmetic) {
  const int64_t n = 3, width = 40, k = 2;
  const std::vector<float> a = RandomFloats(static_cast<size_t>(n * width), 21);
  const std::vector<float> b = RandomFloats(static_cast<size_t>(n * width), 22);
  const std::vector<float> bias = RandomFloats(static_cast<size_t>(width), 23);
  {
    Buffer dx = Upload(device(), a), dy = Upload(device(), b);
    ASSERT_TRUE(AddInPlace(device(), dx, dy, n * width).ok());
    std::vector<float> want = a;
    for (size_t i = 0; i < want.size(); ++i) want[i] += b[i];
    EXPECT_EQ(Download<float>(device(), dx, want.size()), want);
  }
  {
    Buffer dy = Upload(device(), a), db = Upload(device(), bias);
    ASSERT_TRUE(AddBias(device(), dy, db, n, width).ok());
    std::vector<float> want = a;
    model::AddBias(bias, n, want.data());
    EXPECT_EQ(Download<float>(device(), dy, want.size()), want);
  }
  {
    Buffer dg = Upload(device(), a), du = Upload(device(), b);
    ASSERT_TRUE(SiluMul(device(), dg, du, n * width).ok());
    std::vector<float> want(a.size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = model::Silu(a[i]) * b[i];
    EXPECT_LT(Nmse(Download<float>(device(), dg, want.size()), want), 1e-12);
  }
  {
    const std::vector<int32_t> idx = {2, 0, 2, 1};
    Buffer src = Upload(device(), a), di = Upload(device(), idx);
    Buffer dst = Alloc(device(), idx.size() * width * 4);
    ASSERT_TRUE(GatherRows(device(), src, n, di, 4, width, dst).ok());
    const std::vector<float> got = Download<float>(device(), dst, idx.size() * width);
    for (size_t r = 0; r < idx.size(); ++r) {
      for (int64_t i = 0; i < width; ++i) {
        ASSERT_EQ(got[r * width + static_cast<size_t>(i)], a[static_cast<size_t>(idx[r] * width + i)]);
      }
    }
  }
  {
    // Token 1's second slot is empty (expert -1): its first term alone.
    const std::vector<float> y = RandomFloats(static_cast<size_t>(n * k * width), 24);
    const std::vector<int32_t> experts = {0, 3, 5, -1, 2, 1};
    const std::vector<float> weights = {0.75f, 0.25f, 0.5f, 0.5f, 0.125f, 0.875f};
    Buffer dy = Upload(device(), y), de = Upload(device(), experts), dw = Upload(device(), weights);
    Buffer out = Alloc(device(), static_cast<size_t>(n * width) * 4);
    ASSERT_TRUE(MoeCombine(device(), dy, de, dw, n, static_cast<int>(k), width, out).ok());
    std::vector<float> want(static_cast<size_t>(n * width));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < width; ++i) {
        float o = 0;
        bool first = true;
        for (int64_t s2 = 0; s2 < k; ++s2) {
          const size_t p = static_cast<size_t>(t * k + s2);
          if (experts[p] < 0) continue;
          const float term = weights[p] * y[p * width + static_cast<size_t>(i)];
          o = first ? term : o + term;
          first = false;
        }
        want[static_cast<size_t>(t * width + i)] = o;
      }
    }
    EXPECT_EQ(Download<float>(device(), out, want.size()), want);
  }
}

// Which integer dot product path a test variant takes through software builtins:
// none (the baseline), cl_khr_integer_dot_product's, or cl_arm's arm_dot_acc.
enum class DotPolyfill { kNone, kKhr, kArm };

// A second handle on the test device with the given GEMV split and integer dot path;
// `subgroups`: the sub-group code with the work-group as the sub-group.
std::unique_ptr<Device> OpenVariant(const Device& base, int k_split, DotPolyfill dot,
                                    bool subgroups = false) {
  DeviceOptions options;
  options.allow_cpu = true;
  options.name_filter = base.info().name;
  options.disable_cache = true;
  options.has_variant = true;
  options.variant = base.variant();
  options.variant.int_dot_polyfill = dot == DotPolyfill::kKhr;
  options.variant.arm_dot_polyfill = dot == DotPolyfill::kArm;
  options.variant.subgroups_polyfill = subgroups;
  options.variant.gemv_k_split = k_split;
  absl::StatusOr<std::unique_ptr<Device>> d = Device::Open(options);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(d).value() : nullptr;
}

// The slow tests' variants, each opened once per test binary and kept: a variant's
// device builds its programs on first use with the program cache off (seconds each on
// PoCL), and the integer-dot tests run the same few variants for each format.
Device* SharedVariant(const Device& base, int k_split, DotPolyfill dot) {
  static auto* variants = new std::map<std::pair<int, DotPolyfill>, std::unique_ptr<Device>>();
  std::unique_ptr<Device>& slot = (*variants)[{k_split, dot}];
  if (slot == nullptr) slot = OpenVariant(base, k_split, dot);
  return slot.get();
}

// An argument of a probe kernel: a buffer or an int.
using ProbeArg = std::variant<cl_mem, cl_int>;

// Builds common.cl followed by `kernel_text` on `device`, runs its kernel `probe` with
// `args` as ONE work-item, and returns the first `n_out` ints of `out` (one of the
// args); empty when the program does not build.
std::vector<int> RunSingleItem(Device& device, const std::string& kernel_text,
                               std::initializer_list<ProbeArg> args, const Buffer& out,
                               size_t n_out) {
  absl::StatusOr<cl_program> program =
      device.programs().Build(std::string(*EmbeddedSource("common")) + kernel_text, "");
  EXPECT_TRUE(program.ok()) << program.status();
  if (!program.ok()) return {};
  cl_int err = CL_SUCCESS;
  cl_kernel kernel = clCreateKernel(*program, "probe", &err);
  EXPECT_EQ(err, CL_SUCCESS);
  cl_uint index = 0;
  for (const ProbeArg& arg : args) {
    std::visit(
        [&](const auto& value) {
          EXPECT_EQ(clSetKernelArg(kernel, index, sizeof(value), &value), CL_SUCCESS)
              << "arg " << index;
        },
        arg);
    ++index;
  }
  const size_t one = 1;
  EXPECT_EQ(
      clEnqueueNDRangeKernel(device.queue(), kernel, 1, nullptr, &one, &one, 0, nullptr, nullptr),
      CL_SUCCESS);
  std::vector<int> got = Download<int>(device, out, n_out);
  clReleaseKernel(kernel);
  return got;
}

// Runs common.cl's integer dot product helpers on `device`: out[0] = MOERT_INT_DOT, and
// with the path compiled in, out[1..] = moert_dot_acc_ss / _us of the probe inputs.
std::vector<int> ProbeIntDot(Device& device, const std::vector<uint32_t>& a,
                             const std::vector<uint32_t>& b, const std::vector<int>& acc) {
  const char* kernel_text = R"(
__kernel void probe(__global const uint* a, __global const uint* b, __global const int* acc,
                    int n, __global int* out) {
  out[0] = MOERT_INT_DOT;
#if MOERT_INT_DOT
  for (int i = 0; i < n; ++i) {
    out[1 + 2 * i] = moert_dot_acc_ss(a[i], b[i], acc[i]);
    out[2 + 2 * i] = moert_dot_acc_us(a[i], b[i], acc[i]);
  }
#endif
}
)";
  const Buffer da = Upload(device, a), db = Upload(device, b), dacc = Upload(device, acc);
  const Buffer out = Alloc(device, (1 + 2 * a.size()) * sizeof(int));
  return RunSingleItem(device, kernel_text,
                       {da.get(), db.get(), dacc.get(), static_cast<cl_int>(a.size()), out.get()},
                       out, 1 + 2 * a.size());
}

// The packed builtins' definition: acc + the 4 byte products, saturated to int32.
int RefDotAcc(uint32_t a, uint32_t b, int acc, bool a_unsigned) {
  int64_t sum = acc;
  for (int i = 0; i < 4; ++i) {
    const uint32_t ua = (a >> (8 * i)) & 0xff, ub = (b >> (8 * i)) & 0xff;
    const int64_t x = a_unsigned ? static_cast<int64_t>(ua) : static_cast<int8_t>(ua);
    sum += x * static_cast<int8_t>(ub);
  }
  return static_cast<int>(std::clamp<int64_t>(sum, INT32_MIN, INT32_MAX));
}

TEST_F(OpenClTest, IntDotPolyfillIsCompiledInAndFollowsTheBuiltins) {
  // The extremes of both signs, mixed bytes, and accumulators that saturate.
  const std::vector<uint32_t> a = {0x80808080u, 0x7f7f7f7fu, 0x01ff80f0u,
                                   0x0f0f0f0fu, 0x80808080u, 0x12345678u};
  const std::vector<uint32_t> b = {0x80808080u, 0x80808080u, 0x7f02ff10u,
                                   0x81817f7fu, 0x80808080u, 0x9abcdef0u};
  const std::vector<int> acc = {0, -5, 1000, -4096, INT32_MAX - 10, INT32_MIN + 3};
  const std::vector<int> base = ProbeIntDot(device(), a, b, acc);
  ASSERT_FALSE(base.empty());
  // PoCL lacks cl_khr_integer_dot_product: the default variant takes the baseline.
  if (!device().info().HasExtension("cl_khr_integer_dot_product")) {
    EXPECT_EQ(base[0], 0);
  }
  std::unique_ptr<Device> poly =
      OpenVariant(device(), device().variant().gemv_k_split, DotPolyfill::kKhr);
  ASSERT_NE(poly, nullptr);
  const std::vector<int> got = ProbeIntDot(*poly, a, b, acc);
  ASSERT_EQ(got.size(), 1 + 2 * a.size());
  ASSERT_EQ(got[0], 1) << "MOERT_CL_INT_DOT_POLYFILL did not select the integer dot path";
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(got[1 + 2 * i], RefDotAcc(a[i], b[i], acc[i], false)) << "ss " << i;
    EXPECT_EQ(got[2 + 2 * i], RefDotAcc(a[i], b[i], acc[i], true)) << "us " << i;
  }
}

// The khr and arm integer dot paths (through their polyfills) against the baseline.
// cl_arm's path: arm_dot_acc is signed x signed and does not saturate, so the unsigned
// operand may only hold bytes below 128 (W4's nibbles) and the sums stay in range.
TEST_F(OpenClTest, ArmDotPolyfillIsCompiledInAndServesBothForms) {
  const std::vector<uint32_t> a = {0x80808080u, 0x7f7f7f7fu, 0x01ff80f0u, 0x12345678u};
  const std::vector<uint32_t> b = {0x80808080u, 0x80808080u, 0x7f02ff10u, 0x9abcdef0u};
  const std::vector<int> acc = {0, -5, 1000, -4096};
  std::unique_ptr<Device> arm =
      OpenVariant(device(), device().variant().gemv_k_split, DotPolyfill::kArm);
  ASSERT_NE(arm, nullptr);
  EXPECT_NE(arm->variant().BuildOptions().find("-DMOERT_CL_ARM_DOT_POLYFILL=1"), std::string::npos);
  const std::vector<int> got = ProbeIntDot(*arm, a, b, acc);
  ASSERT_EQ(got.size(), 1 + 2 * a.size());
  ASSERT_EQ(got[0], 1) << "MOERT_CL_ARM_DOT_POLYFILL did not select the integer dot path";
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(got[1 + 2 * i], RefDotAcc(a[i], b[i], acc[i], false)) << "ss " << i;
    // The unsigned form: right exactly when a's bytes are below 128 (nibbles).
    const bool small = (a[i] & 0x80808080u) == 0;
    if (small) {
      EXPECT_EQ(got[2 + 2 * i], RefDotAcc(a[i], b[i], acc[i], true)) << "us " << i;
    }
  }
}

TEST_P(OpenClMatMulSlowTest, IntDotPathGivesTheBaselineBits) {
  const WeightFormat format = GetParam();
  for (const auto& [k_split, dot] :
       {std::pair{1, DotPolyfill::kKhr}, {4, DotPolyfill::kKhr}, {1, DotPolyfill::kArm}}) {
    // The same GEMV split on both sides: only the integer path differs.
    Device* base = SharedVariant(device(), k_split, DotPolyfill::kNone);
    Device* poly = SharedVariant(device(), k_split, dot);
    ASSERT_NE(base, nullptr);
    ASSERT_NE(poly, nullptr);
    for (int64_t rows : {1, 13, 100}) {
      for (int64_t cols : {32, 96, 512}) {
        const PackedMatrix w =
            MakePacked(format, 2, rows, cols, static_cast<uint32_t>(3 * rows + cols));
        DeviceMatrix dw_base = DeviceMatrix::Upload(*base, w).value();
        DeviceMatrix dw_poly = DeviceMatrix::Upload(*poly, w).value();
        for (int64_t n : {1, 3, 5}) {
          const std::vector<float> x = RandomFloats(static_cast<size_t>(n * cols), 9);
          const A8Pair a_base = QuantizeBoth(*base, x, n, cols);
          const A8Pair a_poly = QuantizeBoth(*poly, x, n, cols);
          const size_t count = static_cast<size_t>(n * rows);
          Buffer y_base = Alloc(*base, count * 4);
          Buffer y_poly = Alloc(*poly, count * 4);
          for (int64_t g = 0; g < 2; ++g) {
            ASSERT_TRUE(QMatMul(*base, dw_base.ref, g, a_base.device, n, y_base).ok());
            ASSERT_TRUE(QMatMul(*poly, dw_poly.ref, g, a_poly.device, n, y_poly).ok());
            const std::vector<float> want = Download<float>(*base, y_base, count);
            const std::vector<float> got = Download<float>(*poly, y_poly, count);
            const std::vector<float> cpu = CpuMatMul(w, g, a_base.cpu);
            for (size_t i = 0; i < count; ++i) {
              ASSERT_EQ(got[i], want[i]) << rows << "x" << cols << " n=" << n << " group " << g
                                         << " k_split " << k_split << " at " << i;
              // One work-item per row, or the GEMM: also the CPU kernels' bits.
              if (k_split == 1 || n > 1) {
                ASSERT_EQ(got[i], cpu[i]) << "vs CPU at " << i;
              }
            }
          }
        }
      }
    }
  }
}

// The value of common.cl's macro `name` as `device` compiles it.
int ProbeMacro(Device& device, const std::string& name) {
  const Buffer out = Alloc(device, sizeof(int));
  const std::vector<int> got =
      RunSingleItem(device, "\n__kernel void probe(__global int* out) { out[0] = " + name + "; }\n",
                    {out.get()}, out, 1);
  return got.empty() ? -1 : got[0];
}

// Split-K GEMV summed by sub-group reductions (the polyfill: the work-group is the
// sub-group, so each row is one reduction of many, the other rows adding 0): as close
// to the CPU as the local-memory split, and with the integer dot path the same bits.
TEST_P(OpenClMatMulTest, SubgroupSplitKGemvMatchesCpu) {
  const WeightFormat format = GetParam();
  std::unique_ptr<Device> sg = OpenVariant(device(), 4, DotPolyfill::kNone, true);
  std::unique_ptr<Device> sg_dot = OpenVariant(device(), 4, DotPolyfill::kKhr, true);
  ASSERT_NE(sg, nullptr);
  ASSERT_NE(sg_dot, nullptr);
  ASSERT_EQ(ProbeMacro(*sg, "MOERT_SUBGROUPS"), 1);
  if (!device().variant().use_subgroups) {
    EXPECT_EQ(ProbeMacro(device(), "MOERT_SUBGROUPS"), 0);
  }
  for (int64_t rows : {1, 13, 100}) {
    for (int64_t cols : {32, 96, 512}) {
      const PackedMatrix w =
          MakePacked(format, 2, rows, cols, static_cast<uint32_t>(rows + 5 * cols));
      DeviceMatrix dw = DeviceMatrix::Upload(*sg, w).value();
      DeviceMatrix dw_dot = DeviceMatrix::Upload(*sg_dot, w).value();
      const std::vector<float> x = RandomFloats(static_cast<size_t>(cols), 13);
      const A8Pair a = QuantizeBoth(*sg, x, 1, cols);
      const A8Pair a_dot = QuantizeBoth(*sg_dot, x, 1, cols);
      Buffer y = Alloc(*sg, static_cast<size_t>(rows) * 4);
      Buffer y_dot = Alloc(*sg_dot, static_cast<size_t>(rows) * 4);
      for (int64_t g = 0; g < 2; ++g) {
        ASSERT_TRUE(QMatMul(*sg, dw.ref, g, a.device, 1, y).ok());
        ASSERT_TRUE(QMatMul(*sg_dot, dw_dot.ref, g, a_dot.device, 1, y_dot).ok());
        const std::vector<float> got = Download<float>(*sg, y, static_cast<size_t>(rows));
        const std::vector<float> got_dot =
            Download<float>(*sg_dot, y_dot, static_cast<size_t>(rows));
        EXPECT_LT(Nmse(got, CpuMatMul(w, g, a.cpu)), 1e-10)
            << rows << "x" << cols << " group " << g;
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_EQ(got_dot[i], got[i]) << rows << "x" << cols << " group " << g << " at " << i;
        }
      }
    }
  }
}

TEST_F(OpenClSlowTest, IntDotPathFusedMoeGivesTheBaselineBits) {
  for (DotPolyfill dot : {DotPolyfill::kKhr, DotPolyfill::kArm}) {
    Device* poly = SharedVariant(device(), device().variant().gemv_k_split, dot);
    ASSERT_NE(poly, nullptr);
    for (WeightFormat format : {WeightFormat::kW4, WeightFormat::kW8}) {
      for (const auto& [n, k, routed] :
           {std::tuple<int64_t, int, bool>{1, 2, true}, {5, 3, true}, {4, 1, false}}) {
        const std::vector<float> want = CheckFusedMoe(device(), format, n, k, routed);
        const std::vector<float> got = CheckFusedMoe(*poly, format, n, k, routed);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_EQ(got[i], want[i]) << WeightFormatName(format) << " n=" << n << " k=" << k
                                     << " routed=" << routed
                                     << " arm " << (dot == DotPolyfill::kArm) << " at " << i;
        }
      }
    }
  }
}

TEST(OpenClStatusTest, ErrorCodesMapToStatusCodes) {
  EXPECT_TRUE(ClStatus(CL_SUCCESS, "x").ok());
  EXPECT_EQ(ClStatus(CL_OUT_OF_RESOURCES, "clEnqueueNDRangeKernel").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ClStatus(CL_DEVICE_NOT_AVAILABLE, "clFinish").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ClStatus(CL_INVALID_KERNEL_ARGS, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ClStatus(-9999, "clFinish").code(), absl::StatusCode::kUnavailable);
  const std::string m(ClStatus(CL_MEM_OBJECT_ALLOCATION_FAILURE, "clCreateBuffer").message());
  EXPECT_NE(m.find("clCreateBuffer"), std::string::npos);
  EXPECT_NE(m.find("CL_MEM_OBJECT_ALLOCATION_FAILURE"), std::string::npos);
}

TEST(OpenClVariantTest, VendorTilesAndExtensions) {
  DeviceInfo info;
  info.type = CL_DEVICE_TYPE_GPU;
  info.max_work_group_size = 1024;
  info.vendor_kind = Vendor::kAdreno;
  info.extensions = "cl_khr_fp16 cl_qcom_reqd_sub_group_size cl_khr_subgroups";
  KernelVariant v = DefaultVariant(info);
  EXPECT_TRUE(v.use_fp16);
  EXPECT_FALSE(v.use_subgroups);  // off until it has run on real sub-groups
  EXPECT_TRUE(v.use_qcom_subgroup_size);
  EXPECT_FALSE(v.use_int_dot);
  EXPECT_EQ(v.gemv_k_split, 8);
  info.vendor_kind = Vendor::kMali;
  info.extensions = "cl_khr_integer_dot_product";
  v = DefaultVariant(info);
  EXPECT_TRUE(v.use_int_dot);
  EXPECT_FALSE(v.use_fp16);
  EXPECT_EQ(v.gemv_k_split, 4);
  EXPECT_NE(v.BuildOptions().find("-DMOERT_CL_INT_DOT=1"), std::string::npos);
  EXPECT_FALSE(v.use_arm_dot);
  // A Mali driver with only Arm's extension takes the arm_dot_acc path; with both, khr.
  info.extensions = "cl_arm_integer_dot_product_int8 cl_arm_integer_dot_product_accumulate_int8";
  v = DefaultVariant(info);
  EXPECT_TRUE(v.use_arm_dot);
  EXPECT_FALSE(v.use_int_dot);
  EXPECT_NE(v.BuildOptions().find("-DMOERT_CL_ARM_DOT=1"), std::string::npos);
  info.extensions = "cl_khr_integer_dot_product cl_arm_integer_dot_product_accumulate_int8";
  v = DefaultVariant(info);
  EXPECT_TRUE(v.use_int_dot);
  EXPECT_FALSE(v.use_arm_dot);
  // The polyfills are for tests: never chosen for a device, and passed when asked for.
  EXPECT_FALSE(v.int_dot_polyfill);
  EXPECT_FALSE(v.subgroups_polyfill);
  EXPECT_FALSE(v.arm_dot_polyfill);
  EXPECT_EQ(v.BuildOptions().find("POLYFILL"), std::string::npos);
  v.int_dot_polyfill = true;
  v.subgroups_polyfill = true;
  EXPECT_NE(v.BuildOptions().find("-DMOERT_CL_INT_DOT_POLYFILL=1"), std::string::npos);
  EXPECT_NE(v.BuildOptions().find("-DMOERT_CL_SUBGROUPS_POLYFILL=1"), std::string::npos);
  // A CPU device: one work-item per row (the CPU kernels' exact order); a tiny maximum
  // work-group size caps every tile.
  info.vendor_kind = Vendor::kOther;
  info.type = CL_DEVICE_TYPE_CPU;
  info.max_work_group_size = 16;
  v = DefaultVariant(info);
  EXPECT_EQ(v.gemv_k_split, 1);
  EXPECT_LE(v.row_wg, 16u);
}

}  // namespace
}  // namespace moert::backend::opencl
