// moert-synth: writes a GGUF model with random weights in the exact shape of a real
// MoE model (tiny, OLMoE-1B-7B, Qwen1.5-MoE-A2.7B, Mixtral-8x7B), for testing and
// benchmarking at real sizes without downloading anything. The file has the real
// architecture's metadata, tensor names, shapes and a small SentencePiece-style
// vocabulary, so every moert tool loads it end to end.
//
// Weights are a pure function of (seed, tensor name, element index), so a file does
// not depend on the thread count or on how the data is chunked; tensor data is
// generated, quantized and streamed to disk a chunk at a time, so a 90 GB model
// needs a few hundred MB of memory.
#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "core/strings.h"
#include "format/arch.h"
#include "format/ggml_types.h"
#include "format/gguf_writer.h"
#include "format/quantize.h"

namespace {

using moert::StrCat;
using moert::format::Arch;
using moert::format::ArchInfo;
using moert::format::ArchKey;
using moert::format::ArchKeyName;
using moert::format::GgmlType;
using moert::format::GgmlTypeName;
using moert::format::GgufWriter;
using moert::format::InfoOf;
using moert::format::TensorBiasName;
using moert::format::TensorKind;
using moert::format::TensorWeightName;
using moert::format::TraitsOf;

constexpr char kUsage[] =
    "usage: moert-synth --shape NAME --type TYPE -o FILE [options]\n"
    "\n"
    "Writes a GGUF model with seeded random weights in the shape of a real MoE model.\n"
    "Matrices (embeddings, attention, experts, output) get TYPE; norms, biases and the\n"
    "router stay f32, as llama.cpp keeps them. A K type falls back to q5_0 (q4_K) or\n"
    "q8_0 (q6_K) for rows that are not a multiple of 256, as llama-quantize does.\n"
    "\n"
    "  --shape NAME     tiny, olmoe-1b-7b, qwen15-moe-a27b, mixtral-8x7b\n"
    "  --type TYPE      f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q6_K\n"
    "  -o, --output FILE  where to write the model\n"
    "  --layers N       only the first N layers (default: all of the shape's)\n"
    "  --seed S         random seed (default 1)\n"
    "  --threads N      worker threads (default: all cores)\n"
    "  --dry-run        print the tensors and the file size, write nothing\n"
    "  -h, --help       show this help\n";

struct Shape {
  std::string_view name;
  Arch arch;
  uint32_t n_embd;
  uint32_t n_layer;
  uint32_t n_head;
  uint32_t n_head_kv;
  uint32_t n_expert;
  uint32_t n_expert_used;
  uint32_t n_ff_expert;
  uint32_t n_ff_shared_expert;  // 0: none
  uint32_t n_vocab;
  uint32_t n_ctx;
  float rope_theta;
  float rms_eps;
};

// The hyperparameters of the published models' config.json files.
constexpr std::array<Shape, 4> kShapes = {{
    // The oracle model's shape (tiny-moe-shakespeare).
    {"tiny", Arch::kLlama, 256, 4, 8, 4, 8, 2, 512, 0, 2048, 256, 10000.0f, 1e-5f},
    {"olmoe-1b-7b", Arch::kOlmoe, 2048, 16, 16, 16, 64, 8, 1024, 0, 50304, 4096, 10000.0f, 1e-5f},
    {"qwen15-moe-a27b", Arch::kQwen2Moe, 2048, 24, 16, 16, 60, 4, 1408, 5632, 151936, 8192,
     1000000.0f, 1e-6f},
    {"mixtral-8x7b", Arch::kLlama, 4096, 32, 32, 8, 8, 2, 14336, 0, 32000, 32768, 1000000.0f,
     1e-5f},
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

int Fail(const std::string& message) {
  std::fprintf(stderr, "moert-synth: error: %s\n", message.c_str());
  return 1;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::optional<uint64_t> ParseUint(std::string_view s) {
  if (s.empty() || s.size() > 19) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
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

struct TensorPlan {
  std::string name;
  std::vector<uint64_t> dims;
  GgmlType type;
  float mean;  // values are mean + std * u, u as FillValues draws it
  float std;
  bool matrix = false;  // takes --type (else f32)
  uint64_t n_elements() const {
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    return n;
  }
};

// The type for a matrix whose rows have `row` values: `type`, or llama-quantize's
// fallback when the row is not a whole number of its blocks.
GgmlType MatrixType(GgmlType type, uint64_t row) {
  if (row % TraitsOf(type).block_elements == 0) return type;
  if (type == GgmlType::kQ4_K) return GgmlType::kQ5_0;
  if (type == GgmlType::kQ6_K) return GgmlType::kQ8_0;
  return type;  // every shape's rows are multiples of 32
}

std::vector<TensorPlan> PlanTensors(const Shape& s, uint32_t n_layer, GgmlType type) {
  const ArchInfo& arch = InfoOf(s.arch);
  const uint64_t embd = s.n_embd;
  const uint64_t head_dim = s.n_embd / s.n_head;
  const uint64_t q = s.n_head * head_dim;
  const uint64_t kv = s.n_head_kv * head_dim;
  std::vector<TensorPlan> plan;
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
    if (arch.qk_norm == moert::format::QkNorm::kFullWidth) {
      vec(TensorWeightName(TensorKind::kAttnQNorm, il), q, 1.0f, 0.0f);
      vec(TensorWeightName(TensorKind::kAttnKNorm, il), kv, 1.0f, 0.0f);
    } else if (arch.qk_norm == moert::format::QkNorm::kPerHead) {
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

struct Options {
  const Shape* shape = nullptr;
  GgmlType type = GgmlType::kF32;
  std::string output;
  uint32_t n_layer = 0;
  uint64_t seed = 1;
  unsigned threads = 1;
  bool dry_run = false;
};

void SetMetadata(const Options& o, const VocabPlan& vocab, GgufWriter& w) {
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
absl::Status WriteTensor(const TensorPlan& t, uint64_t seed, unsigned threads,
                         moert::format::GgufTensorStream& stream) {
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
      status[ti] = moert::format::Quantize(
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
    absl::Status written = stream.Write(out);
    if (!written.ok()) return written;
  }
  return absl::OkStatus();
}

std::string Size(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024.0 * 1024.0)
    return absl::StrFormat("%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
  return absl::StrFormat("%.1f MiB", b / (1024.0 * 1024.0));
}

std::string ShapeString(const std::vector<uint64_t>& dims) {
  return StrCat("[", moert::StrJoin(dims, ", "), "]");
}

int Run(const Options& o) {
  const auto start = std::chrono::steady_clock::now();
  const Shape& s = *o.shape;
  const std::vector<TensorPlan> plan = PlanTensors(s, o.n_layer, o.type);
  GgufWriter writer;
  SetMetadata(o, PlanVocab(s.n_vocab), writer);
  uint64_t n_params = 0;
  size_t fallbacks = 0;
  for (const TensorPlan& t : plan) {
    absl::Status declared = writer.DeclareTensor(t.name, t.type, t.dims);
    if (!declared.ok()) return Fail(std::string(declared.message()));
    n_params += t.n_elements();
    if (t.matrix && t.type != o.type) ++fallbacks;
  }
  const uint64_t file_size = writer.FileSize();
  std::string fallback_note;
  if (fallbacks > 0) {
    fallback_note = StrCat(", ", fallbacks, " matrices ", GgmlTypeName(MatrixType(o.type, 32)),
                           " (rows not a multiple of 256)");
  }
  const std::string what = absl::StrFormat(
      "%s (%s, %u of %u layers), %s, %s parameters, %s%s", std::string(s.name),
      std::string(InfoOf(s.arch).name), o.n_layer, s.n_layer, std::string(GgmlTypeName(o.type)),
      n_params >= 1000000000 ? absl::StrFormat("%.2fB", static_cast<double>(n_params) * 1e-9)
                             : absl::StrFormat("%.1fM", static_cast<double>(n_params) * 1e-6),
      Size(file_size), fallback_note);

  if (o.dry_run) {
    for (const TensorPlan& t : plan) {
      const uint64_t bytes = *moert::format::GgmlRowBytes(t.type, t.n_elements());
      std::printf("%-34s %-5s %-22s %14llu\n", t.name.c_str(),
                  std::string(GgmlTypeName(t.type)).c_str(), ShapeString(t.dims).c_str(),
                  static_cast<unsigned long long>(bytes));
    }
    std::printf("total %zu tensors, %llu bytes\n", plan.size(),
                static_cast<unsigned long long>(file_size));
    std::fprintf(stderr, "moert-synth: dry run: %s\n", what.c_str());
    return 0;
  }

  auto stream = writer.OpenStream(o.output);
  if (!stream.ok()) return Fail(std::string(stream.status().message()));
  for (const TensorPlan& t : plan) {
    absl::Status written = WriteTensor(t, o.seed, o.threads, **stream);
    if (!written.ok()) return Fail(StrCat(t.name, ": ", written.message()));
  }
  absl::Status finished = (*stream)->Finish();
  if (!finished.ok()) return Fail(std::string(finished.message()));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "moert-synth: wrote %s: %s in %.1f s\n", o.output.c_str(), what.c_str(),
               seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.threads = std::max(1u, std::thread::hardware_concurrency());
  std::optional<uint64_t> layers;
  std::string type_name;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    std::string_view value;
    auto take = [&]() {
      if (i + 1 >= argc) return false;
      value = argv[++i];
      return true;
    };
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--shape") {
      if (!take()) return Fail("--shape needs a NAME (see --help)");
      for (const Shape& s : kShapes) {
        if (s.name == value) o.shape = &s;
      }
      if (o.shape == nullptr) {
        std::vector<std::string_view> names;
        for (const Shape& s : kShapes) names.push_back(s.name);
        return Fail(
            StrCat("unknown shape '", value, "' (known: ", moert::StrJoin(names, ", "), ")"));
      }
    } else if (arg == "--type") {
      if (!take()) return Fail("--type needs a TYPE (see --help)");
      type_name = std::string(value);
      bool found = false;
      for (GgmlType t : kTypes) {
        if (Lower(GgmlTypeName(t)) == Lower(value)) {
          o.type = t;
          found = true;
        }
      }
      if (!found) {
        std::vector<std::string_view> names;
        for (GgmlType t : kTypes) names.push_back(GgmlTypeName(t));
        return Fail(StrCat("unsupported --type '", value,
                           "' (supported: ", moert::StrJoin(names, ", "), ")"));
      }
    } else if (arg == "-o" || arg == "--output") {
      if (!take()) return Fail("-o needs a FILE (see --help)");
      o.output = std::string(value);
    } else if (arg == "--layers") {
      if (!take()) return Fail("--layers needs a number (see --help)");
      layers = ParseUint(value);
      if (!layers || *layers == 0 || *layers > 4096) {
        return Fail(StrCat("--layers '", value, "' is not a number from 1 to 4096"));
      }
    } else if (arg == "--seed") {
      if (!take()) return Fail("--seed needs a number (see --help)");
      std::optional<uint64_t> seed = ParseUint(value);
      if (!seed) return Fail(StrCat("--seed '", value, "' is not a number"));
      o.seed = *seed;
    } else if (arg == "--threads") {
      if (!take()) return Fail("--threads needs a number (see --help)");
      std::optional<uint64_t> threads = ParseUint(value);
      if (!threads || *threads == 0 || *threads > 1024) {
        return Fail(StrCat("--threads '", value, "' is not a number from 1 to 1024"));
      }
      o.threads = static_cast<unsigned>(*threads);
    } else if (arg == "--dry-run") {
      o.dry_run = true;
    } else {
      return Fail(StrCat("unknown argument '", arg, "' (see --help)"));
    }
  }
  if (o.shape == nullptr) return Fail("no shape: give --shape NAME (see --help)");
  if (type_name.empty()) return Fail("no type: give --type TYPE (see --help)");
  if (o.output.empty() && !o.dry_run) return Fail("no output: give -o FILE (see --help)");
  o.n_layer = layers ? static_cast<uint32_t>(*layers) : o.shape->n_layer;
  return Run(o);
}
