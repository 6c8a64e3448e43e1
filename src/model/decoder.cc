// The decoder-only transformer shared by every architecture, its KV cache, and the
// attention and feed-forward blocks the architecture files compose.
#include "model/decoder.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "core/status.h"
#include "core/strings.h"
#include "experts/expert_directory.h"
#include "experts/hot_set.h"
#include "experts/loader.h"
#include "model/opencl_decoder.h"

namespace moert::model {

using format::ModelSpec;
using format::TensorKind;
using format::TensorWeightName;

namespace {

// Caps on the KV cache: far above what a device can hold, low enough to catch a
// mistaken size before it turns into an allocation failure.
constexpr int kMaxCacheContext = 1 << 22;
constexpr uint64_t kMaxCacheBytes = uint64_t{64} << 30;

// Long prompts run in micro-batches of this many tokens: the scratch stays bounded
// and the results are the same bit for bit (see layers.h).
constexpr int64_t kMaxMicroBatch = 512;

int64_t KeyWidth(const ModelSpec& spec) { return int64_t{spec.n_head_kv} * spec.head_dim_k; }
int64_t ValueWidth(const ModelSpec& spec) { return int64_t{spec.n_head_kv} * spec.head_dim_v; }

uint64_t KvCacheBytes(const ModelSpec& spec, uint64_t positions) {
  return positions * spec.n_layer * uint64_t(KeyWidth(spec) + ValueWidth(spec)) * sizeof(float);
}

// What a forward pass of one micro-batch allocates besides the weights and the KV
// cache, over-estimated: the residual stream and its scratch, q/k/v, the router, the
// fused expert op (its gathered inputs, hidden activations and per-pair outputs, twice
// when a batch runs in expert subsets), a shared or dense FFN, and every row's logits.
uint64_t ScratchBytes(const ModelSpec& spec, uint64_t positions) {
  const uint64_t n = std::min<uint64_t>(positions, uint64_t(kMaxMicroBatch));
  const uint64_t e = spec.n_embd;
  const uint64_t k = std::max<uint64_t>(spec.n_expert_used, 1);
  const uint64_t ff = std::max<uint64_t>({spec.n_ff_expert, spec.n_ff, 1});
  const uint64_t pairs = n * k;
  const uint64_t qkvo = uint64_t(spec.n_head) * (spec.head_dim_k + spec.head_dim_v) +
                        uint64_t(KeyWidth(spec) + ValueWidth(spec));
  const uint64_t floats = 3 * n * e + n * qkvo + n * (spec.n_expert + 2 * k) +
                          pairs * (2 * ff + 3 * e) + n * 3 * spec.n_ff_shared_expert +
                          n * 2 * spec.n_ff + n * spec.n_vocab;
  const uint64_t a8 = (n * e + pairs * (e + ff)) * 36 / 32;  // A8 blocks: 36 bytes per 32
  const uint64_t mib = uint64_t{1} << 20;
  return (floats * sizeof(float) + a8 + mib - 1) / mib * mib + mib;
}

}  // namespace

// fp32 keys and values, layer-major: layer l's keys are [capacity][n_head_kv * head_dim_k].
class DecoderKvCache final : public KvCache {
 public:
  DecoderKvCache(int capacity, int n_layer, int64_t k_width, int64_t v_width)
      : id_(NextId()),
        capacity_(capacity),
        n_layer_(n_layer),
        k_width_(k_width),
        v_width_(v_width),
        k_(static_cast<size_t>(int64_t{capacity} * n_layer * k_width)),
        v_(static_cast<size_t>(int64_t{capacity} * n_layer * v_width)) {}

  int capacity() const override { return capacity_; }
  int size() const override { return size_; }
  void Truncate(int n) override { size_ = std::clamp(n, 0, size_); }

  bool Fits(const ModelSpec& spec) const {
    return n_layer_ == static_cast<int>(spec.n_layer) && k_width_ == KeyWidth(spec) &&
           v_width_ == ValueWidth(spec);
  }
  float* keys(int layer) { return k_.data() + int64_t{layer} * capacity_ * k_width_; }
  float* values(int layer) { return v_.data() + int64_t{layer} * capacity_ * v_width_; }
  void set_size(int n) { size_ = n; }
  // Distinct per cache object (the OpenCL backend's device copy names its cache).
  uint64_t id() const { return id_; }
  HostKv Host() {
    HostKv kv;
    kv.id = id_;
    kv.capacity = capacity_;
    for (int l = 0; l < n_layer_; ++l) {
      kv.keys.push_back(keys(l));
      kv.values.push_back(values(l));
    }
    return kv;
  }

 private:
  static uint64_t NextId() {
    static std::atomic<uint64_t> next{1};
    return next++;
  }

