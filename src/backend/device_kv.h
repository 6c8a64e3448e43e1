// A device backend's copy of a host KV cache. The host cache stays the whole truth (a
// CPU fallback or another backend continues the sequence from it); the device keeps
// one cache's copy at a time, the one it ran last, and brings it up to date lazily:
// rows the host wrote since (the CPU ran a batch, the cache was another one) are
// uploaded before the device reads them, and the rows the device computes are copied
// back. Optionally in IEEE half on the device (its host rows then hold the rounded
// values: what the device attends over).
#ifndef MOERT_BACKEND_DEVICE_KV_H_
#define MOERT_BACKEND_DEVICE_KV_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "backend/backend.h"

namespace moert::backend {

// The host cache of one sequence: per layer, rows of k_width / v_width floats for
// positions [0, capacity).
struct HostKv {
  uint64_t id = 0;  // distinct for every cache object the process makes
  int capacity = 0;
  std::span<float* const> keys;
  std::span<float* const> values;
};

class DeviceKv {
 public:
  DeviceKv(Backend& backend, int n_layer, int64_t k_width, int64_t v_width, bool half);

  bool half() const { return half_; }
  // Before a batch at positions pos0 ..: the device copy of `kv` valid below pos0.
  absl::Status Bind(const HostKv& kv, int64_t pos0);
  // Layer `layer`'s keys / values on the device (positions from 0), and the place of
  // position `pos` in them.
  TensorRef keys(int layer, int64_t pos = 0) const;
  TensorRef values(int layer, int64_t pos = 0) const;
  // After a batch: its rows [pos0, pos0 + n) back into the host cache; the device copy
  // is then valid below pos0 + n.
  absl::Status Commit(const HostKv& kv, int64_t pos0, int64_t n);
  // The host cache `id` changed at positions >= from (the CPU wrote them).
  void Invalidate(uint64_t id, int64_t from);
  uint64_t bytes() const;

 private:
  size_t elem() const { return half_ ? 2 : 4; }
  // `count` values from host floats at `host` to element `at` of `cache`, or back.
  absl::Status Upload(Buffer& cache, const float* host, size_t count, size_t at);
  absl::Status Download(Buffer& cache, size_t at, size_t count, float* host);

  Backend& b_;
  int n_layer_;
  int64_t k_width_, v_width_;
  bool half_;
  std::unique_ptr<Buffer> k_, v_;  // [layer][capacity][width]
  uint64_t id_ = 0;                // the host cache the device copy mirrors
  int capacity_ = 0;
  int64_t valid_ = 0;              // positions [0, valid_) are current
  std::vector<uint16_t> staging_;  // half rows on their way
};

}  // namespace moert::backend

#endif  // MOERT_BACKEND_DEVICE_KV_H_
