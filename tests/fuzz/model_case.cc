// The model fuzzer's input format (model_case.h). An input is a fixed header, then
// mutation records until it ends:
//
//   header (27 bytes)   architecture, two option bytes, 12 shape bytes (widths, heads,
//                       layers, experts, vocabulary, context), 3 type bytes (matrices,
//                       experts, vectors), 6 prompt bytes, the decode token, the KV
//                       cache size, the prompt length
//   records             an op byte and its operands: set a metadata key to a value of
//                       some type, remove a key, set or drop a tensor dim, change a
//                       tensor's type, remove a tensor, give it raw (NaN-capable) data,
//                       add a tensor
//
// Widths come from a table of small sizes, so that most inputs stay below the data
// cap; metadata values and dims come from a table of edge values (0, 1, powers of two
// and their neighbours, 2^32, 2^64 - 1) or from 8 raw bytes.
#include "model_case.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "format/arch.h"
#include "format/ggml_types.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "format/quantize.h"

namespace moert::fuzz {
namespace {

using format::ArchInfo;
using format::ArchKey;
using format::ArchKeyName;
using format::GgmlType;
using format::GgufValueType;
using format::GgufWriter;
using format::TensorBiasName;
using format::TensorKind;
using format::TensorWeightName;

// Reads the input front to back; past the end every read is 0.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  bool empty() const { return pos_ >= bytes_.size(); }
  uint8_t U8() { return pos_ < bytes_.size() ? bytes_[pos_++] : 0; }
  uint16_t U16() {
    const uint16_t lo = U8();
    return static_cast<uint16_t>(lo | (U8() << 8));
  }
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{U8()} << (8 * i);
    return v;
  }

 private:
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
};

// clang-format off
constexpr uint64_t kEdgeValues[] = {
    0, 1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 96, 127, 128, 255, 256, 257,
    511, 512, 1024, 4095, 4096, 4097, 65535, 65536, uint64_t{1} << 20, (uint64_t{1} << 20) + 1,
    uint64_t{1} << 24, (uint64_t{1} << 24) + 1, uint64_t{1} << 31, 0xffffffffu, uint64_t{1} << 32,
    uint64_t{1} << 62, ~uint64_t{0}};
// clang-format on

// An edge value, or for a byte past the table 8 raw bytes.
uint64_t EdgeValue(Reader& r) {
  const uint8_t b = r.U8();
  return b < std::size(kEdgeValues) ? kEdgeValues[b] : r.U64();
}

// clang-format off
constexpr double kEdgeFloats[] = {
    0.0, -0.0, 1.0, -1.0, 1e-6, 1e-5, 0.5, 2.0, 1e4, 1e6, 1e30, 3.4e38, 1e300,
    std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
    std::numeric_limits<double>::quiet_NaN(), 1e-45, 1e-320, -1e-5};
// clang-format on

double EdgeFloat(Reader& r) {
  const uint8_t b = r.U8();
  return b < std::size(kEdgeFloats) ? kEdgeFloats[b] : std::bit_cast<double>(r.U64());
}

constexpr std::string_view kEdgeStrings[] = {"llama", "qwen2moe", "none", "linear", "yarn",
                                             "",      "olmoe",    "x",    "\xff"};

// The sizes a shape byte picks (0: the default).
constexpr uint32_t kSizes[] = {1,  2,  3,  4,  5,  6,  7,  8,   12, 16,
                               24, 31, 32, 33, 48, 64, 96, 128, 256};

uint32_t Size(Reader& r, uint32_t fallback) {
  const uint8_t b = r.U8();
  return b == 0 ? fallback : kSizes[(b - 1) % std::size(kSizes)];
}

constexpr GgmlType kTypes[] = {
    GgmlType::kF32,     GgmlType::kF16,       GgmlType::kBF16,    GgmlType::kQ4_0,
    GgmlType::kQ4_1,    GgmlType::kQ5_0,      GgmlType::kQ5_1,    GgmlType::kQ8_0,
    GgmlType::kQ8_1,    GgmlType::kQ2_K,      GgmlType::kQ3_K,    GgmlType::kQ4_K,
    GgmlType::kQ5_K,    GgmlType::kQ6_K,      GgmlType::kQ8_K,    GgmlType::kIQ4_NL,
    GgmlType::kI8,      GgmlType::kF64,       GgmlType::kMoertW4, GgmlType::kMoertW4M,
    GgmlType::kMoertW8, GgmlType::kMoertW4S24};

