// KV cache types (backend/kv_type.h) on the CPU: the names llama.cpp's flags use, the
// bytes a row takes, StoreKv's rows against ggml's formulas written out here
// (quantize_row_q8_0_ref and dequantize_row_q8_0 of ggml-quants.c, the project's fp16
// rounding), attention over typed caches against attention over their widened fp32
// copies (the same bits: the kernels widen a row, then run the fp32 arithmetic), the
// widths and combinations refused, and a device's StoreKv / typed attention placed on
// the CPU by the fallback backend. The conformance suite compares other backends with
// the CPU on the same ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu_fallback.h"
#include "backend/fake_backend.h"
#include "backend/kv_type.h"
#include "core/fp16.h"
#include "core/strings.h"

namespace moert::backend {
namespace {

using Floats = std::vector<float>;
using Bytes = std::vector<uint8_t>;

Floats Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  Floats v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// --- ggml's formulas, written out plainly.

// ggml's block_q8_0 (ggml-common.h): ggml_half d, then int8_t qs[32].
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == kQ8_0BlockBytes, "block_q8_0 is 34 bytes");

// quantize_row_q8_0_ref: amax = MAX(amax, fabsf(v)); d = amax / ((1 << 7) - 1);
// id = d ? 1.0f/d : 0.0f; y.d = GGML_FP32_TO_FP16(d); qs[j] = roundf(x[j] * id).
Bytes GgmlQuantizeQ8_0(const Floats& x) {
  Bytes out(x.size() / 32 * sizeof(BlockQ8_0));
  for (size_t i = 0; i < x.size() / 32; ++i) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[i * 32 + j]));
    const float d = amax / ((1 << 7) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    BlockQ8_0 y;
    y.d = core::FloatToFp16(d);
    for (int j = 0; j < 32; ++j) y.qs[j] = static_cast<int8_t>(roundf(x[i * 32 + j] * id));
    std::memcpy(out.data() + i * sizeof(y), &y, sizeof(y));
  }
  return out;
}

// dequantize_row_q8_0: y[j] = qs[j] * GGML_FP16_TO_FP32(d).
Floats GgmlDequantizeQ8_0(const Bytes& blocks) {
  Floats out;
  for (size_t i = 0; i < blocks.size() / sizeof(BlockQ8_0); ++i) {
    BlockQ8_0 b;
    std::memcpy(&b, blocks.data() + i * sizeof(b), sizeof(b));
    const float d = core::Fp16ToFloat(b.d);
    for (int j = 0; j < 32; ++j) out.push_back(b.qs[j] * d);
  }
  return out;
}

// A cache of `type` as ggml stores `x` (rows of any width: the formulas are per
// value or per block of 32), and the floats it holds.
Bytes GgmlStore(KvType type, const Floats& x) {
  Bytes out;
  switch (type) {
    case KvType::kF32:
      out.resize(x.size() * 4);
      std::memcpy(out.data(), x.data(), out.size());
      break;
    case KvType::kF16:
      for (float v : x) {
        const uint16_t h = core::FloatToFp16(v);
        out.push_back(static_cast<uint8_t>(h & 0xFF));
        out.push_back(static_cast<uint8_t>(h >> 8));
      }
      break;
    case KvType::kQ8_0:
      out = GgmlQuantizeQ8_0(x);
      break;
  }
  return out;
}

Floats GgmlWiden(KvType type, const Floats& x) {
  const Bytes stored = GgmlStore(type, x);
  if (type == KvType::kQ8_0) return GgmlDequantizeQ8_0(stored);
  Floats out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    out[i] = type == KvType::kF32 ? x[i] : core::Fp16ToFloat(core::FloatToFp16(x[i]));
  }
  return out;
}

// --- Running ops on a backend.

template <typename T>
std::unique_ptr<Buffer> Upload(Backend& b, const std::vector<T>& v, size_t at = 0) {
  const size_t bytes = at + v.size() * sizeof(T);
  absl::StatusOr<std::unique_ptr<Buffer>> buffer = b.Allocate(std::max<size_t>(bytes, 4));
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  if (!buffer.ok()) return nullptr;
  if (!v.empty()) {
    EXPECT_TRUE(b.Write(TensorRef(*buffer, at), v.data(), bytes - at).ok());
  }
  return std::move(*buffer);
}