  uint64_t id_;
  int capacity_;
  int n_layer_;
  int64_t k_width_;
  int64_t v_width_;
  int size_ = 0;
  std::vector<float> k_;
  std::vector<float> v_;
};

const char* BackendName(Backend backend) {
  switch (backend) {
    case Backend::kCpu:
      return "cpu";
    case Backend::kOpenCl:
      return "opencl";
    case Backend::kAuto:
      return "auto";
  }
  return "cpu";
}

absl::StatusOr<Backend> ParseBackend(std::string_view name) {
  for (Backend b : {Backend::kCpu, Backend::kOpenCl, Backend::kAuto}) {
    if (name == BackendName(b)) return b;
  }
  return absl::InvalidArgumentError(
      StrCat("unknown backend '", name, "' (choose cpu, opencl or auto)"));
}

DecoderModel::DecoderModel(ModelSpec spec, int threads) : spec_(std::move(spec)), pool_(threads) {}

DecoderModel::~DecoderModel() = default;

absl::Status DecoderModel::SetUpBackend(const ModelLoadOptions& options) {
  if (options.backend == Backend::kCpu) return absl::OkStatus();
  const bool is_auto = options.backend == Backend::kAuto;
  // What the device path does not run: kOpenCl says so, kAuto stays on the CPU.
  std::string cpu_only;
  AttentionOptions attention;
  bool shared_expert = false;
  // With an expert pool, the MoE blocks' routing runs on the host (DecoderView::
  // expert_cache), so the router's adjustments go too.
  const bool host_moe = expert_cache_ != nullptr;
  if (!PreNormLayout(&attention, &shared_expert)) {
    cpu_only = "this architecture's layers run on the CPU only";
  } else if (options.ffn_input_observer || options.route_observer) {
    cpu_only = "FFN input and routing observers run on the CPU only";
  } else if (!host_moe &&
             (options.router.dynamic_k_p != 0 || options.router.modality_lambda != 0 ||
              options.resource_monitor.thermal_limit_c != 0)) {
    cpu_only = "dynamic top-k, the modality bias and the thermal limit run on the CPU only";
  }
  if (!cpu_only.empty()) {
    if (is_auto) {
      backend_.cpu_reason = cpu_only;
      return absl::OkStatus();
    }
    return absl::UnimplementedError(StrCat("--backend opencl: ", cpu_only));
  }
#ifdef MOERT_HAVE_OPENCL
  DecoderView view;
  view.spec = &spec_;
  view.token_embd = &token_embd_;
  view.output_norm = &output_norm_;
  view.output = &output_;
  view.rope_freqs = &rope_freqs_;
  view.layers = &layers_;
  view.attention = attention;
  view.shared_expert = shared_expert;
  if (host_moe) {
    view.expert_cache = expert_cache_.get();
    view.host_pool = &pool_;
    view.pooled_experts = options.opencl_pooled_experts;
  }
  OpenClDecoderOptions cl_options;
  cl_options.require_gpu = is_auto;
  cl_options.allow_cpu_device = options.opencl_allow_cpu_device;
  cl_options.kv_half = options.opencl_kv_half;
  auto decoder = NewOpenClDecoder(view, cl_options);
  if (!decoder.ok()) {
    if (is_auto) {
      backend_.cpu_reason = std::string(decoder.status().message());
      return absl::OkStatus();
    }
    return decoder.status();
  }
  opencl_ = std::move(*decoder);
  fallback_to_cpu_ = is_auto;
  backend_.backend = "OpenCL";
  backend_.device = StrCat(opencl_->device_name(), " (", opencl_->device_type(), ")");
  backend_.driver = opencl_->driver_version();
  return absl::OkStatus();
#else
  if (is_auto) {
    backend_.cpu_reason = "moert was built without the OpenCL backend";
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      "--backend opencl: moert was built without the OpenCL backend (OpenCL not found at build)");
#endif
}

BackendStats DecoderModel::backend_stats() const {
  BackendStats stats = backend_;
  if (opencl_ != nullptr) {
    stats.device_weight_bytes = opencl_->weight_bytes();
    stats.device_kv_bytes = opencl_->kv_bytes();
  }
  if (opencl_ != nullptr && expert_cache_ != nullptr) {
    const DevicePoolStats pooled = opencl_->pooled_stats();
    stats.pooled_experts = pooled.placement;
    stats.pooled_device_batches = pooled.device_batches;
    stats.pooled_host_batches = pooled.host_batches;
    stats.pooled_published_bytes = pooled.published_bytes;
  }
  return stats;
}

absl::Status DecoderModel::InjectDeviceFailureForTesting(const DeviceFailureForTesting& failure) {
  if (opencl_ == nullptr) {
    return absl::FailedPreconditionError(
        "the model has no OpenCL forward to inject a failure into");
  }
  opencl_->InjectFailureForTesting(failure);
  return absl::OkStatus();
}

absl::Status DecoderModel::SpoilZeroCopyCheckForTesting() {
  if (opencl_ == nullptr) {
    return absl::FailedPreconditionError("the model has no OpenCL forward to spoil");
  }
  opencl_->SpoilZeroCopyCheckForTesting();
  return absl::OkStatus();
}

absl::Status DecoderModel::FallBackToCpuForTesting() {
  if (opencl_ == nullptr) {
    return absl::FailedPreconditionError("the model has no OpenCL forward to fall back from");
  }
  fallback_to_cpu_ = true;
  return absl::OkStatus();
}

absl::Status DecoderModel::LoadWeights(const format::GgufFile& file,
                                       const ModelLoadOptions& options) {
  if (options.isa) {
    MOERT_ASSIGN_OR_RETURN(kernels::KernelConfig config, kernels::KernelConfigFor(*options.isa));
    pool_.set_kernels(config);
  }
  ffn_input_observer_ = options.ffn_input_observer;
  if (options.memory_budget_bytes > 0 || options.expert_pool_bytes > 0 ||
      options.expert_pool_fraction != 0) {
    MOERT_RETURN_IF_ERROR(SetUpExpertPool(file, options));
  }
  WeightLoader loader(file, options.progress, options.quantized_kernels);
  if (expert_cache_ != nullptr) {
    loader.set_skip_routed_experts(true);
    loader.set_release_pages(true);
  }
  MOERT_RETURN_IF_ERROR(LoadTensors(loader));
  if (expert_cache_ != nullptr) {
    for (int il = 0; il < static_cast<int>(spec_.n_layer); ++il) {
      layers_[il].moe.cache = expert_cache_.get();
      layers_[il].moe.layer = il;
    }
    if (options.hot_set) {
      hot_set_path_ = options.hot_set_path.empty() ? experts::HotSetPath(file.name())
                                                   : options.hot_set_path;
      const experts::ExpertDirectory& dir = expert_cache_->directory();
      auto hot = experts::ReadHotSet(hot_set_path_,
                                     {dir.file_size(), dir.n_layer(), dir.n_expert()});
      if (hot.ok()) {
        // A failed preload only leaves that expert on disk; its next use reports it.
        size_t loaded = 0;
        (void)expert_cache_->Preload(*hot, &loaded);
        memory_.hot_set_preloaded = loaded;
      }
    }
  }
  MOERT_RETURN_IF_ERROR(SetUpRouter(file, options));
  MOERT_RETURN_IF_ERROR(SetPrefetch(options.prefetch, options.prefetch_depth));
  MOERT_RETURN_IF_ERROR(SetUpBackend(options));
  if (options.progress) options.progress(1.0f);
  return absl::OkStatus();
}

absl::Status DecoderModel::SetUpRouter(const format::GgufFile& file,
                                       const ModelLoadOptions& options) {
  route_observer_ = options.route_observer;
  for (int il = 0; il < static_cast<int>(spec_.n_layer); ++il) {
    layers_[il].moe.layer = il;
    layers_[il].moe.route_observer = &route_observer_;
  }
  if (!spec_.is_moe() || options.reference_routing) return absl::OkStatus();
  MOERT_RETURN_IF_ERROR(router::Router::Validate(options.router));
  if (!(options.resource_monitor.thermal_limit_c >= 0)) {
    return absl::InvalidArgumentError(StrCat("thermal limit must be >= 0 degrees C (0: none), got ",
                                             options.resource_monitor.thermal_limit_c));
  }
  monitor_ = std::make_unique<router::ResourceMonitor>(options.resource_monitor);
  if (expert_cache_ != nullptr) monitor_->set_pool_capacity(expert_cache_->stats().capacity_experts);
  router_ = std::make_unique<router::Router>(pool_.kernels(), options.router,
                                             static_cast<int>(spec_.n_layer),
                                             static_cast<int>(spec_.n_expert), monitor_.get());
  std::vector<float> bias;
  if (!options.modality_bias_path.empty()) {
    MOERT_ASSIGN_OR_RETURN(bias, router::ReadModalityBias(options.modality_bias_path));
  } else if (file.FindKey(router::kModalityBiasKey) != nullptr) {
    MOERT_ASSIGN_OR_RETURN(bias, file.GetFloatArray(router::kModalityBiasKey));
  }
  MOERT_RETURN_IF_ERROR(router_->SetModalityBias(std::move(bias)));
  for (LayerWeights& layer : layers_) layer.moe.adaptive_router = router_.get();
  return absl::OkStatus();
}

absl::Status DecoderModel::SetPrefetch(bool enabled, int depth) {
  const int n_layer = static_cast<int>(spec_.n_layer);
  if (enabled && (depth < 1 || depth >= std::max(2, n_layer))) {
    return absl::InvalidArgumentError(StrCat("prefetch depth must be in [1, ",
                                             std::max(1, n_layer - 1),
                                             "] (layers ahead), got ", depth));
  }
  if (expert_cache_ != nullptr) expert_cache_->Drain();
  for (LayerWeights& layer : layers_) {
    layer.moe.prefetcher = nullptr;
    layer.moe.prefetch_router = nullptr;
    layer.moe.prefetch_layer = -1;
  }
  prefetcher_.reset();
  if (!enabled || expert_cache_ == nullptr) return absl::OkStatus();
  prefetcher_ = std::make_unique<pipeline::Prefetcher>(
      expert_cache_.get(), n_layer, static_cast<int>(spec_.n_expert),
      static_cast<int>(spec_.n_expert_used), depth);
  for (int il = 0; il < n_layer; ++il) {
    MoeWeights& moe = layers_[static_cast<size_t>(il)].moe;
    moe.prefetcher = prefetcher_.get();
    if (il + depth < n_layer) {
      moe.prefetch_router = &layers_[static_cast<size_t>(il + depth)].moe.router;
      moe.prefetch_layer = il + depth;
    }
  }
  return absl::OkStatus();
}

absl::Status DecoderModel::SetUpExpertPool(const format::GgufFile& file,
                                           const ModelLoadOptions& options) {
  const double fraction = options.expert_pool_fraction;
  if (!(fraction >= 0 && fraction <= 1)) {
    return absl::InvalidArgumentError(
        StrCat("expert_pool_fraction must be in (0, 1], got ", fraction));
  }
  if (!options.quantized_kernels) {
    return absl::UnimplementedError(
        StrCat(file.name(), ": a memory budget or an expert pool needs the integer kernels "
                            "(quantized_kernels); the fp32 reference path keeps every expert "
                            "resident"));
  }
  const bool moe = spec_.is_moe();
  if (!moe && (options.expert_pool_bytes > 0 || fraction > 0)) {
    return absl::InvalidArgumentError(
        StrCat(file.name(), ": an expert pool needs a mixture-of-experts model; this one is dense"));
  }
  std::optional<experts::ExpertDirectory> directory;
  if (moe) {
    MOERT_ASSIGN_OR_RETURN(
        experts::ExpertDirectory dir,
        experts::ExpertDirectory::Build(file, static_cast<int>(spec_.n_layer),
                                        static_cast<int>(spec_.n_expert), spec_.n_embd,
                                        spec_.n_ff_expert));
    directory.emplace(std::move(dir));
  }

  // What stays outside the pool, measured by a dry run of the loading code.
  WeightLoader measure(file, {}, /*pack=*/true);
  measure.set_measure_only(true);
  measure.set_skip_routed_experts(moe);
  MOERT_RETURN_IF_ERROR(LoadTensors(measure));
  const uint64_t positions = options.kv_cache_positions > 0
                                 ? static_cast<uint64_t>(options.kv_cache_positions)
                                 : uint64_t{spec_.n_ctx_train};
  memory_.persistent_bytes = measure.measured_bytes();
  memory_.kv_cache_bytes = KvCacheBytes(spec_, positions);
  memory_.scratch_bytes = ScratchBytes(spec_, positions);
  if (directory) {
    // The loader's staging buffer: three slots of the largest part plus alignment.
    const uint64_t a = experts::kDirectAlignment;
    memory_.scratch_bytes +=
        experts::kExpertParts * ((directory->max_part_file_bytes() + 3 * a - 1) / a * a);
  }
  const uint64_t fixed = memory_.persistent_bytes + memory_.kv_cache_bytes + memory_.scratch_bytes;
  const uint64_t budget = options.memory_budget_bytes;
  const std::string fixed_text =
      StrCat("the persistent weights (", memory_.persistent_bytes, " bytes), the KV cache (",
             memory_.kv_cache_bytes, " bytes for ", positions, " positions) and scratch (",
             memory_.scratch_bytes, " bytes): ", fixed, " bytes");
  if (budget > 0 && fixed > budget) {
    return absl::ResourceExhaustedError(StrCat(file.name(), ": the memory budget of ", budget,
                                               " bytes cannot hold ", fixed_text,
                                               ", before any expert"));
  }
  if (!moe) {
    memory_.budget_bytes = budget;
    return absl::OkStatus();
  }

  const uint64_t min_block = options.expert_cache.min_block_bytes;
  const uint64_t block = experts::ExpertCache::BlockBytes(directory->max_runtime_bytes(), min_block);
  const uint64_t all = directory->expert_count() * block;
  uint64_t pool = 0;
  if (options.expert_pool_bytes > 0) {
    pool = options.expert_pool_bytes;
  } else if (fraction > 0) {
    pool = static_cast<uint64_t>(std::ceil(fraction * static_cast<double>(all)));
    pool = (pool + min_block - 1) / min_block * min_block;
  } else {
    pool = budget - fixed;
  }
  pool = std::min(pool, all) / min_block * min_block;
  if (budget > 0 && fixed + pool > budget) {
    return absl::ResourceExhaustedError(
        StrCat(file.name(), ": the memory budget of ", budget, " bytes cannot hold an expert pool of ",
               pool, " bytes on top of ", fixed_text));
  }
  const uint64_t k = spec_.n_expert_used;
  const uint64_t capacity = pool / block;
  if (capacity < k) {
    return absl::ResourceExhaustedError(StrCat(
        file.name(), ": the expert pool of ", pool, " bytes holds ", capacity, " experts (blocks of ",
        block, " bytes) but one token needs ", k, " experts resident together (", k * block,
        " bytes)",
        options.expert_pool_bytes == 0 && fraction == 0
            ? StrCat("; the pool is what the memory budget of ", budget, " bytes leaves after ",
                     fixed_text)
            : std::string()));
  }
  experts::ExpertCacheOptions cache_options = options.expert_cache;
  cache_options.pool_bytes = pool;
  cache_options.loader.mode = options.io_mode;
  MOERT_ASSIGN_OR_RETURN(expert_cache_,
                         experts::ExpertCache::Create(std::move(*directory), cache_options));
  memory_.expert_pool = true;
  memory_.budget_bytes = budget > 0 ? budget : fixed + pool;
  memory_.all_experts_bytes = all;
  memory_.experts_per_token = k;
  return absl::OkStatus();
}

MemoryStats DecoderModel::memory_stats() const {
  MemoryStats stats = memory_;
  if (expert_cache_ != nullptr) {
    stats.pool = expert_cache_->stats();
    stats.io_mode = std::string(experts::IoModeName(expert_cache_->loader().mode()));
    stats.io_fallback = expert_cache_->loader().fallback_reason();
  }
  if (prefetcher_ != nullptr) {
    stats.prefetch = true;
    stats.prefetch_depth = prefetcher_->depth();
    stats.prefetcher = prefetcher_->stats();
  }
  return stats;
}

absl::Status DecoderModel::SaveHotSet() {
  if (expert_cache_ == nullptr || hot_set_path_.empty()) return absl::OkStatus();
  const experts::ExpertDirectory& dir = expert_cache_->directory();
  return experts::WriteHotSet(hot_set_path_, {dir.file_size(), dir.n_layer(), dir.n_expert()},
                              expert_cache_->HotExperts(expert_cache_->stats().capacity_experts));
}

absl::Status DecoderModel::LoadTensors(WeightLoader& loader) {
  const int64_t n_embd = spec_.n_embd;
  MOERT_RETURN_IF_ERROR(
      loader.Load(TensorWeightName(TensorKind::kTokenEmbd), spec_.n_vocab, n_embd, &token_embd_));
  MOERT_RETURN_IF_ERROR(
      loader.LoadVector(TensorWeightName(TensorKind::kOutputNorm), n_embd, &output_norm_));
  if (!spec_.tied_embeddings) {
    MOERT_RETURN_IF_ERROR(
        loader.LoadMatMul(TensorWeightName(TensorKind::kOutput), spec_.n_vocab, n_embd, 1,
                          &output_));
  }
  MOERT_RETURN_IF_ERROR(loader.LoadOptionalVector(TensorWeightName(TensorKind::kRopeFreqs),
                                                  spec_.n_rot / 2, &rope_freqs_));
  layers_.resize(spec_.n_layer);
  for (int il = 0; il < static_cast<int>(spec_.n_layer); ++il) {
    MOERT_RETURN_IF_ERROR(LoadLayer(loader, il, &layers_[il]));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvCache>> DecoderModel::NewKvCache(int n_ctx) const {
  if (n_ctx < 1 || n_ctx > kMaxCacheContext) {
    return absl::InvalidArgumentError(
        StrCat("KV cache size ", n_ctx, " is outside [1, ", kMaxCacheContext, "]"));
  }
  const uint64_t bytes = uint64_t(n_ctx) * spec_.n_layer *
                         uint64_t(KeyWidth(spec_) + ValueWidth(spec_)) * sizeof(float);
  if (bytes > kMaxCacheBytes) {
    return absl::InvalidArgumentError(StrCat("a KV cache of ", n_ctx, " positions needs ", bytes,
                                             " bytes, above the cap of ", kMaxCacheBytes));
  }
  try {
    return std::unique_ptr<KvCache>(std::make_unique<DecoderKvCache>(
        n_ctx, static_cast<int>(spec_.n_layer), KeyWidth(spec_), ValueWidth(spec_)));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        StrCat("cannot allocate a KV cache of ", n_ctx, " positions (", bytes, " bytes)"));
  }
}

absl::Status DecoderModel::Forward(std::span<const int32_t> tokens, KvCache* cache, LogitsFor which,
                                   std::vector<float>* logits) {
  if (cache == nullptr || logits == nullptr) {
    return absl::InvalidArgumentError("Forward needs a KV cache and a logits vector");
  }
  auto* kv = dynamic_cast<DecoderKvCache*>(cache);
  if (kv == nullptr || !kv->Fits(spec_)) {
    return absl::InvalidArgumentError("the KV cache was not made by this model");
  }
  if (tokens.empty()) return absl::InvalidArgumentError("Forward got an empty batch");
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || static_cast<uint32_t>(tokens[i]) >= spec_.n_vocab) {
      return absl::InvalidArgumentError(StrCat("token id ", tokens[i], " at batch index ", i,
                                               " is outside the vocabulary [0, ", spec_.n_vocab,
                                               ")"));
    }
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t pos0 = kv->size();
  if (n > kv->capacity() - pos0) {
    return absl::OutOfRangeError(StrCat("positions ", pos0, "..", pos0 + n - 1,
                                        " pass the KV cache capacity of ", kv->capacity(),
                                        " positions (", pos0, " already filled)"));
  }

  const int64_t n_vocab = spec_.n_vocab;
  logits->resize(static_cast<size_t>(which == LogitsFor::kAll ? n * n_vocab : n_vocab));
  for (int64_t b = 0; b < n; b += kMaxMicroBatch) {
    const int64_t m = std::min(kMaxMicroBatch, n - b);
    int64_t first_row = m;  // no logits from this micro-batch
    float* dst = logits->data();
    if (which == LogitsFor::kAll) {
      first_row = 0;
      dst += b * n_vocab;
    } else if (b + m == n) {
      first_row = m - 1;
    }
    absl::Status status = ForwardBatch(tokens.subspan(static_cast<size_t>(b), static_cast<size_t>(m)),
                                       pos0 + b, kv, first_row, dst);
    if (!status.ok()) {
      kv->set_size(static_cast<int>(pos0));  // the cache as it was
      return status;
    }
    kv->set_size(static_cast<int>(pos0 + b + m));
  }
  return absl::OkStatus();
}

absl::Status DecoderModel::ForwardBatch(std::span<const int32_t> tokens, int64_t pos0,
                                        DecoderKvCache* cache, int64_t first_logit_row,
                                        float* logits) {
  // One step of the pool's clocks per batch, on whichever backend runs it (the device
  // path runs the MoE blocks on the host too).
  if (expert_cache_ != nullptr) expert_cache_->BeginStep();
  if (router_ != nullptr) router_->BeginStep();
  if (prefetcher_ != nullptr) prefetcher_->BeginStep();
  if (opencl_ != nullptr) {
    absl::Status status =
        opencl_->ForwardBatch(tokens, pos0, cache->Host(), first_logit_row, logits);
    if (status.ok()) {
      ++device_batches_;
      device_failures_in_a_row_ = 0;
      return status;
    }
    if (!fallback_to_cpu_) return status;
    // Backend::kAuto: this batch runs on the CPU. A device run that failed part-way
    // left the host cache below pos0 as it was (it writes host rows only from pos0,
    // which the CPU rewrites below); the device copy is stale from pos0 on, so the
    // next device run uploads those rows from the host.
    ++backend_.fallbacks;
    backend_.last_fallback = status.ToString();
    if (++device_failures_in_a_row_ < kDeviceFailuresBeforeCpu) {
      opencl_->Invalidate(cache->id(), pos0);
    } else {
      // A device that fails every request (lost, reset, out of memory for good) would
      // only add its failure's latency to each: the CPU runs the rest, and the
      // device's memory (the weights' copies) is freed.
      backend_.cpu_reason = StrCat(
          "the OpenCL device ", backend_.device, " failed ", device_failures_in_a_row_,
          " requests in a row; the CPU runs the rest (the last: ", std::string(status.message()),
          ")");
      backend_.backend = "CPU";
      backend_.device.clear();
      backend_.driver.clear();
      opencl_.reset();
    }
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t n_embd = spec_.n_embd;
  std::vector<float> x(static_cast<size_t>(n * n_embd));
  for (int64_t t = 0; t < n; ++t) {
    const float* row = token_embd_.row(tokens[t]);
    std::copy(row, row + n_embd, x.begin() + t * n_embd);
  }
  std::vector<float> cur(x.size()), out(x.size());

  LayerContext ctx;
  ctx.pool = &pool_;
  ctx.spec = &spec_;
  ctx.rope.n_rot = static_cast<int>(spec_.n_rot);
  ctx.rope.theta_base = spec_.rope_theta;
  ctx.rope.freq_scale =
      spec_.rope_scaling == format::RopeScaling::kLinear ? 1.0f / spec_.rope_scaling_factor : 1.0f;
  ctx.rope.freq_factors = rope_freqs_.empty() ? nullptr : rope_freqs_.data();
  ctx.n_tokens = n;
  ctx.pos0 = pos0;
  ctx.x = x.data();
  ctx.cur = &cur;
  ctx.out = &out;
  ctx.ffn_input_observer = &ffn_input_observer_;
  for (int il = 0; il < static_cast<int>(spec_.n_layer); ++il) {
    ctx.k_cache = cache->keys(il);
    ctx.v_cache = cache->values(il);
    ctx.layer = il;
    MOERT_RETURN_IF_ERROR(RunLayer(ctx, layers_[il]));
  }

  if (first_logit_row >= n) return absl::OkStatus();
  const int64_t rows = n - first_logit_row;
  RmsNorm(x.data() + first_logit_row * n_embd, rows, n_embd, output_norm_.data(), spec_.rms_eps,
          cur.data());
  MatMul(pool_, output_.empty() ? token_embd_ : output_, cur.data(), rows, logits);
  return absl::OkStatus();
}

absl::Status LoadAttention(WeightLoader& loader, const ModelSpec& spec, int layer,
                           const AttentionOptions& options, AttentionWeights* w) {
  const int64_t n_embd = spec.n_embd;
  const int64_t q_width = int64_t{spec.n_head} * spec.head_dim_k;
  const int64_t k_width = KeyWidth(spec);
  const int64_t v_width = ValueWidth(spec);
  const int64_t o_width = int64_t{spec.n_head} * spec.head_dim_v;
  MOERT_RETURN_IF_ERROR(
      loader.LoadMatMul(TensorWeightName(TensorKind::kAttnQ, layer), q_width, n_embd, 1, &w->wq));
  MOERT_RETURN_IF_ERROR(
      loader.LoadMatMul(TensorWeightName(TensorKind::kAttnK, layer), k_width, n_embd, 1, &w->wk));
  MOERT_RETURN_IF_ERROR(
      loader.LoadMatMul(TensorWeightName(TensorKind::kAttnV, layer), v_width, n_embd, 1, &w->wv));
  MOERT_RETURN_IF_ERROR(
      loader.LoadMatMul(TensorWeightName(TensorKind::kAttnOut, layer), n_embd, o_width, 1, &w->wo));
  struct Bias {
    TensorKind kind;
    int64_t width;
    std::vector<float>* out;
  };
  for (const Bias& b :
       {Bias{TensorKind::kAttnQ, q_width, &w->bq}, Bias{TensorKind::kAttnK, k_width, &w->bk},
        Bias{TensorKind::kAttnV, v_width, &w->bv}}) {
    const std::string name = format::TensorBiasName(b.kind, layer);
    MOERT_RETURN_IF_ERROR(options.bias ? loader.LoadVector(name, b.width, b.out)
                                       : loader.LoadOptionalVector(name, b.width, b.out));
  }
  if (options.qk_norm != format::QkNorm::kNone) {
    const bool per_head = options.qk_norm == format::QkNorm::kPerHead;
    MOERT_RETURN_IF_ERROR(loader.LoadVector(TensorWeightName(TensorKind::kAttnQNorm, layer),
                                            per_head ? spec.head_dim_k : q_width, &w->q_norm));
    MOERT_RETURN_IF_ERROR(loader.LoadVector(TensorWeightName(TensorKind::kAttnKNorm, layer),
                                            per_head ? spec.head_dim_k : k_width, &w->k_norm));
  }
  return absl::OkStatus();
}

absl::Status LoadDenseFfn(WeightLoader& loader, const ModelSpec& spec, int layer, FfnWeights* w) {
  const int64_t n_embd = spec.n_embd;
  const int64_t n_ff = spec.n_ff;
  MOERT_RETURN_IF_ERROR(
      loader.LoadMatMul(TensorWeightName(TensorKind::kFfnGate, layer), n_ff, n_embd, 1, &w->gate));
  MOERT_RETURN_IF_ERROR(
      loader.LoadMatMul(TensorWeightName(TensorKind::kFfnUp, layer), n_ff, n_embd, 1, &w->up));
  return loader.LoadMatMul(TensorWeightName(TensorKind::kFfnDown, layer), n_embd, n_ff, 1, &w->down);
}

absl::Status LoadMoeFfn(WeightLoader& loader, const ModelSpec& spec, int layer, bool shared_expert,
                        MoeWeights* w) {
  const int64_t n_embd = spec.n_embd;
  const int64_t n_expert = spec.n_expert;
  const int64_t n_ff = spec.n_ff_expert;
  w->n_expert = static_cast<int>(spec.n_expert);
  w->n_used = static_cast<int>(spec.n_expert_used);
  w->n_ff = static_cast<int>(spec.n_ff_expert);
  w->renormalize = spec.renormalize_topk;
  MOERT_RETURN_IF_ERROR(
      loader.Load(TensorWeightName(TensorKind::kFfnGateInp, layer), n_expert, n_embd, &w->router));
  if (loader.skip_routed_experts()) {
    // In the expert pool: loaded on demand (experts::ExpertCache).
    for (TensorKind kind :
         {TensorKind::kFfnGateExps, TensorKind::kFfnUpExps, TensorKind::kFfnDownExps}) {
      MOERT_RETURN_IF_ERROR(loader.Check(TensorWeightName(kind, layer), n_expert * n_ff * n_embd));
    }
  } else {
    MOERT_RETURN_IF_ERROR(loader.LoadMatMul(TensorWeightName(TensorKind::kFfnGateExps, layer),
                                            n_expert * n_ff, n_embd, n_expert, &w->gate_exps));
    MOERT_RETURN_IF_ERROR(loader.LoadMatMul(TensorWeightName(TensorKind::kFfnUpExps, layer),
                                            n_expert * n_ff, n_embd, n_expert, &w->up_exps));
    MOERT_RETURN_IF_ERROR(loader.LoadMatMul(TensorWeightName(TensorKind::kFfnDownExps, layer),
                                            n_expert * n_embd, n_ff, n_expert, &w->down_exps));
  }
  if (!shared_expert) return absl::OkStatus();
  const int64_t n_shared = spec.n_ff_shared_expert;
  MOERT_RETURN_IF_ERROR(loader.LoadMatMul(TensorWeightName(TensorKind::kFfnGateShexp, layer), n_shared,
                                    n_embd, 1, &w->shared.gate));
  MOERT_RETURN_IF_ERROR(loader.LoadMatMul(TensorWeightName(TensorKind::kFfnUpShexp, layer), n_shared,
                                    n_embd, 1, &w->shared.up));
  MOERT_RETURN_IF_ERROR(loader.LoadMatMul(TensorWeightName(TensorKind::kFfnDownShexp, layer), n_embd,
                                    n_shared, 1, &w->shared.down));
  return loader.Load(TensorWeightName(TensorKind::kFfnGateInpShexp, layer), 1, n_embd,
                     &w->shared_gate);
}

void RunAttention(LayerContext& ctx, const AttentionWeights& w, const AttentionOptions& options,
                  const float* in, float* out) {
  const ModelSpec& spec = *ctx.spec;
  const int64_t n = ctx.n_tokens;
  const int n_head = static_cast<int>(spec.n_head);
  const int n_head_kv = static_cast<int>(spec.n_head_kv);
  const int dk = static_cast<int>(spec.head_dim_k);
  const int64_t q_width = int64_t{n_head} * dk;
  const int64_t k_width = KeyWidth(spec);
  const int64_t v_width = ValueWidth(spec);
  std::vector<float> q(static_cast<size_t>(n * q_width));
  std::vector<float> k(static_cast<size_t>(n * k_width));
  std::vector<float> v(static_cast<size_t>(n * v_width));
  const MatMulJob qkv[3] = {
      {w.wq, in, n, q.data()}, {w.wk, in, n, k.data()}, {w.wv, in, n, v.data()}};
  MatMuls(*ctx.pool, qkv);
  if (!w.bq.empty()) AddBias(w.bq, n, q.data());
  if (!w.bk.empty()) AddBias(w.bk, n, k.data());
  if (!w.bv.empty()) AddBias(w.bv, n, v.data());

  if (options.qk_norm == format::QkNorm::kPerHead) {
    RmsNorm(q.data(), n * n_head, dk, w.q_norm.data(), spec.rms_eps, q.data());
    RmsNorm(k.data(), n * n_head_kv, dk, w.k_norm.data(), spec.rms_eps, k.data());
  } else if (options.qk_norm == format::QkNorm::kFullWidth) {
    RmsNorm(q.data(), n, q_width, w.q_norm.data(), spec.rms_eps, q.data());
    RmsNorm(k.data(), n, k_width, w.k_norm.data(), spec.rms_eps, k.data());
  }

  RopeParams rope = ctx.rope;
  rope.layout = options.rope;
  ApplyRope(rope, ctx.pos0, n, n_head, dk, q.data());
  ApplyRope(rope, ctx.pos0, n, n_head_kv, dk, k.data());

  std::copy(k.begin(), k.end(), ctx.k_cache + ctx.pos0 * k_width);
  std::copy(v.begin(), v.end(), ctx.v_cache + ctx.pos0 * v_width);

  AttentionShape shape;
  shape.n_head = n_head;
  shape.n_head_kv = n_head_kv;
  shape.head_dim_k = dk;
  shape.head_dim_v = static_cast<int>(spec.head_dim_v);
  shape.scale = 1.0f / std::sqrt(static_cast<float>(dk));
  std::vector<float> attn(static_cast<size_t>(n * n_head * shape.head_dim_v));
  Attention(*ctx.pool, shape, q.data(), n, ctx.pos0, ctx.k_cache, ctx.v_cache, attn.data());
  MatMul(*ctx.pool, w.wo, attn.data(), n, out);
}

void NormInto(LayerContext& ctx, const std::vector<float>& weight, std::vector<float>* cur) {
  RmsNorm(ctx.x, ctx.n_tokens, ctx.spec->n_embd, weight.data(), ctx.spec->rms_eps, cur->data());
}

void AddResidual(LayerContext& ctx, const std::vector<float>& out) {
  const int64_t size = ctx.n_tokens * ctx.spec->n_embd;
  for (int64_t i = 0; i < size; ++i) ctx.x[i] += out[i];
}

absl::Status PreNormDecoderModel::LoadLayer(WeightLoader& loader, int layer,
                                             LayerWeights* w) {
  const int64_t n_embd = spec().n_embd;
  MOERT_RETURN_IF_ERROR(loader.LoadVector(
      format::TensorWeightName(format::TensorKind::kAttnNorm, layer), n_embd, &w->attn_norm));
  MOERT_RETURN_IF_ERROR(LoadAttention(loader, spec(), layer, attention_, &w->attn));
  MOERT_RETURN_IF_ERROR(loader.LoadVector(
      format::TensorWeightName(format::TensorKind::kFfnNorm, layer), n_embd, &w->ffn_norm));
  if (spec().is_moe()) return LoadMoeFfn(loader, spec(), layer, shared_expert_, &w->moe);
  return LoadDenseFfn(loader, spec(), layer, &w->ffn);
}

absl::Status PreNormDecoderModel::RunLayer(LayerContext& ctx, const LayerWeights& w) {
  NormInto(ctx, w.attn_norm, ctx.cur);
  RunAttention(ctx, w.attn, attention_, ctx.cur->data(), ctx.out->data());
  AddResidual(ctx, *ctx.out);
  NormInto(ctx, w.ffn_norm, ctx.cur);
  if (ctx.ffn_input_observer != nullptr && *ctx.ffn_input_observer) {
    (*ctx.ffn_input_observer)(ctx.layer, ctx.n_tokens, ctx.cur->data());
  }
  if (spec().is_moe()) {
    MOERT_RETURN_IF_ERROR(MoeFfn(*ctx.pool, w.moe, ctx.cur->data(), ctx.n_tokens, ctx.out->data()));
  } else {
    SwiGluFfn(*ctx.pool, w.ffn, ctx.cur->data(), ctx.n_tokens, ctx.out->data());
  }
  AddResidual(ctx, *ctx.out);
  return absl::OkStatus();
}

}  // namespace moert::model
