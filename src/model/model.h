// The reference forward pass: plain C++ fp32 math on weights dequantized at load.
// It stays in the tree as the oracle every fast path (kernels, expert cache,
// pipeline) is tested against. One file per architecture (model/arch_*.cc) over the
// shared building blocks in model/layers.h (RMSNorm, RoPE, attention, MoE FFN).
#ifndef MOERT_MODEL_MODEL_H_
#define MOERT_MODEL_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "format/gguf.h"
#include "format/model_spec.h"

namespace moert::model {

// The KV cache of one sequence: for every layer, K and V rows for positions
// [0, capacity). Position p of layer l holds the keys/values of the token at p.
class KvCache {
 public:
  virtual ~KvCache() = default;
  virtual int capacity() const = 0;  // positions it can hold (the context length)
  // Forgets positions >= n (n <= capacity); the next Forward continues at n.
  virtual void Truncate(int n) = 0;
  virtual int size() const = 0;      // positions filled so far
};

struct ModelLoadOptions {
  // Compute threads (pthreadpool; the calling thread is one of them); 0: one per core;
  // negative: InvalidArgument. Results do not depend on it, bit for bit.
  int threads = 1;
  // Called during loading with the fraction done in [0, 1].
  std::function<void(float)> progress;
};

enum class LogitsFor {
  kLast,  // only the last token's logits: n_vocab floats
  kAll,   // every token's logits: n_tokens * n_vocab floats, token-major
};

class Model {
 public:
  virtual ~Model() = default;

  // Loads the model `file` describes (any supported architecture, any dequantizable
  // tensor type). `file` must outlive the model only during the call: weights are
  // copied out (dequantized). Errors name the tensor or key at fault: Unimplemented
  // for a tensor type that cannot be dequantized and for YaRN RoPE scaling,
  // ResourceExhausted when the fp32 weights do not fit in memory.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const format::GgufFile& file,
                                                     const ModelLoadOptions& options = {});

  virtual const format::ModelSpec& spec() const = 0;

  // A KV cache for `n_ctx` positions (InvalidArgument if n_ctx < 1 or above a cap).
  virtual absl::StatusOr<std::unique_ptr<KvCache>> NewKvCache(int n_ctx) const = 0;

  // Runs `tokens` at positions cache->size() .. cache->size() + tokens.size() - 1 in
  // one batch (prefill when many, decode when one), appends their keys/values to
  // `cache` and writes logits to `logits` (resized). OutOfRange naming both numbers
  // when the positions would pass the cache's capacity; InvalidArgument for an empty
  // batch, a token id outside the vocabulary or a cache another model made. On error
  // the cache is unchanged. A batch gives the same logits, bit for bit, as its tokens
  // one at a time.
  virtual absl::Status Forward(std::span<const int32_t> tokens, KvCache* cache, LogitsFor which,
                               std::vector<float>* logits) = 0;
};

}  // namespace moert::model

#endif  // MOERT_MODEL_MODEL_H_
