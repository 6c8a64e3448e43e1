// A model: Load reads any supported architecture from a GGUF file; Forward runs
// batches of tokens through its layer graph (model/graph.h) on the backend the options
// choose. With quantized_kernels off it is the fp32 reference every fast path (kernels,
// expert cache, pipeline, devices) is tested against.
#ifndef MOERT_MODEL_MODEL_H_
#define MOERT_MODEL_MODEL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backend/backend.h"
#include "experts/expert_cache.h"
#include "experts/io_mode.h"
#include "format/gguf.h"
#include "format/model_spec.h"
#include "kernels/config.h"
#include "memory/budget.h"
#include "pipeline/op_observer.h"
#include "pipeline/prefetcher.h"
#include "router/resource_monitor.h"
#include "router/router.h"
#include "telemetry/metrics.h"

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
  // Forgets every position and gives the memory back (a trimmed idle session); the
  // cache stays usable and keeps its place in the memory budget.
  virtual void Release() { Truncate(0); }
  // The memory budget's bytes for this cache (its full capacity).
  virtual uint64_t bytes() const { return 0; }
  // Repro bundles: layer `layer`'s keys and values of positions [0, positions) as f32
  // ([position][width]), their widths in *key_width / *value_width. Unimplemented for a
  // cache that does not hold f32 (a f16 or q8_0 cache), OutOfRange past size().
  virtual absl::Status ReadF32(int layer, int positions, std::vector<float>* keys,
                               std::vector<float>* values, int64_t* key_width,
                               int64_t* value_width) const {
    (void)layer, (void)positions, (void)keys, (void)values, (void)key_width, (void)value_width;
    return absl::UnimplementedError("this KV cache cannot be read back");
  }
};

// Where a model's forward pass runs (issue 8).
// Where an expert pool's experts compute on the OpenCL backend.
enum class PooledExperts {
  // On the device, from the pool's memory (one device buffer over the pool's expert
  // region: zero-copy where the device shares host memory, else a device copy of each
  // block written as it is loaded); on the host where the device cannot (a weight
  // format without OpenCL kernels, a pool above the device's largest buffer, a batch
  // whose experts do not fit the pool together). BackendStats::pooled_experts says.
  kDevice,
  // kDevice with the device copy even where the device could read host memory (tests
  // of that path; drivers whose zero-copy reads are slow). Twice the pool's memory on a
  // unified-memory device.
  kDeviceCopy,
  // Always on the host: the FFN input is read back from the device and the MoE output
  // written to it.
  kHost,
};

enum class Backend {
  kCpu,     // the CPU kernels (the default and the reference)
  kOpenCl,  // the OpenCL device; FailedPrecondition naming why when there is none
  kAuto,    // OpenCL on a GPU that passes a self-test at load, else the CPU
};

// "cpu", "opencl", "auto".
const char* BackendName(Backend backend);
// The inverse of BackendName; InvalidArgument naming the choices otherwise.
absl::StatusOr<Backend> ParseBackend(std::string_view name);

struct ModelLoadOptions {
  // Compute threads (pthreadpool; the calling thread is one of them); 0: one per core;
  // negative: InvalidArgument. Results do not depend on it, bit for bit.
  int threads = 1;
  // How idle compute threads wait for the next parallel section (llama.cpp's --poll):
  // 1..100: they spin a while first (pthreadpool's fixed spin; the level is not graded
  // further), 0: they sleep at once, freeing the cores between sections, -1 (default):
  // spin on the CPU backend with every expert resident, sleep when an expert pool
  // streams experts (the loader's threads need the cores while a step waits for a load)
  // or a device backend runs the step. See core::ThreadPool::set_poll; results do not
  // depend on it.
  int poll = -1;
  // Quantized tensors (Q4_0, Q4_1, Q4_K, Q8_0, Q5_*, Q6_K, ...) run on the integer
  // microkernels (repacked at load into W4/W4M/W8, activations quantized to int8 per
  // 32-block); F32/F16/BF16 tensors, norms, routers and embeddings stay fp32. false:
  // everything is dequantized to fp32 (the reference path, the oracle).
  bool quantized_kernels = true;
  // The kernels' ISA for this model (tests compare them); unset: kernels::GetKernelConfig()
  // (the best this CPU runs, or MOERT_ISA). FailedPrecondition when unavailable.
  std::optional<kernels::Isa> isa;
  // Called during loading with the fraction done in [0, 1].
  std::function<void(float)> progress;
  // Set to true (from any thread, or from `progress`) to stop loading: Load returns
  // Cancelled before the next tensor is read.
  const std::atomic<bool>* cancel = nullptr;
  // Called during Forward, on the calling thread, with each layer's feed-forward
  // input (the normed residual stream the router and the experts multiply):
  // `n_tokens` rows of n_embd values. For calibration (moert-pack --calib); may be
  // empty.
  std::function<void(int layer, int64_t n_tokens, const float* x)> ffn_input_observer;

