// Tests of the MiniCPM-V 2.6 oracle pair (tools/minicpmv_oracle.h) against
// ../shared/mmproj/SPEC.md: the weight rule's worked examples, the vocabulary, the
// header layout (sizes, key order and types, tensor infos and offsets), and, in the
// slow suite, both files generated in full with SPEC.md's md5 sums and read back.
#include "minicpmv_oracle.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/strings.h"
#include "format/gguf.h"
#include "md5.h"

namespace moert::synth {
namespace {

using format::GgufFile;
using format::GgufValueType;

const std::string kVocabPath = MOERT_SHARED_DIR "/mmproj/vocab.json";

// Unique per process: ctest runs each test of this binary as its own process.
std::string TempPath(const std::string& name) {
  return StrCat(::testing::TempDir(), "/", getpid(), "_", name);
}

// --- The weight rule: SPEC.md section 1's worked examples -----------------------------

struct Example {
  const char* tensor;
  uint64_t seed;
  double std;
  double mean;
  uint64_t i;
  uint64_t z;
  double u;
  double w;
  uint32_t f32_bits;
};

constexpr Example kExamples[] = {
    {"v.patch_embd.weight", 0x3d52a019d0c92f90, 0.02, 0, 0, 0x54b425328a485352, 0.33087379917040605,
     -0.011717406909118173, 0xbc3ffa5e},
    {"v.patch_embd.weight", 0x3d52a019d0c92f90, 0.02, 0, 1, 0xb91e2c38682af610, 0.7231166494095012,
     0.015457974911671541, 0x3c7d4372},
    {"v.patch_embd.weight", 0x3d52a019d0c92f90, 0.02, 0, 2, 0xd006e4da75ead1ee, 0.8126051934577092,
     0.021657923111146015, 0x3cb16bf5},
    {"v.patch_embd.weight", 0x3d52a019d0c92f90, 0.02, 0, 3, 0x2fb8038f93ced669, 0.18640157943064684,
     -0.021726735903978903, 0xbcb1fc45},
    {"resampler.query", 0x48065019b9e35f16, 0.02, 0, 0, 0x09a8efad971e977d, 0.03773401248974495,
     -0.032026727079150476, 0xbd032e75},
    {"resampler.query", 0x48065019b9e35f16, 0.02, 0, 1, 0x679e524b89aae7fa, 0.4047595438402527,
     -0.006598452360188743, 0xbbd837d5},
    {"resampler.query", 0x48065019b9e35f16, 0.02, 0, 2, 0x87182e11e87b7deb, 0.527712706920722,
     0.0019199926560782483, 0x3afba843},
    {"resampler.query", 0x48065019b9e35f16, 0.02, 0, 3, 0xaf73a015e9c38dfa, 0.685358052587402,
     0.012841982586936163, 0x3c52672e},
    {"token_embd.weight", 0x2d85b88e70e67727, 0.02, 0, 0, 0x9993e162b39935bf, 0.5999127260180088,
     0.006922156711436006, 0x3be2d342},
    {"token_embd.weight", 0x2d85b88e70e67727, 0.02, 0, 1, 0x82a4d18cd1e8099d, 0.5103274315642069,
     0.0007155054472358751, 0x3a3b90c2},
    {"token_embd.weight", 0x2d85b88e70e67727, 0.02, 0, 2, 0xad3248b0380b68f5, 0.6765485220167143,
     0.012231640405365672, 0x3c486738},
    {"token_embd.weight", 0x2d85b88e70e67727, 0.02, 0, 3, 0x1a01b2ab759762a5, 0.10158840833682126,
     -0.02760276476340042, 0xbce21f31},
    {"v.blk.0.ln1.weight", 0xe86b85ba7a70711d, 0.05, 1.0, 0, 0xf6b64fed4460ede3, 0.9637193636193647,
     1.0803185498242247, 0x3f8a47e1},
    {"v.blk.0.ln1.weight", 0xe86b85ba7a70711d, 0.05, 1.0, 1, 0x6cb284d4254a65c5,
     0.42459898166024734, 0.9869401605293115, 0x3f7ca81c},
    {"v.blk.0.ln1.weight", 0xe86b85ba7a70711d, 0.05, 1.0, 2, 0x4cc8d178d60230ad,
     0.29993924331757493, 0.9653484604825365, 0x3f772114},
    {"v.blk.0.ln1.weight", 0xe86b85ba7a70711d, 0.05, 1.0, 3, 0x163b693dc30be1d2,
     0.08684404142245183, 0.9284392888293864, 0x3f6dae32},
};

TEST(MinicpmvOracleRule, SeedsAreFnv1aOfTheNames) {
  for (const Example& e : kExamples) EXPECT_EQ(OracleSeed(e.tensor), e.seed) << e.tensor;
  EXPECT_EQ(OracleSeed(""), 0xcbf29ce484222325ull);
}

TEST(MinicpmvOracleRule, SplitMix64) {
  // The first outputs of the reference splitmix64 generator seeded with 0 (its state
  // is x + k * 0x9E3779B97F4A7C15 before the k-th call).
  EXPECT_EQ(SplitMix64(0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(SplitMix64(0x9E3779B97F4A7C15ull), 0x6e789e6aa1b965f4ull);
}

TEST(MinicpmvOracleRule, WorkedExamples) {
  for (const Example& e : kExamples) {
    const OracleSample s = OracleRuleSample(e.seed, e.i, e.std, e.mean);
    SCOPED_TRACE(StrCat(e.tensor, " i=", e.i));
    EXPECT_EQ(s.z, e.z);
    EXPECT_EQ(s.u, e.u);  // exact: the doubles print as SPEC.md's repr
    EXPECT_EQ(s.w, e.w);
    EXPECT_EQ(std::bit_cast<uint32_t>(s.value), e.f32_bits);
  }
}

TEST(MinicpmvOracleRule, ScaleConstantsAreSpecs) {
  // a = std * sqrt(3) in one double multiply: SPEC.md's reprs.
  EXPECT_EQ(0.02 * std::sqrt(3.0), 0.034641016151377546);
  EXPECT_EQ(0.05 * std::sqrt(3.0), 0.08660254037844387);
}

// FillOracleValues gives the rule's values at any starting index (the writer fills a
// chunk at a time), 1 + rule(0.05) for LayerNorm weights and exactly 1 for kOne.
TEST(MinicpmvOracleRule, FillMatchesTheRuleAtAnyOffset) {
  const OracleTensor patch{"v.patch_embd.weight", {14, 14, 3, 64}, OracleValues::kStd002};
  std::vector<float> values(3);
  FillOracleValues(patch, 1, values);
  EXPECT_EQ(std::bit_cast<uint32_t>(values[0]), 0x3c7d4372u);
  EXPECT_EQ(std::bit_cast<uint32_t>(values[1]), 0x3cb16bf5u);
  EXPECT_EQ(std::bit_cast<uint32_t>(values[2]), 0xbcb1fc45u);
  const OracleTensor ln{"v.blk.0.ln1.weight", {64}, OracleValues::kOnePlusStd005};
  FillOracleValues(ln, 0, values);
  EXPECT_EQ(std::bit_cast<uint32_t>(values[0]), 0x3f8a47e1u);
  EXPECT_EQ(std::bit_cast<uint32_t>(values[2]), 0x3f772114u);
  const OracleTensor norm{"output_norm.weight", {3584}, OracleValues::kOne};
  FillOracleValues(norm, 100, values);
  for (float v : values) EXPECT_EQ(v, 1.0f);
}

// --- The vocabulary -----------------------------------------------------------------

TEST(MinicpmvOracleVocab, ReadsTheSharedVocab) {
  auto vocab = ReadOracleVocab(kVocabPath);
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  ASSERT_EQ(vocab->tokens.size(), 394u);
  ASSERT_EQ(vocab->token_type.size(), 394u);
  EXPECT_EQ(vocab->merges.size(), 120u);
  EXPECT_EQ(vocab->tokens[0], "\xC4\x80");  // U+0100: byte 0 in GPT-2's byte alphabet
  EXPECT_EQ(vocab->tokens[34], "\"");
  EXPECT_EQ(vocab->tokens[92], "\\");
  EXPECT_EQ(vocab->tokens[376], "<|endoftext|>");
  EXPECT_EQ(vocab->tokens[393], "</image_id>");
  EXPECT_EQ(vocab->token_type[0], 1);
  EXPECT_EQ(vocab->token_type[376], 3);
  EXPECT_EQ(vocab->token_type[379], 3);
  EXPECT_EQ(vocab->token_type[380], 4);
  EXPECT_EQ(vocab->merges[0], "\xC4\xA0 a");
}

TEST(MinicpmvOracleVocab, RejectsOtherShapes) {
  EXPECT_FALSE(ParseOracleVocab("[]").ok());
  EXPECT_FALSE(ParseOracleVocab(R"({"tokens": ["a"], "token_type": [1], "merges": []})").ok());
  auto missing = ParseOracleVocab(R"({"tokens": [], "token_type": []})");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("merges"), std::string_view::npos);
  auto absent = ReadOracleVocab("/nonexistent/vocab.json");
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(absent.status().message().find("/nonexistent/vocab.json"), std::string_view::npos);
}

// --- The header layout: SPEC.md sections 2 and 5 -------------------------------------

struct SpecKey {
  const char* key;
  GgufValueType type;
};

struct SpecTensor {
  const char* name;
  std::vector<uint64_t> dims;
  uint64_t offset;
};

const std::vector<SpecKey> kMmprojKeys = {
    {"general.architecture", GgufValueType::kString},
    {"clip.has_text_encoder", GgufValueType::kBool},
    {"clip.has_vision_encoder", GgufValueType::kBool},
    {"clip.has_minicpmv_projector", GgufValueType::kBool},
    {"general.file_type", GgufValueType::kUint32},
    {"general.description", GgufValueType::kString},
    {"clip.projector_type", GgufValueType::kString},
    {"clip.minicpmv_version", GgufValueType::kInt32},
    {"clip.vision.image_size", GgufValueType::kUint32},
    {"clip.vision.patch_size", GgufValueType::kUint32},
    {"clip.vision.embedding_length", GgufValueType::kUint32},
    {"clip.vision.feed_forward_length", GgufValueType::kUint32},
    {"clip.vision.projection_dim", GgufValueType::kUint32},
    {"clip.vision.attention.head_count", GgufValueType::kUint32},
    {"clip.vision.attention.layer_norm_epsilon", GgufValueType::kFloat32},
    {"clip.vision.block_count", GgufValueType::kUint32},
    {"clip.vision.image_mean", GgufValueType::kArray},
    {"clip.vision.image_std", GgufValueType::kArray},
    {"clip.use_gelu", GgufValueType::kBool},
};

const std::vector<SpecTensor> kMmprojTensors = {
    {"resampler.query", {3584, 64}, 0},
    {"resampler.kv.weight", {64, 3584}, 917504},
    {"resampler.attn.q.weight", {3584, 3584}, 1835008},
    {"resampler.attn.q.bias", {3584}, 53215232},
    {"resampler.attn.k.weight", {3584, 3584}, 53229568},
    {"resampler.attn.k.bias", {3584}, 104609792},
    {"resampler.attn.v.weight", {3584, 3584}, 104624128},
    {"resampler.attn.v.bias", {3584}, 156004352},
    {"resampler.attn.out.weight", {3584, 3584}, 156018688},
    {"resampler.attn.out.bias", {3584}, 207398912},
    {"resampler.ln_q.weight", {3584}, 207413248},
    {"resampler.ln_q.bias", {3584}, 207427584},
    {"resampler.ln_kv.weight", {3584}, 207441920},
    {"resampler.ln_kv.bias", {3584}, 207456256},
    {"resampler.ln_post.weight", {3584}, 207470592},
    {"resampler.ln_post.bias", {3584}, 207484928},
    {"resampler.pos_embed_k", {3584, 4900}, 207499264},
    {"resampler.proj.weight", {3584, 3584}, 277745664},
    {"v.patch_embd.weight", {14, 14, 3, 64}, 329125888},
    {"v.patch_embd.bias", {64}, 329276416},
    {"v.position_embd.weight", {64, 4900}, 329276672},
    {"v.blk.0.attn_q.weight", {64, 64}, 330531072},
    {"v.blk.0.attn_q.bias", {64}, 330547456},
    {"v.blk.0.attn_k.weight", {64, 64}, 330547712},
    {"v.blk.0.attn_k.bias", {64}, 330564096},
    {"v.blk.0.attn_v.weight", {64, 64}, 330564352},
    {"v.blk.0.attn_v.bias", {64}, 330580736},
    {"v.blk.0.attn_out.weight", {64, 64}, 330580992},
    {"v.blk.0.attn_out.bias", {64}, 330597376},
    {"v.blk.0.ln1.weight", {64}, 330597632},
    {"v.blk.0.ln1.bias", {64}, 330597888},
    {"v.blk.0.ln2.weight", {64}, 330598144},
    {"v.blk.0.ln2.bias", {64}, 330598400},
    {"v.blk.0.ffn_down.weight", {64, 128}, 330598656},
    {"v.blk.0.ffn_down.bias", {128}, 330631424},
    {"v.blk.0.ffn_up.weight", {128, 64}, 330631936},
    {"v.blk.0.ffn_up.bias", {64}, 330664704},
    {"v.blk.1.attn_q.weight", {64, 64}, 330664960},
    {"v.blk.1.attn_q.bias", {64}, 330681344},
    {"v.blk.1.attn_k.weight", {64, 64}, 330681600},
    {"v.blk.1.attn_k.bias", {64}, 330697984},
    {"v.blk.1.attn_v.weight", {64, 64}, 330698240},
    {"v.blk.1.attn_v.bias", {64}, 330714624},
    {"v.blk.1.attn_out.weight", {64, 64}, 330714880},
    {"v.blk.1.attn_out.bias", {64}, 330731264},
    {"v.blk.1.ln1.weight", {64}, 330731520},
    {"v.blk.1.ln1.bias", {64}, 330731776},
    {"v.blk.1.ln2.weight", {64}, 330732032},
    {"v.blk.1.ln2.bias", {64}, 330732288},
    {"v.blk.1.ffn_down.weight", {64, 128}, 330732544},
    {"v.blk.1.ffn_down.bias", {128}, 330765312},
    {"v.blk.1.ffn_up.weight", {128, 64}, 330765824},
    {"v.blk.1.ffn_up.bias", {64}, 330798592},
    {"v.post_ln.weight", {64}, 330798848},
    {"v.post_ln.bias", {64}, 330799104},
};

const std::vector<SpecKey> kLlmKeys = {
    {"general.architecture", GgufValueType::kString},
    {"general.name", GgufValueType::kString},
    {"general.file_type", GgufValueType::kUint32},
    {"qwen2.context_length", GgufValueType::kUint32},
    {"qwen2.embedding_length", GgufValueType::kUint32},
    {"qwen2.block_count", GgufValueType::kUint32},
    {"qwen2.feed_forward_length", GgufValueType::kUint32},
    {"qwen2.attention.head_count", GgufValueType::kUint32},
    {"qwen2.attention.head_count_kv", GgufValueType::kUint32},
    {"qwen2.rope.freq_base", GgufValueType::kFloat32},
    {"qwen2.attention.layer_norm_rms_epsilon", GgufValueType::kFloat32},
    {"tokenizer.ggml.model", GgufValueType::kString},
    {"tokenizer.ggml.pre", GgufValueType::kString},
    {"tokenizer.ggml.tokens", GgufValueType::kArray},
    {"tokenizer.ggml.token_type", GgufValueType::kArray},
    {"tokenizer.ggml.merges", GgufValueType::kArray},
    {"tokenizer.ggml.bos_token_id", GgufValueType::kUint32},
    {"tokenizer.ggml.eos_token_id", GgufValueType::kUint32},
    {"tokenizer.ggml.padding_token_id", GgufValueType::kUint32},
    {"tokenizer.ggml.unknown_token_id", GgufValueType::kUint32},
    {"tokenizer.ggml.add_bos_token", GgufValueType::kBool},
    {"tokenizer.chat_template", GgufValueType::kString},
};

const std::vector<SpecTensor> kLlmTensors = {
    {"token_embd.weight", {3584, 394}, 0},
    {"output_norm.weight", {3584}, 5648384},
    {"output.weight", {3584, 394}, 5662720},
    {"blk.0.attn_norm.weight", {3584}, 11311104},
    {"blk.0.attn_q.weight", {3584, 3584}, 11325440},
    {"blk.0.attn_q.bias", {3584}, 62705664},
    {"blk.0.attn_k.weight", {3584, 512}, 62720000},
    {"blk.0.attn_k.bias", {512}, 70060032},
    {"blk.0.attn_v.weight", {3584, 512}, 70062080},
    {"blk.0.attn_v.bias", {512}, 77402112},
    {"blk.0.attn_output.weight", {3584, 3584}, 77404160},
    {"blk.0.ffn_norm.weight", {3584}, 128784384},
    {"blk.0.ffn_gate.weight", {3584, 512}, 128798720},
    {"blk.0.ffn_up.weight", {3584, 512}, 136138752},
    {"blk.0.ffn_down.weight", {512, 3584}, 143478784},
};

struct SpecFile {
  uint64_t header_bytes;  // header + padding: where the data section starts
  uint64_t file_size;
  const std::vector<SpecKey>* keys;
  const std::vector<SpecTensor>* tensors;
};

const SpecFile kMmprojSpec = {3968, 330803328, &kMmprojKeys, &kMmprojTensors};
const SpecFile kLlmSpec = {9568, 150828384, &kLlmKeys, &kLlmTensors};

// The file's layout against SPEC.md: version, key order and types, no
// general.alignment, tensor infos in order with their dims, F32 and offsets, and the
// data section right after the header.
void ExpectLayout(const GgufFile& file, const SpecFile& spec) {
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.alignment(), 32u);
  EXPECT_EQ(file.data_offset(), spec.header_bytes);
  EXPECT_EQ(file.bytes().size(), spec.file_size);
  EXPECT_EQ(file.FindKey("general.alignment"), nullptr);
  ASSERT_EQ(file.metadata().size(), spec.keys->size());
  for (size_t k = 0; k < spec.keys->size(); ++k) {
    EXPECT_EQ(file.metadata()[k].key, (*spec.keys)[k].key) << "key #" << k;
    EXPECT_EQ(file.metadata()[k].value.type, (*spec.keys)[k].type) << (*spec.keys)[k].key;
  }
  ASSERT_EQ(file.tensors().size(), spec.tensors->size());
  for (size_t k = 0; k < spec.tensors->size(); ++k) {
    const format::GgufTensorInfo& t = file.tensors()[k];
    const SpecTensor& want = (*spec.tensors)[k];
    EXPECT_EQ(t.name, want.name) << "tensor #" << k;
    EXPECT_EQ(t.dims, want.dims) << want.name;
    EXPECT_EQ(t.type, format::GgmlType::kF32) << want.name;
    EXPECT_EQ(t.offset, want.offset) << want.name;
  }
  const format::GgufTensorInfo& last = file.tensors().back();
  EXPECT_EQ(spec.header_bytes + last.offset + last.n_bytes, spec.file_size);
}

// Writes just the header of `plan` (a stream closed before any data), then extends
// the file with a hole to the full size so that the reader accepts it.
std::unique_ptr<GgufFile> OpenHeaderOnly(const OracleFile& plan, const std::string& path,
                                         uint64_t* header_bytes) {
  {
    auto stream = plan.writer->OpenStream(path);
    EXPECT_TRUE(stream.ok()) << stream.status();
  }
  *header_bytes = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, plan.writer->FileSize());
  auto file = GgufFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? *std::move(file) : nullptr;
}

TEST(MinicpmvOracleLayout, MmprojHeader) {
  auto plan = PlanMinicpmv26Mmproj();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->file_name, "mmproj-minicpmv26-tiny-f32.gguf");
  EXPECT_EQ(plan->writer->FileSize(), 330803328u);
  const std::string path = TempPath("oracle_mmproj_header.gguf");
  uint64_t header_bytes = 0;
  std::unique_ptr<GgufFile> file = OpenHeaderOnly(*plan, path, &header_bytes);
  EXPECT_EQ(header_bytes, 3968u);
  if (file != nullptr) ExpectLayout(*file, kMmprojSpec);
  std::filesystem::remove(path);
}