GgmlType Type(uint8_t b, GgmlType fallback) {
  return b == 0 ? fallback : kTypes[(b - 1) % std::size(kTypes)];
}

// The tensor kinds in TensorKind's order (the add op picks one).
constexpr TensorKind kKinds[] = {
    TensorKind::kTokenEmbd,   TensorKind::kOutputNorm,      TensorKind::kOutput,
    TensorKind::kRopeFreqs,   TensorKind::kAttnNorm,        TensorKind::kAttnQ,
    TensorKind::kAttnK,       TensorKind::kAttnV,           TensorKind::kAttnOut,
    TensorKind::kAttnQNorm,   TensorKind::kAttnKNorm,       TensorKind::kFfnNorm,
    TensorKind::kFfnGate,     TensorKind::kFfnUp,           TensorKind::kFfnDown,
    TensorKind::kFfnGateInp,  TensorKind::kFfnGateExps,     TensorKind::kFfnUpExps,
    TensorKind::kFfnDownExps, TensorKind::kFfnGateInpShexp, TensorKind::kFfnGateShexp,
    TensorKind::kFfnUpShexp,  TensorKind::kFfnDownShexp};

constexpr ArchKey kArchKeys[] = {ArchKey::kContextLength,
                                 ArchKey::kEmbeddingLength,
                                 ArchKey::kBlockCount,
                                 ArchKey::kFeedForwardLength,
                                 ArchKey::kHeadCount,
                                 ArchKey::kHeadCountKv,
                                 ArchKey::kKeyLength,
                                 ArchKey::kValueLength,
                                 ArchKey::kRmsEpsilon,
                                 ArchKey::kRopeFreqBase,
                                 ArchKey::kRopeDimensionCount,
                                 ArchKey::kRopeScalingType,
                                 ArchKey::kRopeScalingFactor,
                                 ArchKey::kRopeScalingOrigContext,
                                 ArchKey::kExpertCount,
                                 ArchKey::kExpertUsedCount,
                                 ArchKey::kExpertFeedForwardLength,
                                 ArchKey::kExpertSharedFeedForwardLength,
                                 ArchKey::kExpertWeightsNorm,
                                 ArchKey::kVocabSize};

constexpr std::string_view kOtherKeys[] = {"general.architecture", "general.alignment",
                                           "moert.modality_bias",  "moert.router.modality_bias",
                                           "moert.expert_xxh64",   "tokenizer.ggml.tokens"};

void AppendLe(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

enum class Role { kVector, kBias, kMatrix, kEmbedding };

struct Tensor {
  std::string name;
  std::vector<uint64_t> dims;
  GgmlType type;
  Role role;
  bool raw = false;  // unmasked pseudo-random bytes: NaN and infinite scales included
  uint8_t seed = 0;
};

// The shape the tensors are planned from; the metadata says the same unless mutated.
struct Shape {
  uint32_t n_embd = 64, n_head = 4, n_head_kv = 2, head_dim = 0, head_dim_v = 0;
  uint32_t n_layer = 2, n_expert = 4, n_used = 2, n_ff = 64, n_ff_shexp = 32;
  uint32_t n_vocab = 40, n_ctx = 64;
};

class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint32_t Next() {
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state_ >> 32);
  }
  float Uniform() { return static_cast<float>(Next() >> 8) / 8388608.0f - 1.0f; }  // [-1, 1)

 private:
  uint64_t state_;
};