  // --- Memory budget and expert pool. Setting any of the first three puts the routed
  // experts of a MoE model in an expert pool: loaded on demand from the file (through
  // the loader thread, `io_mode`), evicted when the pool is full, with logits bit for
  // bit those of a fully resident model. None set: every expert is loaded at start.
  // The pool needs quantized_kernels (the fp32 reference path keeps every expert
  // resident: Unimplemented) and quantized expert tensors (Unimplemented naming the
  // tensor otherwise).
  //
  // Everything the model holds, in bytes: persistent weights (all but the routed
  // experts), the KV cache of `kv_cache_positions`, scratch (activations of a
  // micro-batch, the loader's staging buffer; an estimate) and the expert pool; 0: no
  // budget. ResourceExhausted naming the numbers when the persistent part alone does
  // not fit. Without expert_pool_bytes or expert_pool_fraction the pool gets the rest.
  uint64_t memory_budget_bytes = 0;
  // The expert pool's bytes; 0: from expert_pool_fraction or the budget.
  uint64_t expert_pool_bytes = 0;
  // The pool as a fraction in (0, 1] of what all routed experts take in it (each one a
  // pool block: its runtime bytes rounded up to a power of two): 1 holds every expert,
  // 0.25 a quarter of them. 0: unset.
  double expert_pool_fraction = 0;
  // How the loader reads experts (experts/io_mode.h).
  experts::IoMode io_mode = experts::IoMode::kDirect;
  // The KV cache positions the budget sets aside (the context the caller will use);
  // 0: what fits: the training context, or with a budget the most that fits in half of
  // what the weights and scratch leave when the pool takes the rest (in the rest with
  // the pool sized, or for a dense model), leaving the pool its floor; a multiple of 256
  // from 256 on. MemoryStats::kv_cache_positions says what it came to.
  int kv_cache_positions = 0;
  // Every KV cache (NewKvCache) is reserved in the budget in full. One that does not fit
  // is ResourceExhausted naming the numbers; with shrink_pool_for_kv it takes the bytes
  // from the expert pool instead, down to expert_pool_floor_bytes (0: one token's
  // experts in every MoE layer, n_layer * k blocks), and the pool grows back as caches
  // go.
  bool shrink_pool_for_kv = false;
  // The KV cache's key and value types (llama.cpp's --cache-type-k / --cache-type-v):
  // f32 (the reference), f16 (half the memory), q8_0 (ggml's blocks of 32 int8 with a
  // half scale: 34 bytes per 32 values; the rows' widths must be multiples of 32,
  // InvalidArgument otherwise). Not f32: the forward pass stays on the CPU backend
  // (kAuto says why; kOpenCl is Unimplemented).
  backend::KvType kv_type_k = backend::KvType::kF32;
  backend::KvType kv_type_v = backend::KvType::kF32;
  uint64_t expert_pool_floor_bytes = 0;
  // The hot set (experts/hot_set.h): with a pool, read at load (its experts are loaded
  // first, up to the pool's size) and written by Model::SaveHotSet. `hot_set_path`
  // empty: CACHE_DIR/hot/MODEL.gguf.moert-hot (core/cache_dir.h); with no cache
  // directory at all (neither `cache_dir` nor a default), no hot set.
  bool hot_set = false;
  std::string hot_set_path;
  // Where the files kept between runs go (the hot set, OpenCL program binaries);
  // empty: core::DefaultCacheDir(). Never beside the model unless hot_set_path says so.
  std::string cache_dir;
  // The expert cache's tuning (tests); pool_bytes and the loader's mode are set from
  // the fields above.
  experts::ExpertCacheOptions expert_cache;
  // Prefetch of predicted experts (pipeline/prefetcher.h), with an expert pool: while
  // layer L's experts compute, the loader reads the experts layer L + prefetch_depth's
  // router predicts from layer L's input. Outputs do not change (with the residency
  // penalty on, residency feeds routing, so they may). prefetch_depth: 1 .. n_layer - 1,
  // else InvalidArgument. On by default: it decoded faster than off in every pair
  // measured (docs/performance.md); without an expert pool it does nothing.
  bool prefetch = true;
  int prefetch_depth = 1;
  // mlock the weights outside the expert pool (llama.cpp's --mlock): the kernel never
  // pages them out under pressure. Best effort: a refused lock leaves them unlocked and
  // MemoryStats::lock_error says why.
  bool lock_weights = false;

