// Synthetic MoE models (synth.h): the shapes, the seeded weights, the vocabulary and
// the streaming writer behind moert-synth and moert-bench --synthetic.
#include "synth.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "core/strings.h"
#include "format/arch.h"
#include "format/ggml_types.h"
#include "format/gguf_writer.h"
#include "format/quantize.h"

namespace moert::synth {
namespace {

using format::Arch;
using format::ArchInfo;
using format::ArchKey;
using format::ArchKeyName;
using format::GgmlType;
using format::GgmlTypeName;
using format::GgufWriter;
using format::InfoOf;
using format::TensorBiasName;
using format::TensorKind;
using format::TensorWeightName;
using format::TraitsOf;

// The hyperparameters of the published models' config.json files.
constexpr std::array<Shape, 5> kShapes = {{
    // The oracle model's shape (tiny-moe-shakespeare).
    {"tiny", Arch::kLlama, 256, 4, 8, 4, 8, 2, 512, 0, 2048, 256, 10000.0f, 1e-5f},
    {"olmoe-1b-7b", Arch::kOlmoe, 2048, 16, 16, 16, 64, 8, 1024, 0, 50304, 4096, 10000.0f, 1e-5f},
    {"qwen15-moe-a27b", Arch::kQwen2Moe, 2048, 24, 16, 16, 60, 4, 1408, 5632, 151936, 8192,
     1000000.0f, 1e-6f},
    {"mixtral-8x7b", Arch::kLlama, 4096, 32, 32, 8, 8, 2, 14336, 0, 32000, 32768, 1000000.0f,
     1e-5f},
    // A MoE language model of the MiniCPM-V 2.6 oracle's width (Qwen2's 3584, its heads
    // and vocabulary size; ../shared/mmproj), small experts: images end to end on a MoE.
    {"minicpmv-moe", Arch::kQwen2Moe, 3584, 2, 28, 4, 8, 2, 256, 512, 394, 4096, 1000000.0f,
     1e-6f},
}};

constexpr GgmlType kTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ8_0,
                               GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                               GgmlType::kQ4_K, GgmlType::kQ6_K};

// llama_ftype of a model whose matrices are all `type` (general.file_type).
uint32_t FileType(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return 0;
    case GgmlType::kF16:
      return 1;
    case GgmlType::kQ4_0:
      return 2;
    case GgmlType::kQ4_1:
      return 3;
    case GgmlType::kQ8_0:
      return 7;
    case GgmlType::kQ5_0:
      return 8;
    case GgmlType::kQ5_1:
      return 9;
    case GgmlType::kQ4_K:
      return 14;  // Q4_K_S
    case GgmlType::kQ6_K:
      return 18;
    case GgmlType::kBF16:
      return 32;
    default:
      return 0;
  }
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// --- Random weights ----------------------------------------------------------------

// splitmix64's finalizer, a strong 64-bit mix: turns the seed and a tensor's name
// into the keys of its values.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t HashName(std::string_view name) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001B3ull;
  return h;
}

// Four 32-bit lanes: GCC and Clang vector extensions give SSE2 or NEON code with
// no ISA flags. Generating values is a third of the tool's time, quantizing the rest.
using U32x4 = uint32_t __attribute__((vector_size(16)));
using I32x4 = int32_t __attribute__((vector_size(16)));
using F32x4 = float __attribute__((vector_size(16)));