// The tensor's bytes: values quantized to its type where moert can quantize it, else
// pseudo-random bytes with bit 6 of each byte clear, so that no f16 or f32 scale they
// hold is infinite or NaN; with `raw`, the bytes unmasked. Seeded by the name.
std::vector<uint8_t> MakeTensorData(const Tensor& t, uint64_t n, uint64_t bytes) {
  uint64_t seed = t.seed;
  for (char ch : t.name) seed = seed * 131 + static_cast<uint8_t>(ch);
  Random rng(seed);
  std::vector<uint8_t> out(bytes);
  if (!t.raw && format::CanQuantize(t.type)) {
    std::vector<float> values(n);
    const float scale = 1.0f / std::sqrt(static_cast<float>(std::max<uint64_t>(t.dims[0], 1)));
    for (float& v : values) {
      const float u = rng.Uniform();
      switch (t.role) {
        case Role::kVector:
          v = 1.0f + 0.2f * u;
          break;
        case Role::kBias:
          v = 0.1f * u;
          break;
        case Role::kMatrix:
          v = scale * u;
          break;
        case Role::kEmbedding:
          v = u;
          break;
      }
    }
    if (format::Quantize(t.type, values, out).ok()) return out;
  }
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng.Next() >> 24) & (t.raw ? 0xFF : 0xBF);
  return out;
}

// MakeTensorData, remembered across inputs: most inputs share most of their tensors, and
// generating and quantizing them would otherwise be most of the fuzzer's time (and
// coverage of the quantizers, which are not what it is after).
const std::vector<uint8_t>& TensorData(const Tensor& t, uint64_t n, uint64_t bytes) {
  static auto* cache = new std::map<std::string, std::vector<uint8_t>>();
  static uint64_t cached_bytes = 0;
  std::string key = t.name;
  for (uint64_t v : t.dims) key += "," + std::to_string(v);
  key += "," + std::to_string(static_cast<uint32_t>(t.type)) + "," +
         std::to_string(static_cast<int>(t.role)) + "," + std::to_string(t.raw) + "," +
         std::to_string(t.seed);
  if (auto it = cache->find(key); it != cache->end()) return it->second;
  if (cached_bytes + bytes > (uint64_t{256} << 20)) {
    cache->clear();
    cached_bytes = 0;
  }
  cached_bytes += bytes;
  return cache->emplace(std::move(key), MakeTensorData(t, n, bytes)).first->second;
}

// Elements of `dims`, or nullopt past the data cap.
std::optional<uint64_t> Elements(const std::vector<uint64_t>& dims) {
  uint64_t n = 1;
  for (uint64_t d : dims) {
    if (d != 0 && n > kMaxTensorBytes / d) return std::nullopt;
    n *= d;
  }
  return n;
}

class Planner {
 public:
  Planner(const ArchInfo& arch, bool moe, const Shape& s, GgmlType matrix, GgmlType experts,
          GgmlType vectors)
      : arch_(arch), moe_(moe), s_(s), matrix_(matrix), experts_(experts), vectors_(vectors) {}