  // --- Routing (MoE models; router/router.h). The defaults change nothing while the
  // working set fits the pool: outputs are then those of the reference routing.
  router::RouterOptions router;
  // The thermal limit, the thermal zones' root and the pressure window.
  router::ResourceMonitorOptions resource_monitor;
  // The modality bias: n_layer * n_expert numbers (whitespace-separated text), read
  // instead of the model's `moert.modality_bias` metadata; empty: the metadata's
  // (none when absent).
  std::string modality_bias_path;
  // true: model::RouteToken, the plain softmax top-k, instead of the router (tests).
  bool reference_routing = false;
  // Called with every MoE layer's routing (tests); may be empty.
  std::function<void(int layer, int64_t n, int slots, const int* experts, const float* weights)>
      route_observer;
  // Sees each op's output, and may change it (moert-replay; pipeline/op_observer.h).
  // CPU only, like the observers above; with `experts` the MoE blocks run pair by pair.
  pipeline::OpObserver op_observer;

  // --- Backend. ffn_input_observer / route_observer run only on the CPU path (set:
  // kAuto stays on the CPU, kOpenCl is Unimplemented). kAuto falls back to the CPU for
  // a request whose device run fails and counts it (BackendStats::fallbacks).
  Backend backend = Backend::kCpu;
  // Accept a CPU or accelerator OpenCL device (PoCL in tests) for kOpenCl; kAuto always
  // wants a GPU.
  bool opencl_allow_cpu_device = true;
  // With an expert pool on the OpenCL device, where the pooled experts compute (the
  // routing is on the host either way: it needs the pool's residency).
  PooledExperts opencl_pooled_experts = PooledExperts::kDevice;
  // The OpenCL device's KV cache in IEEE half (core OpenCL 1.2 vload/vstore_half):
  // half its memory and of the attention's reads, for values rounded to half. The
  // host cache then holds the rounded values too (what the device attends over), so
  // results stay within the device's agreement bounds with the CPU but are no longer
  // its bits. Off by default; ignored on the CPU backend.
  bool opencl_kv_half = false;
  // A device backend of the caller's for kOpenCl / kAuto, instead of the OpenCL device
  // (an embedder's own backend; tests: a backend with injected failures or fewer ops).
  // Called once at load; a failure is the device's (kAuto: the CPU runs).
  std::function<absl::StatusOr<std::unique_ptr<backend::Backend>>()> device_backend;

  // --- Telemetry. The registry the model, its expert cache, loader, pool and router
  // publish to (src/telemetry/runtime_metrics.h); null: one of the model's own.
  std::shared_ptr<telemetry::Registry> metrics = nullptr;
};

// The backend a model runs on and why.
struct BackendStats {
  std::string backend = "CPU";  // "CPU" or "OpenCL"
  std::string device;           // the OpenCL device's name, driver and type; empty on the CPU
  std::string driver;
  // With Backend::kAuto on the CPU: why not OpenCL (no platform, not a GPU, the
  // self-test failed, an expert pool ...).
  std::string cpu_reason;
  uint64_t fallbacks = 0;  // requests that failed on the device and ran on the CPU
  std::string last_fallback;  // the Status of the last one
  // With an expert pool on OpenCL: "device (zero-copy)", "device (copied per load)" or
  // "host: <why>"; the MoE blocks whose experts ran on the device and on the host; the
  // expert bytes made visible to the device (each load or defragmentation move once).
  std::string pooled_experts;
  // Device memory the uploaded weights take (F16 tensors stay half there; an expert
  // pool's region not counted).
  uint64_t device_weight_bytes = 0;
  // Device memory of the KV cache (0 before the first request; half with
  // opencl_kv_half).
  uint64_t device_kv_bytes = 0;
  uint64_t pooled_device_batches = 0;
  uint64_t pooled_host_batches = 0;
  uint64_t pooled_published_bytes = 0;
  uint64_t device_batches = 0;  // batches the device ran to the end
  uint64_t cpu_placed_ops = 0;  // ops the device lacks that ran on the CPU for it
};

// What the memory budget sets aside for the runtime itself (its heap, thread stacks and
// code pages), measured on x86-64 with an OLMoE-sized pool: the resident set came within
// 2 MiB of a budget the pool filled without it.
inline constexpr uint64_t kRuntimeAllowanceBytes = uint64_t{16} << 20;

