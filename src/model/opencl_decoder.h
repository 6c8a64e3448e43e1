// The decoder's forward pass on an OpenCL device (issue 8 phase 2): device copies of
// the weights, the KV cache mirrored on the device, and DecoderModel's math (model/
// decoder.cc) chained from the ops of backend/opencl/ops.h without host round trips,
// except the token embeddings (looked up on the host), the routing of fp32 experts
// (read back to group tokens by expert), the new KV rows (copied back so the host
// cache stays whole: a CPU fallback or another backend can continue the sequence) and
// the logits.
//
// An interface so that decoder.cc needs no OpenCL header: NewOpenClDecoder exists
// only in a build with the OpenCL backend (MOERT_HAVE_OPENCL).
#ifndef MOERT_MODEL_OPENCL_DECODER_H_
#define MOERT_MODEL_OPENCL_DECODER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "format/model_spec.h"
#include "model/decoder.h"
#include "model/layers.h"

namespace moert::model {

// What the device forward reads of a DecoderModel (borrowed; the model outlives it).
struct DecoderView {
  const format::ModelSpec* spec = nullptr;
  const Matrix* token_embd = nullptr;
  const std::vector<float>* output_norm = nullptr;
  const Matrix* output = nullptr;  // empty: tied to token_embd
  const std::vector<float>* rope_freqs = nullptr;
  const std::vector<LayerWeights>* layers = nullptr;
  AttentionOptions attention;
  bool shared_expert = false;
  // Set for a model whose routed experts live in an expert pool (memory budget). Each
  // MoE block's routing runs on the host (model::RouteMoe: the residency penalty and
  // the prefetcher need the pool's state), on the FFN input read back from the device,
  // and the chosen experts are pinned there (model::AcquireRouted); with
  // PooledExperts::kDevice the fused MoE kernels then read them from the pool's memory
  // through one buffer over its expert region (zero-copy where the device shares host
  // memory, else a device copy of each block written when it is loaded or moved);
  // with kHost, or where the device cannot (OpenClDecoder::pooled_stats says why), the
  // experts run on the host (model::RunMoeExperts) and their output goes back to the
  // device. Everything else stays on the device.
  experts::ExpertCache* expert_cache = nullptr;
  ThreadPool* host_pool = nullptr;  // with expert_cache: the host's share of the MoE block
  PooledExperts pooled_experts = PooledExperts::kDevice;
};

// Where an expert pool's experts ran on the device path (OpenClDecoder::pooled_stats).
struct DevicePoolStats {
  // "device (zero-copy)", "device (copied per load)" or "host: <why>".
  std::string placement;
  uint64_t device_batches = 0;  // MoE blocks whose experts ran on the device
  uint64_t host_batches = 0;    // ... on the host (kHost, or a batch too big for the pool)
  uint64_t published_bytes = 0; // expert bytes made visible to the device (loads, moves)
};

// The host KV cache of one sequence, which a device run reads (positions it has not
// seen) and extends (the rows it computes).
struct HostKv {
  uint64_t id = 0;  // distinct for every cache object the process makes
  int capacity = 0;
  std::vector<float*> keys;    // per layer: [capacity][n_head_kv * head_dim_k]
  std::vector<float*> values;  // per layer: [capacity][n_head_kv * head_dim_v]
};

class OpenClDecoder {
 public:
  virtual ~OpenClDecoder() = default;
  virtual const std::string& device_name() const = 0;
  virtual const std::string& driver_version() const = 0;
  virtual std::string device_type() const = 0;  // "GPU", "CPU", ...
  // DecoderModel::ForwardBatch on the device: tokens at pos0 .., their K/V rows
  // written to `kv` (positions below pos0 are read from `kv` when the device copy is
  // not current), logits of rows [first_logit_row, n) to `logits`.
  virtual absl::Status ForwardBatch(std::span<const int32_t> tokens, int64_t pos0,
                                    const HostKv& kv, int64_t first_logit_row,
                                    float* logits) = 0;
  // The host cache `kv_id` changed (the CPU wrote it) at positions >= from.
  virtual void Invalidate(uint64_t kv_id, int64_t from) = 0;
  // With an expert pool (DecoderView::expert_cache).
  virtual DevicePoolStats pooled_stats() const = 0;
  // Device memory the uploaded weights take (the expert pool's region not counted).
  virtual uint64_t weight_bytes() const = 0;
  // Device memory the KV cache takes (0 before the first ForwardBatch).
  virtual uint64_t kv_bytes() const = 0;
  // Tests: the zero-copy check (the device reading what the host wrote into the
  // expert pool) fails, as on a driver that copied the region when it was wrapped.
  virtual void SpoilZeroCopyCheckForTesting() = 0;

  // Tests: later ForwardBatch calls fail part-way as a real device failure would (see
  // DeviceFailureForTesting); replaces an earlier injection.
  virtual void InjectFailureForTesting(const DeviceFailureForTesting& failure) = 0;
};

struct OpenClDecoderOptions {
  bool require_gpu = false;       // only a GPU device (Backend::kAuto)
  bool allow_cpu_device = false;  // a CPU/accelerator device when there is no GPU
  // The device's KV cache in half (ModelLoadOptions::opencl_kv_half).
  bool kv_half = false;
};

#ifdef MOERT_HAVE_OPENCL
// Opens the device, runs the self-test (an fp32 GEMV against model::Dot) and uploads
// the weights. FailedPrecondition naming why when there is no usable device or the
// self-test fails; Unimplemented naming what the device path cannot run yet (a shared
// expert, a weight format without OpenCL kernels); ResourceExhausted when the weights
// do not fit the device.
absl::StatusOr<std::unique_ptr<OpenClDecoder>> NewOpenClDecoder(const DecoderView& view,
                                                                const OpenClDecoderOptions& options);
#endif

}  // namespace moert::model

#endif  // MOERT_MODEL_OPENCL_DECODER_H_