  std::vector<Tensor> Plan() {
    const uint64_t e = s_.n_embd, q = uint64_t{s_.n_head} * s_.head_dim;
    const uint64_t kv = uint64_t{s_.n_head_kv} * s_.head_dim;
    const uint64_t kvv = uint64_t{s_.n_head_kv} * s_.head_dim_v;
    const uint64_t o = uint64_t{s_.n_head} * s_.head_dim_v;
    Add(TensorWeightName(TensorKind::kTokenEmbd), {e, s_.n_vocab}, matrix_, Role::kEmbedding);
    Add(TensorWeightName(TensorKind::kOutputNorm), {e}, vectors_, Role::kVector);
    Add(TensorWeightName(TensorKind::kOutput), {e, s_.n_vocab}, matrix_, Role::kMatrix);
    for (int il = 0; il < static_cast<int>(s_.n_layer); ++il) {
      Vector(TensorKind::kAttnNorm, il, e);
      Matrix(TensorKind::kAttnQ, il, {e, q});
      Matrix(TensorKind::kAttnK, il, {e, kv});
      Matrix(TensorKind::kAttnV, il, {e, kvv});
      Matrix(TensorKind::kAttnOut, il, {o, e});
      if (arch_.qkv_bias) {
        Add(TensorBiasName(TensorKind::kAttnQ, il), {q}, vectors_, Role::kBias);
        Add(TensorBiasName(TensorKind::kAttnK, il), {kv}, vectors_, Role::kBias);
        Add(TensorBiasName(TensorKind::kAttnV, il), {kvv}, vectors_, Role::kBias);
      }
      if (arch_.qk_norm == format::QkNorm::kPerHead) {
        Vector(TensorKind::kAttnQNorm, il, s_.head_dim);
        Vector(TensorKind::kAttnKNorm, il, s_.head_dim);
      } else if (arch_.qk_norm == format::QkNorm::kFullWidth) {
        Vector(TensorKind::kAttnQNorm, il, q);
        Vector(TensorKind::kAttnKNorm, il, kv);
      }
      Vector(TensorKind::kFfnNorm, il, e);
      if (!moe_) {
        Matrix(TensorKind::kFfnGate, il, {e, s_.n_ff});
        Matrix(TensorKind::kFfnUp, il, {e, s_.n_ff});
        Matrix(TensorKind::kFfnDown, il, {s_.n_ff, e});
        continue;
      }
      Add(TensorWeightName(TensorKind::kFfnGateInp, il), {e, s_.n_expert}, GgmlType::kF32,
          Role::kMatrix);
      for (TensorKind kind : {TensorKind::kFfnGateExps, TensorKind::kFfnUpExps}) {
        Add(TensorWeightName(kind, il), {e, s_.n_ff, s_.n_expert}, experts_, Role::kMatrix);
      }
      Add(TensorWeightName(TensorKind::kFfnDownExps, il), {s_.n_ff, e, s_.n_expert}, experts_,
          Role::kMatrix);
      if (arch_.shared_expert) {
        Vector(TensorKind::kFfnGateInpShexp, il, e);
        Matrix(TensorKind::kFfnGateShexp, il, {e, s_.n_ff_shexp});
        Matrix(TensorKind::kFfnUpShexp, il, {e, s_.n_ff_shexp});
        Matrix(TensorKind::kFfnDownShexp, il, {s_.n_ff_shexp, e});
      }
    }
    return std::move(tensors_);
  }

 private:
  void Add(std::string name, std::vector<uint64_t> dims, GgmlType type, Role role) {
    tensors_.push_back(Tensor{std::move(name), std::move(dims), type, role});
  }
  void Vector(TensorKind kind, int layer, uint64_t n) {
    Add(TensorWeightName(kind, layer), {n}, vectors_, Role::kVector);
  }
  void Matrix(TensorKind kind, int layer, std::vector<uint64_t> dims) {
    Add(TensorWeightName(kind, layer), std::move(dims), matrix_, Role::kMatrix);
  }

  const ArchInfo& arch_;
  bool moe_;
  const Shape& s_;
  GgmlType matrix_, experts_, vectors_;
  std::vector<Tensor> tensors_;
};

// The metadata of a valid model of shape `s`, as llama.cpp's converters write it.
void DefaultMetadata(const ArchInfo& arch, bool moe, const Shape& s, GgufWriter& w) {
  auto key = [&](ArchKey k) { return ArchKeyName(arch, k); };
  w.SetString("general.architecture", arch.name);
  w.SetUint32(key(ArchKey::kContextLength), s.n_ctx);
  w.SetUint32(key(ArchKey::kEmbeddingLength), s.n_embd);
  w.SetUint32(key(ArchKey::kBlockCount), s.n_layer);
  w.SetUint32(key(ArchKey::kHeadCount), s.n_head);
  w.SetUint32(key(ArchKey::kHeadCountKv), s.n_head_kv);
  w.SetFloat32(key(ArchKey::kRmsEpsilon), 1e-5f);
  w.SetFloat32(key(ArchKey::kRopeFreqBase), 10000.0f);
  if (uint64_t{s.head_dim} * s.n_head != s.n_embd) {
    w.SetUint32(key(ArchKey::kKeyLength), s.head_dim);
  }
  if (s.head_dim_v != s.head_dim || uint64_t{s.head_dim} * s.n_head != s.n_embd) {
    w.SetUint32(key(ArchKey::kValueLength), s.head_dim_v);
  }
  if (s.head_dim % 2 != 0) w.SetUint32(key(ArchKey::kRopeDimensionCount), s.head_dim - 1);
  // Mixtral-style llama files give the expert width as feed_forward_length; qwen2moe
  // keeps its shared expert's there.
  w.SetUint32(key(ArchKey::kFeedForwardLength), moe && arch.shared_expert ? s.n_ff_shexp : s.n_ff);
  if (!moe) return;
  w.SetUint32(key(ArchKey::kExpertCount), s.n_expert);
  w.SetUint32(key(ArchKey::kExpertUsedCount), s.n_used);
  if (arch.arch != format::Arch::kLlama) {
    w.SetUint32(key(ArchKey::kExpertFeedForwardLength), s.n_ff);
  }
  if (arch.shared_expert) {
    w.SetUint32(key(ArchKey::kExpertSharedFeedForwardLength), s.n_ff_shexp);
  }
}