// Chris Wellons' lowbias32 integer hash.
U32x4 Hash32(U32x4 x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

// Values of a tensor with key `key`: element i is mean + std * u(i), u zero-mean,
// unit-variance and bounded (|u| < 3.5): the sum of four 16-bit uniforms
// (Irwin-Hall), close enough to normal for weights, from two hashes of i. Writes
// elements begin .. begin + out.size() - 1.
void FillValues(uint64_t key, uint64_t begin, float mean, float std, std::span<float> out) {
  // Each lane has variance (2^32 - 1) / 12; the sum's is four times that.
  const float scale = std / 37837.227f;
  const U32x4 lane = {0, 1, 2, 3};
  size_t j = 0;
  while (j < out.size()) {
    // Hashes take the low 32 bits of the index; the keys change every 2^32 values.
    const uint64_t index = begin + j;
    const uint64_t segment_keys = Mix(key ^ ((index >> 32) * 0xD1B54A32D192ED03ull));
    const uint32_t k1 = static_cast<uint32_t>(segment_keys);
    const uint32_t k2 = static_cast<uint32_t>(segment_keys >> 32);
    const size_t segment_end =
        std::min<uint64_t>(out.size(), j + ((uint64_t{1} << 32) - (index & 0xFFFFFFFFu)));
    for (; j < segment_end; j += 4) {
      const U32x4 i = static_cast<uint32_t>(begin + j) + lane;
      const U32x4 a = Hash32(i ^ k1);
      const U32x4 b = Hash32(i ^ k2);
      const U32x4 sum = (a & 0xFFFFu) + (a >> 16) + (b & 0xFFFFu) + (b >> 16);
      const I32x4 centred = reinterpret_cast<const I32x4&>(sum) - 131070;
      const F32x4 v = mean + __builtin_convertvector(centred, F32x4) * scale;
      std::memcpy(&out[j], &v, std::min<size_t>(4, segment_end - j) * sizeof(float));
    }
    j = segment_end;
  }
}

// --- The model's tensors -------------------------------------------------------------

// The type for a matrix whose rows have `row` values: `type`, or llama-quantize's
// fallback when the row is not a whole number of its blocks.
GgmlType MatrixType(GgmlType type, uint64_t row) {
  if (row % TraitsOf(type).block_elements == 0) return type;
  if (type == GgmlType::kQ4_K) return GgmlType::kQ5_0;
  if (type == GgmlType::kQ6_K) return GgmlType::kQ8_0;
  return type;  // every shape's rows are multiples of 32
}

std::vector<SynthTensor> PlanTensors(const Shape& s, uint32_t n_layer, GgmlType type) {
  const ArchInfo& arch = InfoOf(s.arch);
  const uint64_t embd = s.n_embd;
  const uint64_t head_dim = s.n_embd / s.n_head;
  const uint64_t q = s.n_head * head_dim;
  const uint64_t kv = s.n_head_kv * head_dim;
  std::vector<SynthTensor> plan;
  auto vec = [&](std::string name, uint64_t n, float mean, float std) {
    plan.push_back({std::move(name), {n}, GgmlType::kF32, mean, std});
  };
  // Projections: std 1/sqrt(fan_in) keeps activations at unit scale layer to layer.
  auto mat = [&](std::string name, std::vector<uint64_t> dims) {
    const float std = 1.0f / std::sqrt(static_cast<float>(dims[0]));
    const GgmlType t = MatrixType(type, dims[0]);
    plan.push_back({std::move(name), std::move(dims), t, 0.0f, std, true});
  };
  // Embeddings at unit scale, like the residual stream they start.
  plan.push_back({TensorWeightName(TensorKind::kTokenEmbd),
                  {embd, s.n_vocab},
                  MatrixType(type, embd),
                  0.0f,
                  1.0f,
                  true});
  vec(TensorWeightName(TensorKind::kOutputNorm), embd, 1.0f, 0.0f);
  mat(TensorWeightName(TensorKind::kOutput), {embd, s.n_vocab});
  for (int il = 0; il < static_cast<int>(n_layer); ++il) {
    vec(TensorWeightName(TensorKind::kAttnNorm, il), embd, 1.0f, 0.0f);
    mat(TensorWeightName(TensorKind::kAttnQ, il), {embd, q});
    mat(TensorWeightName(TensorKind::kAttnK, il), {embd, kv});
    mat(TensorWeightName(TensorKind::kAttnV, il), {embd, kv});
    mat(TensorWeightName(TensorKind::kAttnOut, il), {q, embd});
    if (arch.qkv_bias) {
      vec(TensorBiasName(TensorKind::kAttnQ, il), q, 0.0f, 0.02f);
      vec(TensorBiasName(TensorKind::kAttnK, il), kv, 0.0f, 0.02f);
      vec(TensorBiasName(TensorKind::kAttnV, il), kv, 0.0f, 0.02f);
    }
    if (arch.qk_norm == format::QkNorm::kFullWidth) {
      vec(TensorWeightName(TensorKind::kAttnQNorm, il), q, 1.0f, 0.0f);
      vec(TensorWeightName(TensorKind::kAttnKNorm, il), kv, 1.0f, 0.0f);
    } else if (arch.qk_norm == format::QkNorm::kPerHead) {
      vec(TensorWeightName(TensorKind::kAttnQNorm, il), head_dim, 1.0f, 0.0f);
      vec(TensorWeightName(TensorKind::kAttnKNorm, il), head_dim, 1.0f, 0.0f);
    }
    vec(TensorWeightName(TensorKind::kFfnNorm, il), embd, 1.0f, 0.0f);
    // The router, f32: on unit-RMS input its logits have unit spread, so different
    // tokens pick different experts.
    plan.push_back({TensorWeightName(TensorKind::kFfnGateInp, il),
                    {embd, s.n_expert},
                    GgmlType::kF32,
                    0.0f,
                    1.0f / std::sqrt(static_cast<float>(embd))});
    const uint64_t ff = s.n_ff_expert;
    mat(TensorWeightName(TensorKind::kFfnGateExps, il), {embd, ff, s.n_expert});
    mat(TensorWeightName(TensorKind::kFfnUpExps, il), {embd, ff, s.n_expert});
    mat(TensorWeightName(TensorKind::kFfnDownExps, il), {ff, embd, s.n_expert});
    if (s.n_ff_shared_expert > 0) {
      const uint64_t sff = s.n_ff_shared_expert;
      vec(TensorWeightName(TensorKind::kFfnGateInpShexp, il), embd, 0.0f,
          1.0f / std::sqrt(static_cast<float>(embd)));
      mat(TensorWeightName(TensorKind::kFfnGateShexp, il), {embd, sff});
      mat(TensorWeightName(TensorKind::kFfnUpShexp, il), {embd, sff});
      mat(TensorWeightName(TensorKind::kFfnDownShexp, il), {sff, embd});
    }
  }
  return plan;
}

// --- The vocabulary ------------------------------------------------------------------

// SentencePiece-style ("llama"): <unk> <s> </s>, the 256 byte-fallback tokens, the
// printable ASCII characters with U+2581 for the space, then lowercase words with
// and without a leading space, shortest first, until `n_vocab`. Scores fall with
// the id, so shorter pieces merge first and every word is reachable by merges.
struct VocabPlan {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
};

VocabPlan PlanVocab(uint32_t n_vocab) {
  VocabPlan v;
  auto add = [&](std::string text, int32_t type) {
    if (v.tokens.size() >= n_vocab) return;
    v.scores.push_back(type == 1 ? -static_cast<float>(v.tokens.size()) : 0.0f);
    v.tokens.push_back(std::move(text));
    v.types.push_back(type);
  };
  add("<unk>", 2);
  add("<s>", 3);
  add("</s>", 3);
  for (int b = 0; b < 256; ++b) add(absl::StrFormat("<0x%02X>", b), 6);
  const std::string space = "\xE2\x96\x81";  // U+2581
  add(space, 1);
  for (char c = '!'; c <= '~'; ++c) add(std::string(1, c), 1);
  std::string word;
  for (size_t len = 1; v.tokens.size() < n_vocab; ++len) {
    // All lowercase words of length `len`, in order; singles exist already.
    std::vector<int> digits(len, 0);
    while (v.tokens.size() < n_vocab) {
      word.clear();
      for (int d : digits) word += static_cast<char>('a' + d);
      add(space + word, 1);
      if (len > 1) add(word, 1);
      size_t pos = len;
      while (pos > 0 && ++digits[pos - 1] == 26) digits[--pos] = 0;
      if (pos == 0) break;
    }
  }
  return v;
}

// --- Writing -------------------------------------------------------------------------

void SetMetadata(const SynthOptions& o, const VocabPlan& vocab, GgufWriter& w) {
  const Shape& s = *o.shape;
  const ArchInfo& arch = InfoOf(s.arch);
  auto key = [&](ArchKey k) { return ArchKeyName(arch, k); };
  w.SetString("general.architecture", arch.name);
  w.SetString("general.name", StrCat("moert-synth ", s.name));
  w.SetUint32("general.file_type", FileType(o.type));
  if (TraitsOf(o.type).block_elements > 1) w.SetUint32("general.quantization_version", 2);
  w.SetUint32(key(ArchKey::kVocabSize), s.n_vocab);
  w.SetUint32(key(ArchKey::kContextLength), s.n_ctx);
  w.SetUint32(key(ArchKey::kEmbeddingLength), s.n_embd);
  w.SetUint32(key(ArchKey::kBlockCount), o.n_layer);
  // Mixtral-style llama files give the expert width as feed_forward_length; qwen2moe
  // keeps the dense width of its config there.
  w.SetUint32(key(ArchKey::kFeedForwardLength),
              s.n_ff_shared_expert > 0 ? s.n_ff_shared_expert : s.n_ff_expert);
  w.SetUint32(key(ArchKey::kHeadCount), s.n_head);
  w.SetUint32(key(ArchKey::kHeadCountKv), s.n_head_kv);
  w.SetUint32(key(ArchKey::kRopeDimensionCount), s.n_embd / s.n_head);
  w.SetFloat32(key(ArchKey::kRopeFreqBase), s.rope_theta);
  w.SetFloat32(key(ArchKey::kRmsEpsilon), s.rms_eps);
  w.SetUint32(key(ArchKey::kExpertCount), s.n_expert);
  w.SetUint32(key(ArchKey::kExpertUsedCount), s.n_expert_used);
  if (s.arch != Arch::kLlama) w.SetUint32(key(ArchKey::kExpertFeedForwardLength), s.n_ff_expert);
  if (s.n_ff_shared_expert > 0) {
    w.SetUint32(key(ArchKey::kExpertSharedFeedForwardLength), s.n_ff_shared_expert);
  }
  if (o.bpe_vocab) {
    const SynthOptions::BpeVocab& b = *o.bpe_vocab;
    w.SetString("tokenizer.ggml.model", "gpt2");
    w.SetString("tokenizer.ggml.pre", b.pre);
    w.SetStringArray("tokenizer.ggml.tokens", b.tokens);
    w.SetInt32Array("tokenizer.ggml.token_type", b.types);
    w.SetStringArray("tokenizer.ggml.merges", b.merges);
    w.SetUint32("tokenizer.ggml.bos_token_id", b.bos);
    w.SetUint32("tokenizer.ggml.eos_token_id", b.eos);
    w.SetBool("tokenizer.ggml.add_bos_token", false);
    return;
  }
  w.SetString("tokenizer.ggml.model", "llama");
  w.SetString("tokenizer.ggml.pre", "default");
  w.SetStringArray("tokenizer.ggml.tokens", vocab.tokens);
  w.SetFloat32Array("tokenizer.ggml.scores", vocab.scores);
  w.SetInt32Array("tokenizer.ggml.token_type", vocab.types);
  w.SetUint32("tokenizer.ggml.bos_token_id", 1);
  w.SetUint32("tokenizer.ggml.eos_token_id", 2);
  w.SetUint32("tokenizer.ggml.unknown_token_id", 0);
  w.SetBool("tokenizer.ggml.add_bos_token", true);
  w.SetBool("tokenizer.ggml.add_eos_token", false);
}

// Generates and quantizes one tensor a chunk at a time, `threads` slices of a chunk
// in parallel, and streams the bytes out.
absl::Status WriteTensor(const SynthTensor& t, uint64_t seed, unsigned threads,
                         format::GgufTensorStream& stream) {
  const auto& traits = TraitsOf(t.type);
  const uint64_t key = Mix(seed ^ HashName(t.name));
  const uint64_t n = t.n_elements();
  // About 4M values per thread per chunk, whole blocks.
  const uint64_t block = traits.block_elements;
  const uint64_t per_thread = std::max<uint64_t>(block, (uint64_t{1} << 22) / block * block);
  const uint64_t chunk = per_thread * threads;
  std::vector<uint8_t> out;
  std::vector<std::vector<float>> scratch(threads);
  for (uint64_t begin = 0; begin < n; begin += chunk) {
    const uint64_t end = std::min(n, begin + chunk);
    out.resize((end - begin) / block * traits.block_bytes);
    std::vector<absl::Status> status(threads);
    auto work = [&](unsigned ti) {
      const uint64_t lo = std::min(end, begin + ti * per_thread);
      const uint64_t hi = std::min(end, lo + per_thread);
      if (lo >= hi) return;
      std::vector<float>& x = scratch[ti];
      x.resize(hi - lo);
      FillValues(key, lo, t.mean, t.std, x);
      const uint64_t offset = (lo - begin) / block * traits.block_bytes;
      status[ti] = format::Quantize(
          t.type, x, std::span(out).subspan(offset, (hi - lo) / block * traits.block_bytes));
    };
    const auto busy = static_cast<unsigned>((end - begin + per_thread - 1) / per_thread);
    if (busy == 1) {
      work(0);
    } else {
      std::vector<std::thread> pool;
      for (unsigned ti = 0; ti < busy; ++ti) pool.emplace_back(work, ti);
      for (std::thread& th : pool) th.join();
    }
    for (const absl::Status& s : status) {
      if (!s.ok()) return s;
    }
    MOERT_RETURN_IF_ERROR(stream.Write(out));
  }
  return absl::OkStatus();
}

std::string Size(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024.0 * 1024.0)
    return absl::StrFormat("%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
  return absl::StrFormat("%.1f MiB", b / (1024.0 * 1024.0));
}

}  // namespace

