// The MiniCPM-V 2.6 oracle pair (../shared/mmproj/SPEC.md): a tiny vision projector
// in llama.cpp's clip format (mmproj, minicpmv_version 3) and a one-layer qwen2 LLM
// of width 3584, whose every weight is a pure function of the tensor name and the
// element index. moert-synth --preset minicpmv26-oracle writes both files byte for
// byte as gguf-py wrote the reference pair, so llama.cpp's outputs in reference.txt
// apply to them. Tensor data is generated and streamed a chunk at a time.
#ifndef MOERT_TOOLS_MINICPMV_ORACLE_H_
#define MOERT_TOOLS_MINICPMV_ORACLE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "format/gguf_writer.h"

namespace moert::synth {

inline constexpr std::string_view kMinicpmv26OraclePreset = "minicpmv26-oracle";
inline constexpr std::string_view kMinicpmv26MmprojFile = "mmproj-minicpmv26-tiny-f32.gguf";
inline constexpr std::string_view kMinicpmv26LlmFile = "llm-minicpmv26-tiny.gguf";

// --- The weight rule (SPEC.md section 1) -------------------------------------------

// FNV-1a-64 over the bytes of a GGUF tensor name.
uint64_t OracleSeed(std::string_view tensor_name);
uint64_t SplitMix64(uint64_t x);

// Element i of a tensor whose seed is `seed`, with each step of the rule kept for
// the known-answer tests: z = splitmix64(seed + i), u = z's top 53 bits in [0, 1),
// w = mean + std*sqrt(3)*(2u - 1) in double (mean added only when nonzero), and the
// value, w rounded to float.
struct OracleSample {
  uint64_t z;
  double u;
  double w;
  float value;
};
OracleSample OracleRuleSample(uint64_t seed, uint64_t i, double std, double mean);

// How a tensor's values are produced.
enum class OracleValues {
  kStd002,         // rule(std=0.02), mean 0
  kOnePlusStd005,  // 1.0 + rule(std=0.05): the mmproj's LayerNorm weights
  kOne,            // constant 1.0: the LLM's RMSNorm weights
};

struct OracleTensor {
  std::string name;
  std::vector<uint64_t> dims;  // ggml order, ne0 fastest; every tensor is F32
  OracleValues values;
  uint64_t n_elements() const;
};

// Fills `out` with elements [first, first + out.size()) of `tensor`.
void FillOracleValues(const OracleTensor& tensor, uint64_t first, std::span<float> out);

// --- The tokenizer arrays (vocab.json) ---------------------------------------------

struct OracleVocab {
  std::vector<std::string> tokens;  // 394
  std::vector<int32_t> token_type;  // one per token
  std::vector<std::string> merges;  // "a b"
};

// InvalidArgument naming what is wrong for JSON that is not an object with arrays
// `tokens` (394 strings), `token_type` (as many integers) and `merges` (strings).
absl::StatusOr<OracleVocab> ParseOracleVocab(std::string_view json);
// The file at `path`; NotFound or another error naming the path when it cannot be read.
absl::StatusOr<OracleVocab> ReadOracleVocab(const std::string& path);

// --- The two files -----------------------------------------------------------------

// One file of the pair, planned: every key set and every tensor declared, in file
// order; the data comes in WriteOracleFile.
struct OracleFile {
  std::string file_name;
  std::unique_ptr<format::GgufWriter> writer;
  std::vector<OracleTensor> tensors;
};

absl::StatusOr<OracleFile> PlanMinicpmv26Mmproj();
absl::StatusOr<OracleFile> PlanMinicpmv26Llm(const OracleVocab& vocab);

// Writes `file` to `path`, generating its tensor data a chunk at a time. Errors name
// the path; on error the incomplete file is removed.
absl::Status WriteOracleFile(const OracleFile& file, const std::string& path);

// Both files, into the existing directory `out_dir`, with the tokenizer arrays of the
// vocab.json at `vocab_path`. Returns the paths written (mmproj first). NotFound or
// FailedPrecondition naming `out_dir` when it is missing or not a directory.
absl::StatusOr<std::vector<std::string>> WriteMinicpmv26Oracle(const std::string& out_dir,
                                                               const std::string& vocab_path);

}  // namespace moert::synth

#endif  // MOERT_TOOLS_MINICPMV_ORACLE_H_