TEST(MinicpmvOracleLayout, LlmHeader) {
  auto vocab = ReadOracleVocab(kVocabPath);
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  auto plan = PlanMinicpmv26Llm(*vocab);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->file_name, "llm-minicpmv26-tiny.gguf");
  EXPECT_EQ(plan->writer->FileSize(), 150828384u);
  const std::string path = TempPath("oracle_llm_header.gguf");
  uint64_t header_bytes = 0;
  std::unique_ptr<GgufFile> file = OpenHeaderOnly(*plan, path, &header_bytes);
  EXPECT_EQ(header_bytes, 9568u);
  if (file != nullptr) ExpectLayout(*file, kLlmSpec);
  std::filesystem::remove(path);
}

// --- Errors -------------------------------------------------------------------------

TEST(MinicpmvOracleErrors, MissingDirectory) {
  auto paths = WriteMinicpmv26Oracle("/nonexistent/oracle", kVocabPath);
  ASSERT_FALSE(paths.ok());
  EXPECT_EQ(paths.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(paths.status().message().find("'/nonexistent/oracle' does not exist"),
            std::string_view::npos)
      << paths.status();
}

TEST(MinicpmvOracleErrors, NotADirectory) {
  auto paths = WriteMinicpmv26Oracle(kVocabPath, kVocabPath);
  ASSERT_FALSE(paths.ok());
  EXPECT_EQ(paths.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(paths.status().message().find("is not a directory"), std::string_view::npos)
      << paths.status();
}

// A directory where the mmproj file should go: it cannot be created (even by root),
// and the error names it.
TEST(MinicpmvOracleErrors, UnwritableFile) {
  const std::string dir = TempPath("oracle_unwritable");
  std::filesystem::create_directories(dir + "/mmproj-minicpmv26-tiny-f32.gguf");
  auto paths = WriteMinicpmv26Oracle(dir, kVocabPath);
  ASSERT_FALSE(paths.ok());
  EXPECT_NE(paths.status().message().find("mmproj-minicpmv26-tiny-f32.gguf"),
            std::string_view::npos)
      << paths.status();
  EXPECT_FALSE(std::filesystem::exists(dir + "/llm-minicpmv26-tiny.gguf"));
  // What was in the way is not the tool's to remove.
  EXPECT_TRUE(std::filesystem::is_directory(dir + "/mmproj-minicpmv26-tiny-f32.gguf"));
  std::filesystem::remove_all(dir);
}

TEST(MinicpmvOracleErrors, MissingVocab) {
  const std::string dir = TempPath("oracle_no_vocab");
  std::filesystem::create_directories(dir);
  auto paths = WriteMinicpmv26Oracle(dir, "/nonexistent/vocab.json");
  ASSERT_FALSE(paths.ok());
  EXPECT_NE(paths.status().message().find("/nonexistent/vocab.json"), std::string_view::npos);
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}

// --- MD5 (the helper the slow test checks the files with): RFC 1321's test suite ----

TEST(Md5, Rfc1321Suite) {
  auto md5 = [](std::string_view s) {
    test_util::Md5 m;
    m.Update(std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
    return m.HexDigest();
  };
  EXPECT_EQ(md5(""), "d41d8cd98f00b204e9800998ecf8427e");
  EXPECT_EQ(md5("a"), "0cc175b9c0f1b6a831c399e269772661");
  EXPECT_EQ(md5("abc"), "900150983cd24fb0d6963f7d28e17f72");
  EXPECT_EQ(md5("message digest"), "f96b697d7cb7938d525a2f31aaf161d0");
  EXPECT_EQ(md5("abcdefghijklmnopqrstuvwxyz"), "c3fcd3d76192e4007dfb496cca67e13b");
  EXPECT_EQ(md5("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"),
            "d174ab98d277d9f5a5611c2c9f419d9f");
  EXPECT_EQ(md5("1234567890123456789012345678901234567890123456789012345678901234567890123456"
                "7890"),
            "57edf4a22be3c955ac49da2e2107b67a");
  // In pieces that straddle the 64-byte blocks.
  test_util::Md5 pieces;
  const std::string s(200, 'x');
  for (size_t at = 0; at < s.size(); at += 37) {
    const std::string_view piece = std::string_view(s).substr(at, 37);
    pieces.Update(std::span(reinterpret_cast<const uint8_t*>(piece.data()), piece.size()));
  }
  EXPECT_EQ(pieces.HexDigest(), md5(s));
}

// --- The whole pair (slow: 480 MB written) --------------------------------------------

float ValueAt(const GgufFile& file, std::string_view tensor, uint64_t i) {
  const format::GgufTensorInfo* t = file.FindTensor(tensor);
  EXPECT_NE(t, nullptr) << tensor;
  if (t == nullptr || (i + 1) * 4 > t->n_bytes) return 0;
  uint32_t bits = 0;
  const std::span<const uint8_t> data = file.TensorData(*t);
  for (int b = 0; b < 4; ++b) bits |= static_cast<uint32_t>(data[4 * i + b]) << (8 * b);
  return std::bit_cast<float>(bits);
}

TEST(MinicpmvOracleSlowTest, BothFilesHaveSpecsMd5AndReadBack) {
  const std::string dir = TempPath("oracle_pair");
  std::filesystem::create_directories(dir);
  auto paths = WriteMinicpmv26Oracle(dir, kVocabPath);
  ASSERT_TRUE(paths.ok()) << paths.status();
  ASSERT_EQ(paths->size(), 2u);
  EXPECT_EQ((*paths)[0], dir + "/mmproj-minicpmv26-tiny-f32.gguf");
  EXPECT_EQ((*paths)[1], dir + "/llm-minicpmv26-tiny.gguf");
  EXPECT_EQ(std::filesystem::file_size((*paths)[0]), 330803328u);
  EXPECT_EQ(std::filesystem::file_size((*paths)[1]), 150828384u);
  EXPECT_EQ(test_util::Md5File((*paths)[0]), "615516e923d9f393608d16e71d045c60");
  EXPECT_EQ(test_util::Md5File((*paths)[1]), "a4e3e223e0ec72ded77684fa77f04313");

  auto mmproj = GgufFile::Open((*paths)[0]);
  ASSERT_TRUE(mmproj.ok()) << mmproj.status();
  ExpectLayout(**mmproj, kMmprojSpec);
  EXPECT_EQ((*mmproj)->GetString("general.architecture").value(), "clip");
  EXPECT_EQ((*mmproj)->GetString("clip.projector_type").value(), "resampler");
  EXPECT_EQ((*mmproj)->GetInt("clip.minicpmv_version").value(), 3);
  EXPECT_EQ((*mmproj)->GetBool("clip.has_text_encoder").value(), false);
  EXPECT_EQ((*mmproj)->GetFloat("clip.vision.attention.layer_norm_epsilon").value(),
            static_cast<double>(1e-6f));
  EXPECT_EQ((*mmproj)->GetFloatArray("clip.vision.image_mean").value(),
            (std::vector<float>{0.5f, 0.5f, 0.5f}));
  EXPECT_EQ(std::bit_cast<uint32_t>(ValueAt(**mmproj, "v.patch_embd.weight", 3)), 0xbcb1fc45u);
  EXPECT_EQ(std::bit_cast<uint32_t>(ValueAt(**mmproj, "resampler.query", 0)), 0xbd032e75u);
  EXPECT_EQ(std::bit_cast<uint32_t>(ValueAt(**mmproj, "v.blk.0.ln1.weight", 1)), 0x3f7ca81cu);

  auto llm = GgufFile::Open((*paths)[1]);
  ASSERT_TRUE(llm.ok()) << llm.status();
  ExpectLayout(**llm, kLlmSpec);
  EXPECT_EQ((*llm)->GetString("general.architecture").value(), "qwen2");
  EXPECT_EQ((*llm)->GetUint("qwen2.embedding_length").value(), 3584u);
  EXPECT_EQ((*llm)->GetFloat("qwen2.rope.freq_base").value(), 1e6);
  auto tokens = (*llm)->GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 394u);
  EXPECT_EQ((*tokens)[377], "<|im_start|>");
  auto types = (*llm)->GetIntArray("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.ok()) << types.status();
  EXPECT_EQ((*types)[378], 3);
  EXPECT_EQ((*types)[385], 4);
  EXPECT_EQ((*llm)->GetStringArray("tokenizer.ggml.merges").value().size(), 120u);
  EXPECT_EQ((*llm)->GetUint("tokenizer.ggml.eos_token_id").value(), 378u);
  EXPECT_EQ(std::bit_cast<uint32_t>(ValueAt(**llm, "token_embd.weight", 2)), 0x3c486738u);
  EXPECT_EQ(ValueAt(**llm, "blk.0.ffn_norm.weight", 3583), 1.0f);

  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moert::synth
