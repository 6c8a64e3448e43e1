// The MiniCPM-V 2.6 oracle pair (minicpmv_oracle.h): SPEC.md's weight rule, its key
// and tensor tables in file order, and the streaming writer. Built with
// -ffp-contract=off (tools/CMakeLists.txt): SPEC.md rounds a*(2u - 1) and then
// mean + that product, and aarch64 GCC would fuse the two into one fmadd (one
// rounding). The float rounding hides the difference almost always (no case in 10M
// LayerNorm values), but the rule is the two roundings.
#include "minicpmv_oracle.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/status.h"
#include "core/strings.h"
#include "format/ggml_types.h"
#include "format/gguf_writer.h"
#include "json_reader.h"

namespace moert::synth {
namespace {

using format::GgmlType;
using format::GgufWriter;
using tools::JsonValue;

// Shapes of SPEC.md section 4.
constexpr uint64_t kVisionWidth = 64;
constexpr uint64_t kVisionFfn = 128;
constexpr uint32_t kVisionLayers = 2;
constexpr uint64_t kPatch = 14;
constexpr uint64_t kPositions = 4900;  // the 70x70 bucket grid
constexpr uint64_t kResamplerWidth = 3584;
constexpr uint64_t kQueries = 64;
constexpr uint64_t kLlmWidth = 3584;
constexpr uint64_t kLlmKvWidth = 512;  // 4 KV heads x 128
constexpr uint64_t kLlmFfn = 512;
constexpr size_t kVocabSize = 394;

constexpr char kChatTemplate[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

// Elements generated and written per chunk: 4 MiB of data.
constexpr size_t kChunkElements = size_t{1} << 20;

void Add(std::vector<OracleTensor>& tensors, std::string name, std::vector<uint64_t> dims,
         OracleValues values = OracleValues::kStd002) {
  tensors.push_back(OracleTensor{std::move(name), std::move(dims), values});
}

absl::StatusOr<OracleFile> Declare(std::string file_name, std::unique_ptr<GgufWriter> writer,
                                   std::vector<OracleTensor> tensors) {
  for (const OracleTensor& t : tensors) {
    MOERT_RETURN_IF_ERROR(writer->DeclareTensor(t.name, GgmlType::kF32, t.dims));
  }
  return OracleFile{std::move(file_name), std::move(writer), std::move(tensors)};
}

absl::StatusOr<std::vector<std::string>> StringArray(const JsonValue& root, std::string_view key) {
  const JsonValue* v = root.Find(key);
  if (v == nullptr || v->kind != JsonValue::Kind::kArray) {
    return absl::InvalidArgumentError(moert::StrCat("no array '", key, "'"));
  }
  std::vector<std::string> out;
  out.reserve(v->array.size());
  for (const JsonValue& e : v->array) {
    if (e.kind != JsonValue::Kind::kString) {
      return absl::InvalidArgumentError(
          moert::StrCat("'", key, "'[", out.size(), "] is not a string"));
    }
    out.push_back(e.string);
  }
  return out;
}

}  // namespace

uint64_t OracleSeed(std::string_view tensor_name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : tensor_name) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

OracleSample OracleRuleSample(uint64_t seed, uint64_t i, double std, double mean) {
  OracleSample s;
  s.z = SplitMix64(seed + i);
  s.u = static_cast<double>(s.z >> 11) * 0x1p-53;
  const double a = std * std::sqrt(3.0);
  s.w = a * (2.0 * s.u - 1.0);
  if (mean != 0) s.w = mean + s.w;
  s.value = static_cast<float>(s.w);
  return s;
}

uint64_t OracleTensor::n_elements() const {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  return n;
}

void FillOracleValues(const OracleTensor& tensor, uint64_t first, std::span<float> out) {
  if (tensor.values == OracleValues::kOne) {
    std::fill(out.begin(), out.end(), 1.0f);
    return;
  }
  const uint64_t seed = OracleSeed(tensor.name);
  const bool layer_norm = tensor.values == OracleValues::kOnePlusStd005;
  const double std = layer_norm ? 0.05 : 0.02;
  const double mean = layer_norm ? 1.0 : 0.0;
  for (size_t k = 0; k < out.size(); ++k) {
    out[k] = OracleRuleSample(seed, first + k, std, mean).value;
  }
}

absl::StatusOr<OracleVocab> ParseOracleVocab(std::string_view json) {
  MOERT_ASSIGN_OR_RETURN(JsonValue root, tools::ParseJson(json));
  if (root.kind != JsonValue::Kind::kObject) {
    return absl::InvalidArgumentError("the vocabulary is not a JSON object");
  }
  OracleVocab vocab;
  MOERT_ASSIGN_OR_RETURN(vocab.tokens, StringArray(root, "tokens"));
  MOERT_ASSIGN_OR_RETURN(vocab.merges, StringArray(root, "merges"));
  if (vocab.tokens.size() != kVocabSize) {
    return absl::InvalidArgumentError(
        moert::StrCat("'tokens' has ", vocab.tokens.size(), " entries, expected ", kVocabSize));
  }
  const JsonValue* types = root.Find("token_type");
  if (types == nullptr || types->kind != JsonValue::Kind::kArray) {
    return absl::InvalidArgumentError("no array 'token_type'");
  }
  if (types->array.size() != vocab.tokens.size()) {
    return absl::InvalidArgumentError(moert::StrCat(
        "'token_type' has ", types->array.size(), " entries for ", vocab.tokens.size(), " tokens"));
  }
  for (const JsonValue& e : types->array) {
    if (e.kind != JsonValue::Kind::kInt || e.integer < std::numeric_limits<int32_t>::min() ||
        e.integer > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          moert::StrCat("'token_type'[", vocab.token_type.size(), "] is not a 32-bit integer"));
    }
    vocab.token_type.push_back(static_cast<int32_t>(e.integer));
  }
  return vocab;
}

absl::StatusOr<OracleVocab> ReadOracleVocab(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    std::string msg =
        moert::StrCat("cannot read the vocabulary '", path, "': ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::InternalError(msg);
  }
  std::ostringstream text;
  text << in.rdbuf();
  absl::StatusOr<OracleVocab> vocab = ParseOracleVocab(text.str());
  if (!vocab.ok()) {
    return absl::InvalidArgumentError(moert::StrCat("'", path, "': ", vocab.status().message()));
  }
  return vocab;
}

absl::StatusOr<OracleFile> PlanMinicpmv26Mmproj() {
  auto w = std::make_unique<GgufWriter>();
  w->SetString("general.architecture", "clip");
  w->SetBool("clip.has_text_encoder", false);
  w->SetBool("clip.has_vision_encoder", true);
  w->SetBool("clip.has_minicpmv_projector", true);
  w->SetUint32("general.file_type", 0);
  w->SetString("general.description",
               "image encoder for MiniCPM-V (tiny random-weight test model)");
  w->SetString("clip.projector_type", "resampler");
  w->SetInt32("clip.minicpmv_version", 3);
  w->SetUint32("clip.vision.image_size", 448);
  w->SetUint32("clip.vision.patch_size", static_cast<uint32_t>(kPatch));
  w->SetUint32("clip.vision.embedding_length", static_cast<uint32_t>(kVisionWidth));
  w->SetUint32("clip.vision.feed_forward_length", static_cast<uint32_t>(kVisionFfn));
  w->SetUint32("clip.vision.projection_dim", 0);
  w->SetUint32("clip.vision.attention.head_count", 2);
  w->SetFloat32("clip.vision.attention.layer_norm_epsilon", 1e-6f);
  w->SetUint32("clip.vision.block_count", kVisionLayers);
  w->SetFloat32Array("clip.vision.image_mean", {0.5f, 0.5f, 0.5f});
  w->SetFloat32Array("clip.vision.image_std", {0.5f, 0.5f, 0.5f});
  w->SetBool("clip.use_gelu", true);

  constexpr OracleValues kLn = OracleValues::kOnePlusStd005;
  const uint64_t r = kResamplerWidth;
  std::vector<OracleTensor> t;
  Add(t, "resampler.query", {r, kQueries});
  Add(t, "resampler.kv.weight", {kVisionWidth, r});
  for (const char* p : {"q", "k", "v", "out"}) {
    Add(t, moert::StrCat("resampler.attn.", p, ".weight"), {r, r});
    Add(t, moert::StrCat("resampler.attn.", p, ".bias"), {r});
  }
  for (const char* ln : {"ln_q", "ln_kv", "ln_post"}) {
    Add(t, moert::StrCat("resampler.", ln, ".weight"), {r}, kLn);
    Add(t, moert::StrCat("resampler.", ln, ".bias"), {r});
  }
  // Never read by clip.cpp (it computes the sincos table itself); SPEC.md replaces
  // the converter's table with the rule.
  Add(t, "resampler.pos_embed_k", {r, kPositions});
  Add(t, "resampler.proj.weight", {r, r});
  Add(t, "v.patch_embd.weight", {kPatch, kPatch, 3, kVisionWidth});
  Add(t, "v.patch_embd.bias", {kVisionWidth});
  Add(t, "v.position_embd.weight", {kVisionWidth, kPositions});
  for (uint32_t l = 0; l < kVisionLayers; ++l) {
    const std::string blk = moert::StrCat("v.blk.", l, ".");
    for (const char* p : {"attn_q", "attn_k", "attn_v", "attn_out"}) {
      Add(t, moert::StrCat(blk, p, ".weight"), {kVisionWidth, kVisionWidth});
      Add(t, moert::StrCat(blk, p, ".bias"), {kVisionWidth});
    }
    for (const char* ln : {"ln1", "ln2"}) {
      Add(t, moert::StrCat(blk, ln, ".weight"), {kVisionWidth}, kLn);
      Add(t, moert::StrCat(blk, ln, ".bias"), {kVisionWidth});
    }
    // clip.cpp's names are inverted: ffn_down is fc1 (width to FFN), ffn_up fc2.
    Add(t, blk + "ffn_down.weight", {kVisionWidth, kVisionFfn});
    Add(t, blk + "ffn_down.bias", {kVisionFfn});
    Add(t, blk + "ffn_up.weight", {kVisionFfn, kVisionWidth});
    Add(t, blk + "ffn_up.bias", {kVisionWidth});
  }
  Add(t, "v.post_ln.weight", {kVisionWidth}, kLn);
  Add(t, "v.post_ln.bias", {kVisionWidth});
  return Declare(std::string(kMinicpmv26MmprojFile), std::move(w), std::move(t));
}

absl::StatusOr<OracleFile> PlanMinicpmv26Llm(const OracleVocab& vocab) {
  if (vocab.tokens.size() != kVocabSize || vocab.token_type.size() != kVocabSize) {
    return absl::InvalidArgumentError(
        moert::StrCat("the oracle LLM needs ", kVocabSize, " tokens and token types, got ",
                      vocab.tokens.size(), " and ", vocab.token_type.size()));
  }
  auto w = std::make_unique<GgufWriter>();
  w->SetString("general.architecture", "qwen2");
  w->SetString("general.name", "MiniCPM-V-2.6 tiny random test LLM");
  w->SetUint32("general.file_type", 0);
  w->SetUint32("qwen2.context_length", 32768);
  w->SetUint32("qwen2.embedding_length", static_cast<uint32_t>(kLlmWidth));
  w->SetUint32("qwen2.block_count", 1);
  w->SetUint32("qwen2.feed_forward_length", static_cast<uint32_t>(kLlmFfn));
  w->SetUint32("qwen2.attention.head_count", 28);
  w->SetUint32("qwen2.attention.head_count_kv", 4);
  w->SetFloat32("qwen2.rope.freq_base", 1000000.0f);
  w->SetFloat32("qwen2.attention.layer_norm_rms_epsilon", 1e-6f);
  w->SetString("tokenizer.ggml.model", "gpt2");
  w->SetString("tokenizer.ggml.pre", "qwen2");
  w->SetStringArray("tokenizer.ggml.tokens", vocab.tokens);
  w->SetInt32Array("tokenizer.ggml.token_type", vocab.token_type);
  w->SetStringArray("tokenizer.ggml.merges", vocab.merges);
  w->SetUint32("tokenizer.ggml.bos_token_id", 376);
  w->SetUint32("tokenizer.ggml.eos_token_id", 378);
  w->SetUint32("tokenizer.ggml.padding_token_id", 376);
  w->SetUint32("tokenizer.ggml.unknown_token_id", 379);
  w->SetBool("tokenizer.ggml.add_bos_token", false);
  w->SetString("tokenizer.chat_template", kChatTemplate);

  const uint64_t n = kLlmWidth;
  const uint64_t n_vocab = vocab.tokens.size();
  std::vector<OracleTensor> t;
  Add(t, "token_embd.weight", {n, n_vocab});
  Add(t, "output_norm.weight", {n}, OracleValues::kOne);
  Add(t, "output.weight", {n, n_vocab});
  Add(t, "blk.0.attn_norm.weight", {n}, OracleValues::kOne);
  Add(t, "blk.0.attn_q.weight", {n, n});
  Add(t, "blk.0.attn_q.bias", {n});
  Add(t, "blk.0.attn_k.weight", {n, kLlmKvWidth});
  Add(t, "blk.0.attn_k.bias", {kLlmKvWidth});
  Add(t, "blk.0.attn_v.weight", {n, kLlmKvWidth});
  Add(t, "blk.0.attn_v.bias", {kLlmKvWidth});
  Add(t, "blk.0.attn_output.weight", {n, n});
  Add(t, "blk.0.ffn_norm.weight", {n}, OracleValues::kOne);
  Add(t, "blk.0.ffn_gate.weight", {n, kLlmFfn});
  Add(t, "blk.0.ffn_up.weight", {n, kLlmFfn});
  Add(t, "blk.0.ffn_down.weight", {kLlmFfn, n});
  return Declare(std::string(kMinicpmv26LlmFile), std::move(w), std::move(t));
}

absl::Status WriteOracleFile(const OracleFile& file, const std::string& path) {
  bool created = false;  // remove only a file this call created
  auto write = [&]() -> absl::Status {
    MOERT_ASSIGN_OR_RETURN(std::unique_ptr<format::GgufTensorStream> stream,
                           file.writer->OpenStream(path));
    created = true;
    std::vector<float> values(kChunkElements);
    std::vector<uint8_t> bytes(kChunkElements * sizeof(float));
    for (const OracleTensor& t : file.tensors) {
      const uint64_t n = t.n_elements();
      for (uint64_t first = 0; first < n; first += kChunkElements) {
        const size_t count = static_cast<size_t>(std::min<uint64_t>(kChunkElements, n - first));
        FillOracleValues(t, first, std::span(values).first(count));
        for (size_t k = 0; k < count; ++k) {  // little endian, whatever the host
          const uint32_t b = std::bit_cast<uint32_t>(values[k]);
          for (size_t j = 0; j < 4; ++j) bytes[4 * k + j] = static_cast<uint8_t>(b >> (8 * j));
        }
        MOERT_RETURN_IF_ERROR(stream->Write(std::span(bytes).first(count * sizeof(float))));
      }
    }
    return stream->Finish();
  };
  absl::Status status = write();
  if (!status.ok() && created) {
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
  }
  return status;
}

absl::StatusOr<std::vector<std::string>> WriteMinicpmv26Oracle(const std::string& out_dir,
                                                               const std::string& vocab_path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(out_dir, ec);
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory) {
    return absl::PermissionDeniedError(
        moert::StrCat("cannot access output directory '", out_dir, "': ", ec.message()));
  }
  if (!std::filesystem::exists(st)) {
    return absl::NotFoundError(moert::StrCat("output directory '", out_dir, "' does not exist"));
  }
  if (!std::filesystem::is_directory(st)) {
    return absl::FailedPreconditionError(
        moert::StrCat("output directory '", out_dir, "' is not a directory"));
  }
  MOERT_ASSIGN_OR_RETURN(OracleVocab vocab, ReadOracleVocab(vocab_path));
  MOERT_ASSIGN_OR_RETURN(OracleFile mmproj, PlanMinicpmv26Mmproj());
  MOERT_ASSIGN_OR_RETURN(OracleFile llm, PlanMinicpmv26Llm(vocab));
  std::vector<std::string> paths;
  for (const OracleFile* f : {&mmproj, &llm}) {
    std::string path = (std::filesystem::path(out_dir) / f->file_name).string();
    MOERT_RETURN_IF_ERROR(WriteOracleFile(*f, path));
    paths.push_back(std::move(path));
  }
  return paths;
}

}  // namespace moert::synth