template <typename T>
std::vector<T> Download(Backend& b, TensorRef ref, size_t count) {
  std::vector<T> v(count);
  const absl::Status s = b.Read(ref, v.data(), count * sizeof(T));
  EXPECT_TRUE(s.ok()) << s;
  return v;
}

// StoreKv of n_rows rows of width from x into a cache `at` bytes into a buffer filled
// with 0xA5: the status and every byte of that buffer.
struct Stored {
  absl::Status status;
  Bytes bytes;
};
Stored StoreKv(Backend& b, KvType type, const Floats& x, int64_t n_rows, int64_t width,
               size_t cache_bytes, size_t at = 0) {
  std::unique_ptr<Buffer> xb = Upload(b, x);
  std::unique_ptr<Buffer> cb = Upload(b, Bytes(at + cache_bytes + 8, 0xA5));
  Stored s;
  s.status = b.StoreKv(type, xb, n_rows, width, TensorRef(cb, at));
  s.bytes = Download<uint8_t>(b, cb, at + cache_bytes + 8);
  return s;
}

struct Shape {
  int n_head, n_head_kv, dk, dv;
  int64_t pos0, n;
  int64_t n_kv = 0;  // > 0: FullAttention / AttentionEntropy over n_kv keys

  int64_t keys() const { return n_kv > 0 ? n_kv : pos0 + n; }
  int64_t k_width() const { return int64_t{n_head_kv} * dk; }
  int64_t v_width() const { return int64_t{n_head_kv} * dv; }
  AttentionArgs Args(KvType k_type, KvType v_type) const {
    AttentionArgs a{n_head, n_head_kv, dk, dv, 1.0f / std::sqrt(static_cast<float>(dk)), false};
    a.k_type = k_type;
    a.v_type = v_type;
    return a;
  }
  std::string Describe() const {
    return StrCat(n_head, "/", n_head_kv, " heads of ", dk, "/", dv, ", pos0 ", pos0, ", n ", n,
                  n_kv > 0 ? StrCat(", ", n_kv, " keys unmasked") : std::string());
  }
};

enum class Kind { kCausal, kFull, kEntropy };

// One attention op over caches holding the bytes k and v.
absl::StatusOr<Floats> Attend(Backend& b, Kind kind, const Shape& s, const AttentionArgs& args,
                              const Floats& q, const Bytes& k, const Bytes& v) {
  // Typed rows need no alignment: they sit 3 bytes into their buffer.
  const size_t at = args.key_type() == KvType::kF32 ? 0 : 3;
  std::unique_ptr<Buffer> qb = Upload(b, q);
  std::unique_ptr<Buffer> kb = Upload(b, k, at);
  std::unique_ptr<Buffer> vb = Upload(b, v);
  const size_t count = static_cast<size_t>(s.n * s.n_head * (kind == Kind::kEntropy ? 1 : s.dv));
  std::unique_ptr<Buffer> out = Upload(b, Floats(count, std::nanf("")));
  const TensorRef keys(kb, at);
  absl::Status status;
  switch (kind) {
    case Kind::kCausal:
      status = b.Attention(args, qb, s.n, s.pos0, keys, vb, out);
      break;
    case Kind::kFull:
      status = b.FullAttention(args, qb, s.n, keys, vb, s.n_kv, out);
      break;
    case Kind::kEntropy:
      status = b.AttentionEntropy(args, qb, s.n, keys, s.n_kv, out);
      break;
  }
  if (!status.ok()) return status;
  return Download<float>(b, out, count);
}

