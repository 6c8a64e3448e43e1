// The decoder's KV cache of one sequence: keys and values of every layer in anonymous
// memory of their own, committed page by page as positions fill (a session's cache
// costs what it holds, not its capacity) and given back by Release. Its full capacity is
// reserved in the model's memory budget (memory/budget.h) for as long as it lives, so
// every session's cache is inside the budget.
#ifndef MOERT_MODEL_KV_CACHE_H_
#define MOERT_MODEL_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "backend/backend.h"
#include "format/model_spec.h"
#include "memory/budget.h"
#include "model/graph.h"
#include "model/model.h"

namespace moert::model {

int64_t KeyWidth(const format::ModelSpec& spec);
int64_t ValueWidth(const format::ModelSpec& spec);

// The element types of a cache's keys and values (backend/kv_type.h).
struct KvTypes {
  backend::KvType k = backend::KvType::kF32;
  backend::KvType v = backend::KvType::kF32;
};
// The bytes of one row of `width` values of `type` (a width backend::KvRowBytes took).
size_t KvRowSize(backend::KvType type, int64_t width);
// The bytes of a cache of `positions` positions.
uint64_t KvCacheBytes(const format::ModelSpec& spec, uint64_t positions, KvTypes types = {});

// Layer-major rows of the cache's types: layer l's keys are [capacity] rows of
// n_head_kv * head_dim_k values, held as CPU buffers the layer graph addresses. The
// host spans of SequenceKv (float rows for a device's copy) are set for f32 caches only.
class DecoderKvCache final : public KvCache {
 public:
  // A cache of `capacity` positions reserved in `budget` (may be null: not counted).
  // InvalidArgument for a capacity outside [1, 2^22] or above 64 GiB; ResourceExhausted
  // when the budget cannot hold it (naming the numbers) or the memory cannot be mapped.
  static absl::StatusOr<std::unique_ptr<DecoderKvCache>> Create(
      backend::Backend& cpu, const format::ModelSpec& spec, KvTypes types, int capacity,
      std::shared_ptr<memory::MemoryBudget> budget);
  ~DecoderKvCache() override;
  DecoderKvCache(const DecoderKvCache&) = delete;
  DecoderKvCache& operator=(const DecoderKvCache&) = delete;

  int capacity() const override { return capacity_; }
  int size() const override { return size_; }
  void Truncate(int n) override;
  void Release() override;
  uint64_t bytes() const override { return bytes_; }
  absl::Status ReadF32(int layer, int positions, std::vector<float>* keys,
                       std::vector<float>* values, int64_t* key_width,
                       int64_t* value_width) const override;

  bool Fits(const format::ModelSpec& spec, KvTypes types) const;
  void set_size(int n) { size_ = n; }
  // Distinct per cache object (a device's copy names its cache).
  uint64_t id() const { return id_; }
  SequenceKv Sequence() const;

 private:
  DecoderKvCache(const format::ModelSpec& spec, KvTypes types, int capacity, uint64_t bytes,
                 std::shared_ptr<memory::MemoryBudget> budget);

  uint64_t id_;
  int capacity_;
  int n_layer_;
  int64_t k_width_;
  int64_t v_width_;
  KvTypes types_;
  int size_ = 0;
  uint64_t bytes_ = 0;  // reserved in the budget
  std::shared_ptr<memory::MemoryBudget> budget_;
  uint8_t* map_ = nullptr;  // keys of every layer, then values
  size_t map_bytes_ = 0;
  std::unique_ptr<backend::Buffer> k_buffer_, v_buffer_;
  std::vector<float*> key_rows_, value_rows_;  // per layer
};

}  // namespace moert::model

#endif  // MOERT_MODEL_KV_CACHE_H_
