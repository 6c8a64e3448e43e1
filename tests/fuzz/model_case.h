// The model fuzzer's input format: a fuzz input turned into a valid small GGUF model
// (a tiny llama, qwen2, qwen2moe, qwen3, qwen3moe or olmoe of a few layers, written
// with format::GgufWriter) whose metadata values and key types, tensor shapes, types
// and data the input's bytes mutate, and the options and tokens to load and run it.
//
// Every byte past the end of the input reads as 0, and 0 always means "as the valid
// model has it": the empty input is a valid model that loads and runs, and each
// mutation costs the fuzzer a few bytes. The layout is in model_case.cc.
#ifndef MOERT_TESTS_FUZZ_MODEL_CASE_H_
#define MOERT_TESTS_FUZZ_MODEL_CASE_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "model/model.h"

namespace moert::fuzz {

// The input's tensor data is capped (the fuzzer's own limit, so that it spends its
// time in the library rather than in writing files): larger plans are skipped.
inline constexpr uint64_t kMaxTensorBytes = uint64_t{1} << 20;

struct ModelCase {
  std::vector<uint8_t> gguf;        // the whole file
  bool on_disk = false;             // an expert pool reads experts from a file by path
  model::ModelLoadOptions options;  // threads 1
  std::vector<int32_t> prompt;      // the first Forward (prefill)
  int32_t next_token = 0;           // a second, one-token Forward (decode)
  int n_ctx = 8;                    // the KV cache's positions
  model::LogitsFor logits = model::LogitsFor::kLast;
  float image_share = 0;
};

// nullopt when the input's tensors need more than kMaxTensorBytes.
std::optional<ModelCase> BuildModelCase(std::span<const uint8_t> input);

}  // namespace moert::fuzz

#endif  // MOERT_TESTS_FUZZ_MODEL_CASE_H_