// Op 1: a key set to a value of the type the input picks.
void SetKey(Reader& r, const std::string& name, const Shape& s, GgufWriter& w) {
  const uint8_t t = r.U8() % 16;
  if (t < 12) {
    const std::string_view text = kEdgeStrings[t == 11 ? r.U8() % std::size(kEdgeStrings) : 0];
    const double f = t == 8 || t == 9 ? EdgeFloat(r) : 0;
    const uint64_t u = t < 8 || t == 10 ? EdgeValue(r) : 0;
    switch (t) {
      case 0:
        w.SetUint32(name, static_cast<uint32_t>(u));
        break;
      case 1:
        w.SetUint8(name, static_cast<uint8_t>(u));
        break;
      case 2:
        w.SetInt8(name, static_cast<int8_t>(u));
        break;
      case 3:
        w.SetUint16(name, static_cast<uint16_t>(u));
        break;
      case 4:
        w.SetInt16(name, static_cast<int16_t>(u));
        break;
      case 5:
        w.SetInt32(name, static_cast<int32_t>(u));
        break;
      case 6:
        w.SetUint64(name, u);
        break;
      case 7:
        w.SetInt64(name, static_cast<int64_t>(u));
        break;
      case 8:
        w.SetFloat32(name, static_cast<float>(f));
        break;
      case 9:
        w.SetFloat64(name, f);
        break;
      case 10:
        w.SetBool(name, u != 0);
        break;
      default:
        w.SetString(name, text);
        break;
    }
    return;
  }
  // Arrays: 0 elements means the natural length (per layer, per expert of each layer,
  // per token), else an edge length up to 4096.
  const uint8_t c = r.U8();
  const uint64_t per_layer_expert = uint64_t{s.n_layer} * std::max<uint32_t>(s.n_expert, 1);
  const uint64_t natural[] = {s.n_layer, per_layer_expert, per_layer_expert, s.n_vocab};
  const uint64_t count = c == 0 ? natural[t - 12] : std::min<uint64_t>(kEdgeValues[c % 29], 4096);
  const uint8_t odd_one = r.U8();  // nonzero: element odd_one % count differs
  auto odd = [&](uint64_t i) { return odd_one != 0 && i == odd_one % count; };
  std::vector<uint8_t> bytes;
  switch (t) {
    case 12: {  // int32 per layer
      const uint64_t v = EdgeValue(r);
      for (uint64_t i = 0; i < count; ++i) AppendLe(bytes, odd(i) ? v + 1 : v, 4);
      w.SetArray(name, GgufValueType::kInt32, count, bytes);
      break;
    }
    case 13: {  // float32 per layer and expert (the modality bias)
      const float v = static_cast<float>(EdgeFloat(r));
      const float other = static_cast<float>(EdgeFloat(r));
      for (uint64_t i = 0; i < count; ++i) {
        AppendLe(bytes, std::bit_cast<uint32_t>(odd(i) ? other : v), 4);
      }
      w.SetArray(name, GgufValueType::kFloat32, count, bytes);
      break;
    }
    case 14: {  // uint64 per layer and expert (checksums)
      const uint64_t v = EdgeValue(r);
      for (uint64_t i = 0; i < count; ++i) AppendLe(bytes, v + i, 8);
      w.SetArray(name, GgufValueType::kUint64, count, bytes);
      break;
    }
    default:  // strings per token
      w.SetStringArray(name, std::vector<std::string>(count, "t"));
      break;
  }
}

