// A device's copy of a host KV cache (see device_kv.h).
#include "backend/device_kv.h"

#include <algorithm>

#include "core/fp16.h"
#include "core/status.h"

namespace moert::backend {

DeviceKv::DeviceKv(Backend& backend, int n_layer, int64_t k_width, int64_t v_width, bool half)
    : b_(backend), n_layer_(n_layer), k_width_(k_width), v_width_(v_width), half_(half) {}

absl::Status DeviceKv::Bind(const HostKv& kv, int64_t pos0) {
  if (kv.id != id_ || kv.capacity != capacity_ || k_ == nullptr) {
    id_ = 0;
    valid_ = 0;
    if (kv.capacity != capacity_ || k_ == nullptr) {
      k_.reset();
      v_.reset();
      capacity_ = 0;
      const size_t rows = static_cast<size_t>(kv.capacity) * static_cast<size_t>(n_layer_);
      MOERT_ASSIGN_OR_RETURN(k_, b_.Allocate(rows * static_cast<size_t>(k_width_) * elem()));
      MOERT_ASSIGN_OR_RETURN(v_, b_.Allocate(rows * static_cast<size_t>(v_width_) * elem()));
      capacity_ = kv.capacity;
    }
    id_ = kv.id;
  }
  // Positions >= pos0 are about to be overwritten: whatever happens from here on, the
  // copy is current below pos0 at most.
  valid_ = std::min(valid_, pos0);
  if (valid_ < pos0) {
    const size_t from = static_cast<size_t>(valid_), count = static_cast<size_t>(pos0) - from;
    const size_t kw = static_cast<size_t>(k_width_), vw = static_cast<size_t>(v_width_);
    for (int il = 0; il < n_layer_; ++il) {
      const size_t row0 = static_cast<size_t>(il) * static_cast<size_t>(capacity_) + from;
      MOERT_RETURN_IF_ERROR(Upload(*k_, kv.keys[static_cast<size_t>(il)] + from * kw, count * kw, row0 * kw));
      MOERT_RETURN_IF_ERROR(Upload(*v_, kv.values[static_cast<size_t>(il)] + from * vw, count * vw, row0 * vw));
    }
    valid_ = pos0;
  }
  return absl::OkStatus();
}

TensorRef DeviceKv::keys(int layer, int64_t pos) const {
  return TensorRef(k_.get(), static_cast<size_t>((int64_t{layer} * capacity_ + pos) * k_width_) * elem());
}

TensorRef DeviceKv::values(int layer, int64_t pos) const {
  return TensorRef(v_.get(), static_cast<size_t>((int64_t{layer} * capacity_ + pos) * v_width_) * elem());
}

absl::Status DeviceKv::Commit(const HostKv& kv, int64_t pos0, int64_t n) {
  const size_t kw = static_cast<size_t>(k_width_), vw = static_cast<size_t>(v_width_);
  for (int il = 0; il < n_layer_; ++il) {
    const size_t row0 = static_cast<size_t>(il) * static_cast<size_t>(capacity_) + static_cast<size_t>(pos0);
    MOERT_RETURN_IF_ERROR(Download(*k_, row0 * kw, static_cast<size_t>(n) * kw,
                                   kv.keys[static_cast<size_t>(il)] + pos0 * k_width_));
    MOERT_RETURN_IF_ERROR(Download(*v_, row0 * vw, static_cast<size_t>(n) * vw,
                                   kv.values[static_cast<size_t>(il)] + pos0 * v_width_));
  }
  valid_ = pos0 + n;
  return absl::OkStatus();
}

void DeviceKv::Invalidate(uint64_t id, int64_t from) {
  if (id == id_) valid_ = std::min(valid_, from);
}

uint64_t DeviceKv::bytes() const {
  return (k_ != nullptr ? k_->size() : 0) + (v_ != nullptr ? v_->size() : 0);
}

absl::Status DeviceKv::Upload(Buffer& cache, const float* host, size_t count, size_t at) {
  if (!half_) return b_.Write(TensorRef(&cache, at * 4), host, count * 4);
  staging_.resize(count);
  for (size_t i = 0; i < count; ++i) staging_[i] = core::FloatToFp16(host[i]);
  return b_.Write(TensorRef(&cache, at * 2), staging_.data(), count * 2);
}

absl::Status DeviceKv::Download(Buffer& cache, size_t at, size_t count, float* host) {
  if (!half_) return b_.Read(TensorRef(&cache, at * 4), host, count * 4);
  staging_.resize(count);
  MOERT_RETURN_IF_ERROR(b_.Read(TensorRef(&cache, at * 2), staging_.data(), count * 2));
  for (size_t i = 0; i < count; ++i) host[i] = core::Fp16ToFloat(staging_[i]);
  return absl::OkStatus();
}

}  // namespace moert::backend
