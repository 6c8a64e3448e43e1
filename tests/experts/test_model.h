// A small GGUF of routed-expert tensors only, for the experts module's tests: every
// layer's gate/up/down stacked tensors of random values in the layer's type.
#ifndef MOERT_TESTS_EXPERTS_TEST_MODEL_H_
#define MOERT_TESTS_EXPERTS_TEST_MODEL_H_

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/matrix.h"
#include "backend/packing.h"
#include "experts/expert_directory.h"
#include "format/ggml_types.h"
#include "format/gguf.h"

namespace moert::experts::testing {

struct TestModelOptions {
  int n_expert = 4;
  int64_t n_embd = 256;
  int64_t n_ff = 128;
  // One type per layer (also the layer count).
  std::vector<format::GgmlType> layer_types = {format::GgmlType::kQ8_0,
                                               format::GgmlType::kQ8_0};
  bool write_checksums = false;  // the kChecksumKey metadata
  // Layers written as moert-pack writes them: each expert packed (backend::PackRows of
  // the layer's type into its natural layout) under moert's packed type ids.
  std::vector<int> packed_layers;
};

// A written test model: its path, the open file and its directory.
struct TestModel {
  std::string path;
  std::unique_ptr<format::GgufFile> file;
  TestModelOptions options;

  ExpertDirectory Directory() const;
  // The expert's block as the loader must produce it (PackRows of the file bytes).
  std::vector<uint8_t> ExpectedBlock(int layer, int expert) const;
};

// Writes a test model to `dir`/`name`; fails the test on error.
TestModel WriteTestModel(const std::string& dir, const std::string& name,
                         const TestModelOptions& options = {});

// A fresh empty folder under the test temp dir.
std::string TempDir(const std::string& name);

// A loader's destination: `bytes` bytes, 64-byte aligned.
struct Block {
  explicit Block(uint64_t bytes)
      : data(static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64))), size(bytes) {}
  ~Block() { std::free(data); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  std::vector<uint8_t> bytes() const { return {data, data + size}; }
  uint8_t* data;
  uint64_t size;
};

// The block an expert cache handed out (its gate part starts it), `runtime_bytes` long.
inline std::vector<uint8_t> ViewBytes(const backend::FfnView& v, uint64_t runtime_bytes) {
  return {v.gate.data, v.gate.data + runtime_bytes};
}

}  // namespace moert::experts::testing

#endif  // MOERT_TESTS_EXPERTS_TEST_MODEL_H_