// Op 7: a tensor of any kind, at any layer up to n_layer, weight or bias.
void AddTensor(Reader& r, const Shape& s, std::vector<Tensor>& tensors) {
  const uint8_t k = r.U8();
  const TensorKind kind = kKinds[(k >> 1) % std::size(kKinds)];
  const int layer = r.U8() % (s.n_layer + 1);
  std::string name = (k & 1) ? TensorBiasName(kind, layer) : TensorWeightName(kind, layer);
  std::vector<uint64_t> dims(1 + r.U8() % 3);
  for (uint64_t& d : dims) d = Size(r, s.n_embd);
  std::erase_if(tensors, [&](const Tensor& t) { return t.name == name; });
  tensors.push_back(Tensor{std::move(name), std::move(dims), GgmlType::kF32, Role::kMatrix});
}

void Mutate(Reader& r, const ArchInfo& arch, const Shape& s, GgufWriter& w,
            std::vector<Tensor>& tensors) {
  while (!r.empty()) {
    const uint8_t op = r.U8() % 8;
    if (op == 1 || op == 2) {
      const uint8_t k = r.U8() % (std::size(kArchKeys) + std::size(kOtherKeys));
      const std::string name = k < std::size(kArchKeys)
                                   ? ArchKeyName(arch, kArchKeys[k])
                                   : std::string(kOtherKeys[k - std::size(kArchKeys)]);
      if (op == 1) {
        SetKey(r, name, s, w);
      } else {
        w.Remove(name);
      }
      continue;
    }
    if (op == 7) {
      AddTensor(r, s, tensors);
      continue;
    }
    if (op == 0 || tensors.empty()) continue;
    Tensor& t = tensors[r.U16() % tensors.size()];
    switch (op) {
      case 3: {  // a dim set (the ones up to it padded with 1) or, for 4, the last dropped
        const uint8_t d = r.U8() % 5;
        if (d == 4) {
          if (t.dims.size() > 1) t.dims.pop_back();
        } else {
          if (t.dims.size() <= d) t.dims.resize(d + 1, 1);
          t.dims[d] = EdgeValue(r);
        }
        break;
      }
      case 4:
        t.type = kTypes[r.U8() % std::size(kTypes)];
        break;
      case 5:
        tensors.erase(tensors.begin() + (&t - tensors.data()));
        break;
      case 6:
        t.raw = true;
        t.seed = r.U8();
        break;
      default:
        break;
    }
  }
}

}  // namespace