std::span<const Shape> Shapes() { return kShapes; }

const Shape* FindShape(std::string_view name) {
  for (const Shape& s : kShapes) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::string ShapeNames() {
  std::vector<std::string_view> names;
  for (const Shape& s : kShapes) names.push_back(s.name);
  return StrJoin(names, ", ");
}

std::span<const GgmlType> MatrixTypes() { return kTypes; }

std::optional<GgmlType> FindMatrixType(std::string_view name) {
  for (GgmlType t : kTypes) {
    if (Lower(GgmlTypeName(t)) == Lower(name)) return t;
  }
  return std::nullopt;
}

std::string MatrixTypeNames() {
  std::vector<std::string_view> names;
  for (GgmlType t : kTypes) names.push_back(GgmlTypeName(t));
  return StrJoin(names, ", ");
}

uint64_t SynthTensor::n_elements() const {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  return n;
}

uint64_t SynthTensor::n_bytes() const {
  // Every planned tensor is whole blocks (MatrixType), so this has a value.
  return format::GgmlRowBytes(type, n_elements()).value_or(0);
}

absl::StatusOr<SynthModel> SynthModel::Plan(const SynthOptions& options) {
  if (options.shape == nullptr) return absl::InvalidArgumentError("no shape given");
  if (!FindMatrixType(GgmlTypeName(options.type))) {
    return absl::InvalidArgumentError(StrCat("unsupported type '", GgmlTypeName(options.type),
                                             "' (supported: ", MatrixTypeNames(), ")"));
  }
  if (options.n_layer > 4096) {
    return absl::InvalidArgumentError(
        StrCat("layer count ", options.n_layer, " is not a number from 1 to 4096"));
  }
  if (options.threads == 0) return absl::InvalidArgumentError("thread count 0");
  if (options.bpe_vocab) {
    const SynthOptions::BpeVocab& b = *options.bpe_vocab;
    if (b.tokens.size() != options.shape->n_vocab || b.types.size() != b.tokens.size() ||
        b.bos >= b.tokens.size() || b.eos >= b.tokens.size()) {
      return absl::InvalidArgumentError(
          StrCat("the vocabulary has ", b.tokens.size(), " tokens (", b.types.size(),
                 " types, bos ", b.bos, ", eos ", b.eos, ") but shape ", options.shape->name,
                 " needs ", options.shape->n_vocab));
    }
  }
  SynthModel m;
  m.options_ = options;
  if (m.options_.n_layer == 0) m.options_.n_layer = options.shape->n_layer;
  m.tensors_ = PlanTensors(*options.shape, m.options_.n_layer, options.type);
  m.writer_ = std::make_unique<GgufWriter>();
  SetMetadata(m.options_, PlanVocab(options.shape->n_vocab), *m.writer_);
  for (const SynthTensor& t : m.tensors_) {
    MOERT_RETURN_IF_ERROR(m.writer_->DeclareTensor(t.name, t.type, t.dims));
    m.n_params_ += t.n_elements();
    if (t.matrix && t.type != options.type) ++m.n_fallback_;
  }
  return m;
}

uint64_t SynthModel::file_size() const { return writer_->FileSize(); }

std::string SynthModel::Describe() const {
  const Shape& s = *options_.shape;
  std::string fallback_note;
  if (n_fallback_ > 0) {
    fallback_note =
        StrCat(", ", n_fallback_, " matrices ", GgmlTypeName(MatrixType(options_.type, 32)),
               " (rows not a multiple of 256)");
  }
  const double params = static_cast<double>(n_params_);
  return absl::StrFormat("%s (%s, %u of %u layers), %s, %s parameters, %s%s", std::string(s.name),
                         std::string(InfoOf(s.arch).name), options_.n_layer, s.n_layer,
                         std::string(GgmlTypeName(options_.type)),
                         n_params_ >= 1000000000 ? absl::StrFormat("%.2fB", params * 1e-9)
                                                 : absl::StrFormat("%.1fM", params * 1e-6),
                         Size(file_size()), fallback_note);
}

absl::Status SynthModel::Write(const std::string& path) const {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<format::GgufTensorStream> stream,
                         writer_->OpenStream(path));
  for (const SynthTensor& t : tensors_) {
    absl::Status written = WriteTensor(t, options_.seed, options_.threads, *stream);
    if (!written.ok()) {
      return absl::Status(written.code(), StrCat(path, ": ", t.name, ": ", written.message()));
    }
  }
  return stream->Finish();
}

}  // namespace moert::synth