// The model's memory: the budget in force and, with an expert pool, its state and
// counters. All zero for a model without a budget or pool.
struct MemoryStats {
  bool expert_pool = false;       // routed experts are loaded on demand into a pool
  uint64_t budget_bytes = 0;      // given, or derived: persistent + KV + scratch + pool
  uint64_t persistent_bytes = 0;  // weights outside the pool
  uint64_t kv_cache_bytes = 0;    // set aside for kv_cache_positions
  int kv_cache_positions = 0;     // the default context (ModelLoadOptions::kv_cache_positions)
  memory::BudgetStats ledger;     // the budget now: KV caches reserved, the pool's limit
  // Estimate: activations, the staging buffer, and kRuntimeAllowanceBytes for the
  // runtime's own heap, stacks and code.
  uint64_t scratch_bytes = 0;
  uint64_t all_experts_bytes = 0; // what every routed expert would take in the pool
  uint64_t experts_per_token = 0; // k: experts one token needs resident together
  std::string io_mode;            // in force ("direct", "buffered", "mmap")
  std::string io_fallback;        // why it is not the one asked for; empty when it is
  std::string io_engine;          // what reads ("io_uring", "pread"); empty in mmap mode
  std::string io_engine_fallback; // why not io_uring; empty when it is, or in mmap mode
  uint64_t hot_set_preloaded = 0; // experts the hot set loaded at start
  std::string hot_set_path;       // the hot set's file; empty: no hot set
  std::string hot_set_error;      // why the last SaveHotSet failed; empty when it did not
  experts::ExpertCacheStats pool; // the pool now and its counters
  bool prefetch = false;          // prefetch of predicted experts is on
  int prefetch_depth = 0;
  pipeline::PrefetchStats prefetcher;  // prediction precision / recall, loads started
  uint64_t locked_bytes = 0;      // weights mlocked (ModelLoadOptions::lock_weights)
  std::string lock_error;         // why the lock asked for is not in force; empty when it is
};

enum class LogitsFor {
  kLast,  // only the last token's logits: n_vocab floats
  kAll,   // every token's logits: n_tokens * n_vocab floats, token-major
};

// The id of a position whose input is an embedding row, not a token (an image's
// tokens; llama.cpp's reference dumps print it as -1 too).
inline constexpr int32_t kEmbeddingToken = -1;

// One batch's input.
struct ForwardInput {
  std::span<const int32_t> tokens;  // one id per position; kEmbeddingToken: a row below
  // The rows of the kEmbeddingToken positions, in order: that count * n_embd floats.
  std::span<const float> embeddings;
  // The share of image tokens in the request this batch belongs to, in [0, 1]: the
  // router's modality lambda is RouterOptions::modality_lambda times it
  // (docs/routing.md). 0 for text: routing is then exactly as without a bias.
  float image_share = 0;
};

// The new weights of the routed experts a hot update changed, read and converted ahead
// of the swap (Model::PrepareExpertUpdate), written into the model between two Forward
// calls (Model::CommitExpertUpdate).
class ExpertUpdate {
 public:
  virtual ~ExpertUpdate() = default;
  // Bytes it holds until committed (the changed experts' weights; 0 with a pool).
  virtual uint64_t bytes() const = 0;
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
  // one at a time. With an expert pool, a failed expert load (DataLoss naming the
  // layer, expert and file offset) fails the call the same way: the cache is unchanged
  // and the next call may succeed.
  absl::Status Forward(std::span<const int32_t> tokens, KvCache* cache, LogitsFor which,
                       std::vector<float>* logits) {
    return Forward(ForwardInput{tokens, {}, 0.0f}, cache, which, logits);
  }
  // The same with embeddings at some positions (an image's tokens): positions whose id
  // is kEmbeddingToken take the next row of input.embeddings (n_embd floats) instead of
  // a token's embedding. InvalidArgument when the rows do not match those positions or
  // hold a non-finite value. input.image_share sets the modality bias's lambda for
  // this batch (router/router.h).
  virtual absl::Status Forward(const ForwardInput& input, KvCache* cache, LogitsFor which,
                               std::vector<float>* logits) = 0;

