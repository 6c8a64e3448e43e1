// libFuzzer target past the GGUF reader: each input is a valid small GGUF model with
// mutated metadata values, key types, tensor shapes, types and data (model_case.h),
// read back by format::GgufFile, loaded by model::Model::Load (the integer kernels or
// the fp32 reference, with or without an expert pool, a budget, prefetch, router
// adjustments) and run for a prefill and a decode step. An error is a fine answer when
// it is a Status with a message; a crash, a sanitizer report, an allocation above
// libFuzzer's -malloc_limit_mb or a broken invariant (logits and KV cache sizes) is a
// bug. Build and run with scripts/run-fuzz.sh.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/model.h"
#include "model_case.h"

namespace {

using moert::format::GgufFile;
using moert::fuzz::ModelCase;

// Not assert(): the fuzz build may define NDEBUG, and these must always hold.
void Check(bool condition) {
  if (!condition) std::abort();
}

// MOERT_FUZZ_VERBOSE=1: every stage's result on stderr (to see what a seed reaches).
void Report(const char* stage, const absl::Status& status) {
  static const bool verbose = std::getenv("MOERT_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "  %s: %s\n", stage, status.ToString().c_str());
}

// An error must say what is wrong; Internal and Unknown mean moert lost track.
void CheckError(const absl::Status& status) {
  Check(!status.ok());
  Check(!status.message().empty());
  Check(status.code() != absl::StatusCode::kInternal &&
        status.code() != absl::StatusCode::kUnknown);
}

// The file an expert pool reads experts from, one per fuzzer process.
const std::string& ModelPath() {
  static const std::string* path = [] {
    const char* tmp = std::getenv("TMPDIR");
    auto* p = new std::string(std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                              "/moert-model-fuzzer-" + std::to_string(getpid()) + ".gguf");
    std::atexit([] { std::remove(ModelPath().c_str()); });
    return p;
  }();
  return *path;
}

absl::StatusOr<std::unique_ptr<GgufFile>> OpenCase(const ModelCase& c) {
  if (!c.on_disk) return GgufFile::FromBuffer(c.gguf, "fuzz-model.gguf");
  std::FILE* f = std::fopen(ModelPath().c_str(), "wb");
  Check(f != nullptr);
  Check(std::fwrite(c.gguf.data(), 1, c.gguf.size(), f) == c.gguf.size());
  Check(std::fclose(f) == 0);
  return GgufFile::Open(ModelPath());
}

// One Forward; on success the logits and the cache grew as Forward says, on error the
// cache is unchanged.
bool Run(moert::model::Model& model, moert::model::KvCache& cache, std::span<const int32_t> tokens,
         const ModelCase& c, std::vector<float>& logits) {
  const int before = cache.size();
  moert::model::ForwardInput input;
  input.tokens = tokens;
  input.image_share = c.image_share;
  const absl::Status status = model.Forward(input, &cache, c.logits, &logits);
  Report("forward", status);
  if (!status.ok()) {
    CheckError(status);
    Check(cache.size() == before);
    return false;
  }
  const size_t rows = c.logits == moert::model::LogitsFor::kAll ? tokens.size() : 1;
  Check(logits.size() == rows * model.spec().n_vocab);
  Check(cache.size() == before + static_cast<int>(tokens.size()));
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<ModelCase> c = moert::fuzz::BuildModelCase(std::span(data, size));
  if (!c) return -1;  // past the fuzzer's data cap: not worth keeping
  auto file = OpenCase(*c);
  Report("read", file.status());
  if (!file.ok()) {
    CheckError(file.status());
    return 0;
  }
  auto model = moert::model::Model::Load(**file, c->options);
  Report("load", model.status());
  if (!model.ok()) {
    CheckError(model.status());
    return 0;
  }
  auto cache = (*model)->NewKvCache(c->n_ctx);
  Report("kv cache", cache.status());
  if (!cache.ok()) {
    CheckError(cache.status());
    return 0;
  }
  std::vector<float> logits;
  if (Run(**model, **cache, c->prompt, *c, logits)) {
    Run(**model, **cache, std::span(&c->next_token, 1), *c, logits);
  }
  return 0;
}