::testing::AssertionResult SameBits(const Floats& got, const Floats& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << got.size() << " values, want " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], 4) != 0) {
      return ::testing::AssertionFailure() << "at " << i << ": " << got[i] << " vs " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// --- Names and sizes.

TEST(KvTypeTest, NamesAreLlamaCppsAndParseBack) {
  EXPECT_EQ(KvTypeName(KvType::kF32), "f32");
  EXPECT_EQ(KvTypeName(KvType::kF16), "f16");
  EXPECT_EQ(KvTypeName(KvType::kQ8_0), "q8_0");
  for (KvType type : kAllKvTypes) {
    absl::StatusOr<KvType> parsed = ParseKvType(KvTypeName(type));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, type);
  }
  for (const char* bad : {"q8", "F16", "q4_0", "bf16", ""}) {
    absl::StatusOr<KvType> parsed = ParseKvType(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    const std::string message(parsed.status().message());
    EXPECT_NE(message.find(StrCat("'", bad, "'")), std::string::npos) << message;
    EXPECT_NE(message.find("f32, f16 or q8_0"), std::string::npos) << message;
  }
}

TEST(KvTypeTest, RowBytes) {
  EXPECT_EQ(*KvRowBytes(KvType::kF32, 96), 384u);
  EXPECT_EQ(*KvRowBytes(KvType::kF16, 96), 192u);
  EXPECT_EQ(*KvRowBytes(KvType::kQ8_0, 96), 102u);  // 3 blocks of 34
  EXPECT_EQ(*KvRowBytes(KvType::kQ8_0, 1024), 1088u);
  EXPECT_EQ(*KvRowBytes(KvType::kF16, 7), 14u);
  absl::StatusOr<size_t> q8 = KvRowBytes(KvType::kQ8_0, 48);
  EXPECT_EQ(q8.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(q8.status().message()).find("48"), std::string::npos) << q8.status();
  for (KvType type : kAllKvTypes) {
    EXPECT_EQ(KvRowBytes(type, 0).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

// --- StoreKv.

// Random rows at several scales, an all-zero block, blocks whose largest magnitude is
// negative, halfway cases roundf takes away from zero (nearbyint would not), and values
// small enough that d is subnormal in half.
Floats EdgeRows(int64_t n_rows, int64_t width) {
  Floats x = Random(static_cast<size_t>(n_rows * width), 7, 2.0f);
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t i = 0; i < width; ++i)
      x[r * width + i] *= std::pow(4.0f, static_cast<float>(r % 5) - 2);
  }
  std::fill(x.begin(), x.begin() + 32, 0.0f);
  if (x.size() >= 128) {
    x[40] = -9.0f;  // block 1: amax from a negative value
    // Block 2: amax 127, so d = 1 and x * id is x: the halves -14.5 .. 15.5 round
    // away from zero.
    for (int j = 0; j < 32; ++j) x[64 + j] = static_cast<float>(j) - 15.5f;
    x[64] = -127.0f;
    // Block 3: amax 1e-4, so d is a subnormal half.
    x[96] = 1e-4f;
    for (int j = 1; j < 32; ++j) x[96 + j] = (j % 2 ? -1 : 1) * 1e-6f * static_cast<float>(j);
  }
  return x;
}

TEST(CpuStoreKvTest, RowsAreGgmlsBitForBit) {
  cpu::CpuBackend cpu(3);
  for (KvType type : kAllKvTypes) {
    // One row, a few, and enough rows of a wide cache to spread over the threads.
    for (const auto& [rows, width] :
         std::vector<std::pair<int64_t, int64_t>>{{1, 128}, {3, 96}, {5, 32}, {300, 256}}) {
      const std::string what = StrCat(KvTypeName(type), " ", rows, " rows of ", width);
      const Floats x = EdgeRows(rows, width);
      const Bytes want = GgmlStore(type, x);
      for (size_t at : {size_t{0}, size_t{4}, size_t{7}}) {
        if (type == KvType::kF32 && at % 4 != 0) continue;
        const Stored got = StoreKv(cpu, type, x, rows, width, want.size(), at);
        ASSERT_TRUE(got.status.ok()) << what << ": " << got.status;
        EXPECT_EQ(Bytes(got.bytes.begin() + at, got.bytes.end() - 8), want) << what << " at " << at;
        EXPECT_EQ(Bytes(got.bytes.begin(), got.bytes.begin() + at), Bytes(at, 0xA5)) << what;
        EXPECT_EQ(Bytes(got.bytes.end() - 8, got.bytes.end()), Bytes(8, 0xA5)) << what;
      }
    }
  }
}

TEST(CpuStoreKvTest, EdgeBlocksHoldWhatGgmlStores) {
  const Floats x = EdgeRows(1, 128);
  const Bytes q = GgmlQuantizeQ8_0(x);
  BlockQ8_0 b[4];
  std::memcpy(b, q.data(), sizeof(b));
  EXPECT_EQ(b[0].d, 0u);  // all zero: d 0, every q 0
  for (int8_t v : b[0].qs) EXPECT_EQ(v, 0);
  EXPECT_EQ(b[1].qs[8], -127);  // the negative amax
  EXPECT_EQ(b[1].d, core::FloatToFp16(9.0f / 127.0f));
  EXPECT_EQ(b[2].d, core::FloatToFp16(1.0f));
  EXPECT_EQ(b[2].qs[0], -127);
  EXPECT_EQ(b[2].qs[1], -15);  // -14.5 away from zero
  EXPECT_EQ(b[2].qs[31], 16);  // 15.5 away from zero
  EXPECT_GT(b[3].d, 0u);       // a subnormal half
  EXPECT_LT(b[3].d, 0x0400u);
  // And the CPU stores the same.
  cpu::CpuBackend cpu(1);
  const Stored got = StoreKv(cpu, KvType::kQ8_0, x, 1, 128, q.size());
  ASSERT_TRUE(got.status.ok()) << got.status;
  EXPECT_EQ(Bytes(got.bytes.begin(), got.bytes.end() - 8), q);
  // f16 rows widen back to the values rounded to half, exactly.
  const Stored h = StoreKv(cpu, KvType::kF16, x, 1, 128, 256);
  ASSERT_TRUE(h.status.ok()) << h.status;
  for (size_t i = 0; i < x.size(); ++i) {
    uint16_t v;
    std::memcpy(&v, h.bytes.data() + 2 * i, 2);
    EXPECT_EQ(core::Fp16ToFloat(v), core::Fp16ToFloat(core::FloatToFp16(x[i]))) << i;
  }
}

TEST(CpuStoreKvTest, RefusesWidthsQ8_0CannotHoldAndCachesTooSmall) {
  cpu::CpuBackend cpu(1);
  const Floats x = Random(2 * 48, 8);
  const Stored q8 = StoreKv(cpu, KvType::kQ8_0, x, 2, 48, 128);
  EXPECT_EQ(q8.status.code(), absl::StatusCode::kInvalidArgument);
  const std::string message(q8.status.message());
  EXPECT_NE(message.find("48"), std::string::npos) << message;
  EXPECT_NE(message.find("store_kv"), std::string::npos) << message;
  EXPECT_EQ(q8.bytes, Bytes(136, 0xA5));  // nothing written
  std::unique_ptr<Buffer> xb = Upload(cpu, x);
  std::unique_ptr<Buffer> small = Upload(cpu, Bytes(60, 0));
  EXPECT_EQ(cpu.StoreKv(KvType::kQ8_0, xb, 2, 32, small).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(cpu.StoreKv(KvType::kF16, xb, -1, 32, small).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(cpu.StoreKv(KvType::kF16, xb, 0, 32, small).ok());
}

// --- Attention over typed caches.

const Shape kShapes[] = {
    {4, 2, 16, 16, 0, 5},       // prefill: a q8_0 block holds two KV heads
    {4, 2, 32, 16, 7, 1},       // decode, dk != dv
    {4, 1, 64, 32, 6, 3},       // MQA, a chunk after a cache
    {4, 2, 128, 128, 300, 2},   // a long cache
    {2, 2, 32, 32, 0, 10, 10},  // unmasked (a vision tower)
    {4, 2, 16, 32, 0, 3, 13},   // unmasked, few queries over more keys
};

// Attention over caches of any type pair is attention over those caches widened to
// fp32, bit for bit, on any thread count; FullAttention and AttentionEntropy too.
TEST(CpuTypedAttentionTest, IsAttentionOverTheWidenedCachesBitForBit) {
  cpu::CpuBackend one(1), three(3);
  for (const Shape& s : kShapes) {
    const Floats q = Random(static_cast<size_t>(s.n * s.n_head * s.dk), 11);
    const Floats k = Random(static_cast<size_t>(s.keys() * s.k_width()), 12);
    const Floats v = Random(static_cast<size_t>(s.keys() * s.v_width()), 13, 3.0f);
    for (KvType kt : kAllKvTypes) {
      for (KvType vt : kAllKvTypes) {
        const Bytes f32_k = GgmlStore(KvType::kF32, GgmlWiden(kt, k));
        const Bytes f32_v = GgmlStore(KvType::kF32, GgmlWiden(vt, v));
        for (Kind kind : {Kind::kCausal, Kind::kFull, Kind::kEntropy}) {
          if ((kind == Kind::kCausal) != (s.n_kv == 0)) continue;
          const std::string what =
              StrCat(s.Describe(), kind == Kind::kEntropy ? " entropy" : "", ", ", KvTypeName(kt),
                     " keys, ", KvTypeName(vt), " values");
          absl::StatusOr<Floats> want =
              Attend(one, kind, s, s.Args(KvType::kF32, KvType::kF32), q, f32_k, f32_v);
          ASSERT_TRUE(want.ok()) << what << ": " << want.status();
          for (cpu::CpuBackend* cpu : {&one, &three}) {
            absl::StatusOr<Floats> got =
                Attend(*cpu, kind, s, s.Args(kt, vt), q, GgmlStore(kt, k), GgmlStore(vt, v));
            ASSERT_TRUE(got.ok()) << what << ": " << got.status();
            EXPECT_TRUE(SameBits(*got, *want))
                << what << " on " << cpu->pool().threads() << " threads";
          }
        }
      }
    }
  }
}

// A prefill's queries (scored as an f32 GEMM over a copy of the keys, blocks of
// queries per task) get exactly the outputs that decoding them one at a time gives
// (scored in place, four keys at a time), for every cache type pair and thread count:
// more queries than a block, value widths that are and are not whole chunks of 32.
TEST(CpuTypedAttentionTest, PrefillIsTokenByTokenDecodeBitForBit) {
  cpu::CpuBackend one(1), three(3);
  const Shape shapes[] = {
      {4, 2, 48, 48, 5, 37},  // GQA, three query blocks after a cache, dv = 32 + 16
      {2, 2, 64, 64, 0, 20},  // MHA from position 0, dv a multiple of 32
      {4, 1, 32, 96, 3, 2},   // MQA, a short chunk
  };
  for (const Shape& s : shapes) {
    const Floats q = Random(static_cast<size_t>(s.n * s.n_head * s.dk), 31);
    const Floats k = Random(static_cast<size_t>(s.keys() * s.k_width()), 32);
    const Floats v = Random(static_cast<size_t>(s.keys() * s.v_width()), 33, 3.0f);
    for (KvType kt : kAllKvTypes) {
      for (KvType vt : kAllKvTypes) {
        const Bytes kb = GgmlStore(kt, k);
        const Bytes vb = GgmlStore(vt, v);
        const std::string what =
            StrCat(s.Describe(), ", ", KvTypeName(kt), " keys, ", KvTypeName(vt), " values");
        for (cpu::CpuBackend* cpu : {&one, &three}) {
          absl::StatusOr<Floats> prefill =
              Attend(*cpu, Kind::kCausal, s, s.Args(kt, vt), q, kb, vb);
          ASSERT_TRUE(prefill.ok()) << what << ": " << prefill.status();
          const size_t row = static_cast<size_t>(s.n_head * s.dv);
          const size_t q_row = static_cast<size_t>(s.n_head * s.dk);
          for (int64_t t = 0; t < s.n; ++t) {
            Shape step = s;
            step.pos0 = s.pos0 + t;
            step.n = 1;
            const Floats qt(q.begin() + static_cast<std::ptrdiff_t>(t * q_row),
                            q.begin() + static_cast<std::ptrdiff_t>((t + 1) * q_row));
            absl::StatusOr<Floats> decode =
                Attend(*cpu, Kind::kCausal, step, s.Args(kt, vt), qt, kb, vb);
            ASSERT_TRUE(decode.ok()) << what << ": " << decode.status();
            const Floats got(prefill->begin() + static_cast<std::ptrdiff_t>(t * row),
                             prefill->begin() + static_cast<std::ptrdiff_t>((t + 1) * row));
            EXPECT_TRUE(SameBits(got, *decode))
                << what << ", query " << t << " on " << cpu->pool().threads() << " threads";
          }
        }
      }
    }
  }
}

// kv_half (a device's StoreHalf rows) reads as f16 on both caches; it cannot be
// combined with another type.
TEST(CpuTypedAttentionTest, KvHalfIsF16) {
  cpu::CpuBackend cpu(2);
  const Shape s{4, 2, 16, 24, 6, 3};
  const Floats q = Random(static_cast<size_t>(s.n * s.n_head * s.dk), 21);
  const Bytes k = GgmlStore(KvType::kF16, Random(static_cast<size_t>(s.keys() * s.k_width()), 22));
  const Bytes v = GgmlStore(KvType::kF16, Random(static_cast<size_t>(s.keys() * s.v_width()), 23));
  AttentionArgs half = s.Args(KvType::kF32, KvType::kF32);
  half.kv_half = true;
  absl::StatusOr<Floats> got = Attend(cpu, Kind::kCausal, s, half, q, k, v);
  ASSERT_TRUE(got.ok()) << got.status();
  absl::StatusOr<Floats> want =
      Attend(cpu, Kind::kCausal, s, s.Args(KvType::kF16, KvType::kF16), q, k, v);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_TRUE(SameBits(*got, *want));
  half.v_type = KvType::kQ8_0;
  EXPECT_EQ(Attend(cpu, Kind::kCausal, s, half, q, k, v).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuTypedAttentionTest, RefusesQ8_0RowsNotOfWholeBlocks) {
  cpu::CpuBackend cpu(1);
  const Shape s{4, 2, 24, 32, 0, 2};  // keys 48 wide, values 64
  const Floats q = Random(static_cast<size_t>(s.n * s.n_head * s.dk), 31);
  const Bytes k(static_cast<size_t>(s.keys() * s.k_width()), 0);
  const Bytes v = GgmlStore(KvType::kQ8_0, Random(static_cast<size_t>(s.keys() * s.v_width()), 32));
  absl::StatusOr<Floats> got =
      Attend(cpu, Kind::kCausal, s, s.Args(KvType::kQ8_0, KvType::kQ8_0), q, k, v);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(got.status().message());
  EXPECT_NE(message.find("48"), std::string::npos) << message;
  EXPECT_NE(message.find("attention"), std::string::npos) << message;
  // The same keys as f16 are fine: only q8_0 needs whole blocks.
  EXPECT_TRUE(Attend(cpu, Kind::kCausal, s, s.Args(KvType::kF16, KvType::kQ8_0), q,
                     Bytes(static_cast<size_t>(s.keys() * s.k_width()) * 2, 0), v)
                  .ok());
}

// --- A device that lacks StoreKv or typed caches: the fallback runs them on the CPU.

TEST(CpuFallbackKvTest, StoreKvAndTypedAttentionTheDeviceLacksRunOnTheCpu) {
  cpu::CpuBackend cpu(2);
  for (bool device_stores : {false, true}) {
    std::set<Op> ops = {Op::kAttention, Op::kFullAttention, Op::kAttentionEntropy};
    if (device_stores) ops.insert(Op::kStoreKv);
    auto counts = std::make_shared<testing::FakeCounts>();
    CpuFallbackBackend b(std::make_unique<testing::FakeBackend>(ops, counts), cpu);
    EXPECT_FALSE(b.SupportsKv(KvType::kQ8_0));  // the fake says fp32 only
    const Shape s{4, 2, 32, 32, 6, 3};
    const Floats q = Random(static_cast<size_t>(s.n * s.n_head * s.dk), 41);
    const Floats k = Random(static_cast<size_t>(s.keys() * s.k_width()), 42);
    const Floats v = Random(static_cast<size_t>(s.keys() * s.v_width()), 43);
    const Bytes kq = GgmlStore(KvType::kQ8_0, k), vh = GgmlStore(KvType::kF16, v);

    const Stored stored = StoreKv(b, KvType::kQ8_0, k, s.keys(), s.k_width(), kq.size());
    ASSERT_TRUE(stored.status.ok()) << stored.status;
    EXPECT_EQ(Bytes(stored.bytes.begin(), stored.bytes.end() - 8), kq);
    EXPECT_EQ(counts->ops, device_stores ? 1u : 0u);
    EXPECT_EQ(b.cpu_ops(), device_stores ? 0u : 1u);

    const uint64_t cpu_ops = b.cpu_ops();
    const AttentionArgs typed = s.Args(KvType::kQ8_0, KvType::kF16);
    absl::StatusOr<Floats> got = Attend(b, Kind::kCausal, s, typed, q, kq, vh);
    ASSERT_TRUE(got.ok()) << got.status();
    absl::StatusOr<Floats> want = Attend(cpu, Kind::kCausal, s, typed, q, kq, vh);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_TRUE(SameBits(*got, *want));
    EXPECT_EQ(b.cpu_ops(), cpu_ops + 1);

    // fp32 caches stay on the device.
    const uint64_t device_ops = counts->ops;
    const AttentionArgs f32 = s.Args(KvType::kF32, KvType::kF32);
    ASSERT_TRUE(
        Attend(b, Kind::kCausal, s, f32, q, GgmlStore(KvType::kF32, k), GgmlStore(KvType::kF32, v))
            .ok());
    EXPECT_EQ(counts->ops, device_ops + 1);
    EXPECT_EQ(b.cpu_ops(), cpu_ops + 1);
  }
}

}  // namespace
}  // namespace moert::backend