  // The budget and the expert pool (zeros without them).
  virtual MemoryStats memory_stats() const { return {}; }
  // The backend the forward pass runs on (ModelLoadOptions::backend).
  virtual BackendStats backend_stats() const { return {}; }
  // The router and its resource monitor (null for a dense model or reference routing).
  // Their setters may be called between Forward calls; ResourceMonitor::SetTemperature
  // from any thread.
  virtual router::Router* router() { return nullptr; }
  virtual router::ResourceMonitor* resource_monitor() { return nullptr; }
  // The memory budget's ledger every KV cache reserves in (thread-safe; null for a model
  // that has none). Its Trim applies from the next Forward, or from ApplyMemoryLimits.
  virtual memory::MemoryBudget* budget() { return nullptr; }
  // Between Forward calls: brings the expert pool to the budget's target now (evicting,
  // giving pages back); drop_unused also evicts experts no step has used (a hot-set
  // preload). A no-op without a pool.
  virtual void ApplyMemoryLimits(bool drop_unused) { (void)drop_unused; }
  // Turns prefetch of predicted experts on (depth: layers ahead) or off between Forward
  // calls (ModelLoadOptions::prefetch); its counters start again. Loads in flight are
  // finished first. InvalidArgument for a depth out of range; a no-op without a pool.
  virtual absl::Status SetPrefetch(bool enabled, int depth) {
    (void)enabled;
    (void)depth;
    return absl::OkStatus();
  }
  // Drops the expert loads still queued (prefetches of a cancelled generation); the read
  // in progress, if any, finishes in the background. Never waits; a no-op without a
  // pool. Call it between Forward calls, from the thread that runs them.
  virtual void CancelPendingLoads() {}
  // Runs each MoE layer's dense fallback FFN (moert-pack --dense-fallback) instead of
  // its routed experts, or the experts again; takes effect at the next Forward.
  virtual absl::Status SetDenseFallback(bool on) {
    (void)on;
    return absl::FailedPreconditionError(
        "this model has no dense fallback FFN (moert-pack --dense-fallback)");
  }
  virtual bool has_dense_fallback() const { return false; }
  // The degrade policy's actions (runtime/degrade_actions.h), between Forward calls.
  // Compacts the expert pool now (moving unpinned blocks, bounded per call as the
  // pool's own defragmentation is); FailedPrecondition without a pool.
  virtual absl::Status Defragment() {
    return absl::FailedPreconditionError("the model has no expert pool to defragment");
  }
  // Gives the OpenCL device up for the rest of the model's life (Backend::kAuto's
  // failure path, on request): the CPU runs every later batch, BackendStats::cpu_reason
  // says `why`. FailedPrecondition when the model already runs on the CPU.
  virtual absl::Status UseCpuBackend(std::string_view why) {
    (void)why;
    return absl::FailedPreconditionError("the model already runs on the CPU");
  }
  // Writes the hot set (the most used experts, as many as the pool holds) when the
  // model has a pool and was loaded with hot_set; OK and nothing written otherwise.
  virtual absl::Status SaveHotSet() { return absl::OkStatus(); }
  // Repro bundles: per layer, the router's gate logits of the last row the last Forward
  // routed on the host (an empty row: a dense layer, or routed on a device).
  virtual std::vector<std::vector<float>> last_router_logits() const { return {}; }
  // Expert hot updates in place (runtime/update.cc). `file` is the model's file after
  // an update that changed only the bytes of the routed experts `experts` ((layer,
  // expert) pairs); its tensors lie where the loaded file's did. Resident experts: reads
  // and converts their new weights (any thread; Forward calls may run meanwhile). With
  // an expert pool: checks that the pool can read the new file in place. Unimplemented
  // naming why when the model cannot take the update in place (a device backend holds
  // copies of the weights; the caller loads the new file instead); InvalidArgument
  // naming the tensor when `file` does not fit the loaded model.
  virtual absl::StatusOr<std::unique_ptr<ExpertUpdate>> PrepareExpertUpdate(
      const format::GgufFile& file, std::span<const std::pair<int, int>> experts) {
    (void)file, (void)experts;
    return absl::UnimplementedError("this model cannot replace experts in place");
  }
  // Between Forward calls (the caller holds them off): the next Forward runs on the new
  // weights. With a pool the file must already be the new one. On error the model is
  // unchanged (ExpertCache::SwitchToUpdatedFile's errors).
  virtual absl::Status CommitExpertUpdate(ExpertUpdate& update) {
    (void)update;
    return absl::UnimplementedError("this model cannot replace experts in place");
  }
  // Repro bundles: the expert pool's state as key=value lines (its figures, each layer's
  // residency bitmap, the buddy allocator's live blocks); empty without a pool.
  virtual std::string pool_state() const { return ""; }
};

}  // namespace moert::model

#endif  // MOERT_MODEL_MODEL_H_
