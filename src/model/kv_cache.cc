// The decoder's KV cache (kv_cache.h).
#include "model/kv_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/status.h"
#include "core/strings.h"

namespace moert::model {

namespace {

// Caps on a cache: far above what a device can hold, low enough to catch a mistaken size
// before it turns into an allocation failure.
constexpr int kMaxCacheContext = 1 << 22;
constexpr uint64_t kMaxCacheBytes = uint64_t{64} << 30;

uint64_t NextId() {
  static std::atomic<uint64_t> next{1};
  return next++;
}

}  // namespace

int64_t KeyWidth(const format::ModelSpec& spec) {
  return int64_t{spec.n_head_kv} * spec.head_dim_k;
}
int64_t ValueWidth(const format::ModelSpec& spec) {
  return int64_t{spec.n_head_kv} * spec.head_dim_v;
}

size_t KvRowSize(backend::KvType type, int64_t width) {
  // The model checked its widths with KvRowBytes at load.
  const absl::StatusOr<size_t> bytes = backend::KvRowBytes(type, width);
  return bytes.ok() ? *bytes : 0;
}

uint64_t KvCacheBytes(const format::ModelSpec& spec, uint64_t positions, KvTypes types) {
  return positions * spec.n_layer *
         uint64_t(KvRowSize(types.k, KeyWidth(spec)) + KvRowSize(types.v, ValueWidth(spec)));
}

DecoderKvCache::DecoderKvCache(const format::ModelSpec& spec, KvTypes types, int capacity,
                               uint64_t bytes, std::shared_ptr<memory::MemoryBudget> budget)
    : id_(NextId()),
      capacity_(capacity),
      n_layer_(static_cast<int>(spec.n_layer)),
      k_width_(KeyWidth(spec)),
      v_width_(ValueWidth(spec)),
      types_(types),
      bytes_(bytes),
      budget_(std::move(budget)) {}

absl::StatusOr<std::unique_ptr<DecoderKvCache>> DecoderKvCache::Create(
    backend::Backend& cpu, const format::ModelSpec& spec, KvTypes types, int capacity,
    std::shared_ptr<memory::MemoryBudget> budget) {
  if (capacity < 1 || capacity > kMaxCacheContext) {
    return absl::InvalidArgumentError(
        StrCat("KV cache size ", capacity, " is outside [1, ", kMaxCacheContext, "]"));
  }
  const uint64_t bytes = KvCacheBytes(spec, static_cast<uint64_t>(capacity), types);
  if (bytes > kMaxCacheBytes) {
    return absl::InvalidArgumentError(StrCat("a KV cache of ", capacity, " positions needs ", bytes,
                                             " bytes, above the cap of ", kMaxCacheBytes));
  }
  if (budget != nullptr) {
    MOERT_RETURN_IF_ERROR(
        budget->ReserveKv(bytes, StrCat("a KV cache of ", capacity, " positions")));
  }
  // From here the destructor gives the reservation back.
  std::unique_ptr<DecoderKvCache> cache(new DecoderKvCache(spec, types, capacity, bytes, budget));
  const uint64_t k_bytes =
      uint64_t(capacity) * spec.n_layer * KvRowSize(types.k, cache->k_width_);
  const uint64_t v_bytes = bytes - k_bytes;
  cache->map_bytes_ = static_cast<size_t>(std::max<uint64_t>(bytes, 1));
  void* map = mmap(nullptr, cache->map_bytes_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (map == MAP_FAILED) {
    const int err = errno;
    cache->map_bytes_ = 0;
    return absl::ResourceExhaustedError(StrCat("cannot map a KV cache of ", capacity,
                                               " positions (", bytes, " bytes): ",
                                               std::strerror(err)));
  }
  cache->map_ = static_cast<uint8_t*>(map);
  MOERT_ASSIGN_OR_RETURN(cache->k_buffer_, cpu.WrapHost(cache->map_, static_cast<size_t>(k_bytes)));
  MOERT_ASSIGN_OR_RETURN(cache->v_buffer_,
                         cpu.WrapHost(cache->map_ + k_bytes, static_cast<size_t>(v_bytes)));
  if (types.k != backend::KvType::kF32 || types.v != backend::KvType::kF32) return cache;
  float* keys = reinterpret_cast<float*>(cache->map_);
  float* values = reinterpret_cast<float*>(cache->map_ + k_bytes);
  for (int l = 0; l < cache->n_layer_; ++l) {
    cache->key_rows_.push_back(keys + int64_t{l} * capacity * cache->k_width_);
    cache->value_rows_.push_back(values + int64_t{l} * capacity * cache->v_width_);
  }
  return cache;
}

DecoderKvCache::~DecoderKvCache() {
  k_buffer_.reset();
  v_buffer_.reset();
  if (map_ != nullptr) munmap(map_, map_bytes_);
  if (budget_ != nullptr) budget_->ReleaseKv(bytes_);
}

void DecoderKvCache::Truncate(int n) { size_ = std::clamp(n, 0, size_); }

void DecoderKvCache::Release() {
  size_ = 0;
  // The pages read as zeros again and leave the resident set; the budget keeps the
  // reservation, so the sequence can be evaluated again.
  if (map_ != nullptr) madvise(map_, map_bytes_, MADV_DONTNEED);
}

absl::Status DecoderKvCache::ReadF32(int layer, int positions, std::vector<float>* keys,
                                     std::vector<float>* values, int64_t* key_width,
                                     int64_t* value_width) const {
  if (key_rows_.empty()) {
    return absl::UnimplementedError(StrCat("a KV cache of ", backend::KvTypeName(types_.k), " keys and ",
                                           backend::KvTypeName(types_.v), " values is not f32"));
  }
  if (layer < 0 || layer >= n_layer_ || positions < 0 || positions > size_) {
    return absl::OutOfRangeError(StrCat("KV cache: layer ", layer, " positions ", positions, " of ",
                                        n_layer_, " layers and ", size_, " positions"));
  }
  const float* k = key_rows_[static_cast<size_t>(layer)];
  const float* v = value_rows_[static_cast<size_t>(layer)];
  keys->assign(k, k + int64_t{positions} * k_width_);
  values->assign(v, v + int64_t{positions} * v_width_);
  *key_width = k_width_;
  *value_width = v_width_;
  return absl::OkStatus();
}

bool DecoderKvCache::Fits(const format::ModelSpec& spec, KvTypes types) const {
  return n_layer_ == static_cast<int>(spec.n_layer) && k_width_ == KeyWidth(spec) &&
         v_width_ == ValueWidth(spec) && types_.k == types.k && types_.v == types.v;
}

SequenceKv DecoderKvCache::Sequence() const {
  SequenceKv kv;
  kv.host.id = id_;
  kv.host.capacity = capacity_;
  kv.host.keys = key_rows_;
  kv.host.values = value_rows_;
  kv.keys = k_buffer_.get();
  kv.values = v_buffer_.get();
  return kv;
}

}  // namespace moert::model