std::optional<ModelCase> BuildModelCase(std::span<const uint8_t> input) {
  Reader r(input);
  const std::span<const ArchInfo> archs = format::SupportedArchs();
  const uint8_t a = r.U8();
  const ArchInfo& arch = archs[a % archs.size()];
  const bool moe = arch.requires_experts || (arch.may_have_experts && (a / archs.size()) % 2 == 0);
  const uint8_t o1 = r.U8();
  const uint8_t o2 = r.U8();

  Shape s;
  s.n_embd = Size(r, s.n_embd);
  s.n_head = Size(r, s.n_head);
  s.n_head_kv = Size(r, s.n_head_kv);
  s.head_dim = Size(r, std::max<uint32_t>(s.n_embd / s.n_head, 1));
  s.head_dim_v = Size(r, s.head_dim);
  s.n_layer = Size(r, s.n_layer);
  s.n_expert = Size(r, s.n_expert);
  s.n_used = Size(r, s.n_used);
  s.n_ff = Size(r, s.n_ff);
  s.n_ff_shexp = Size(r, s.n_ff_shexp);
  s.n_vocab = Size(r, s.n_vocab);
  s.n_ctx = Size(r, s.n_ctx);
  const GgmlType matrix = Type(r.U8(), GgmlType::kQ8_0);
  const GgmlType experts = Type(r.U8(), matrix);
  const GgmlType vectors = Type(r.U8(), GgmlType::kF32);

  ModelCase c;
  uint8_t prompt[6];
  for (uint8_t& p : prompt) p = r.U8();
  // Token bytes: 255 is n_vocab and 254 an embedding position (both errors), else an id.
  auto token = [&](uint8_t b) -> int32_t {
    if (b == 255) return static_cast<int32_t>(s.n_vocab);
    if (b == 254) return model::kEmbeddingToken;
    return static_cast<int32_t>(b % s.n_vocab);
  };
  c.next_token = token(r.U8());
  const uint8_t ctx = r.U8();
  c.n_ctx = ctx == 0 ? 8 : (ctx - 1) % 10;
  const uint8_t length = r.U8();
  c.prompt.resize(length == 0 ? 2 : 1 + (length - 1) % std::size(prompt));
  for (size_t i = 0; i < c.prompt.size(); ++i) c.prompt[i] = token(prompt[i]);

  // Options byte 1: bits 0-1 the expert pool (none, a quarter, half, all of it),
  // bit 2 the fp32 reference path, 3 the scalar kernels, 4 prefetch, 5 every token's
  // logits, 6 the reference routing, 7 raw data in every tensor.
  model::ModelLoadOptions& opt = c.options;
  opt.threads = 1;
  constexpr double kFractions[] = {0, 0.25, 0.5, 1};
  opt.expert_pool_fraction = kFractions[o1 & 3];
  opt.quantized_kernels = (o1 & 4) == 0;
  if (o1 & 8) opt.isa = kernels::Isa::kScalar;
  opt.prefetch = (o1 & 16) != 0;
  c.logits = (o1 & 32) ? model::LogitsFor::kAll : model::LogitsFor::kLast;
  opt.reference_routing = (o1 & 64) != 0;
  const bool all_raw = (o1 & 128) != 0;
  // Options byte 2: bits 0-1 the loader's I/O, 2-3 a memory budget, 4-5 the router's
  // adjustments, 6 the KV positions the budget sets aside, 7 GGUF v2.
  constexpr experts::IoMode kIo[] = {experts::IoMode::kBuffered, experts::IoMode::kMmap,
                                     experts::IoMode::kDirect, experts::IoMode::kBuffered};
  opt.io_mode = kIo[o2 & 3];
  constexpr uint64_t kBudgets[] = {0, uint64_t{64} << 10, uint64_t{1} << 20, uint64_t{16} << 20};
  opt.memory_budget_bytes = kBudgets[(o2 >> 2) & 3];
  switch ((o2 >> 4) & 3) {
    case 1:
      opt.router.dynamic_k_p = 0.5f;
      break;
    case 2:
      opt.router.modality_lambda = 1;
      c.image_share = 1;
      break;
    case 3:
      opt.router.alpha = 0;
      break;
    default:
      break;
  }
  opt.kv_cache_positions = (o2 & 64) ? 16 : 0;
  c.on_disk = opt.expert_pool_fraction != 0 || opt.memory_budget_bytes != 0;

  GgufWriter w((o2 & 128) ? 2 : 3);
  DefaultMetadata(arch, moe, s, w);
  std::vector<Tensor> tensors = Planner(arch, moe, s, matrix, experts, vectors).Plan();
  if (all_raw) {
    for (Tensor& t : tensors) t.raw = true;
  }
  Mutate(r, arch, s, w, tensors);

  // Sizes first, so that a plan past the cap costs nothing to refuse.
  std::vector<std::pair<uint64_t, uint64_t>> sizes;  // elements, bytes
  uint64_t total = 0;
  for (Tensor& t : tensors) {
    const std::optional<uint64_t> n = Elements(t.dims);
    if (!n) return std::nullopt;
    uint64_t bytes = 0;
    if (!t.dims.empty() && t.dims[0] != 0 && *n != 0) {
      // Rows that are not whole blocks of the type cannot be written: such a tensor is f32.
      if (!format::GgmlRowBytes(t.type, t.dims[0])) t.type = GgmlType::kF32;
      bytes = *format::GgmlRowBytes(t.type, t.dims[0]) * (*n / t.dims[0]);
    }
    total += bytes;
    if (total > kMaxTensorBytes) return std::nullopt;
    sizes.emplace_back(*n, bytes);
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (!w.AddTensor(t.name, t.type, t.dims, TensorData(t, sizes[i].first, sizes[i].second)).ok()) {
      return std::nullopt;
    }
  }
  // A large general.alignment pads every tensor to it.
  if (w.FileSize() > 2 * kMaxTensorBytes + (uint64_t{1} << 20)) return std::nullopt;
  c.gguf = w.Serialize();
  return c;
}

}  // namespace moert::fuzz
