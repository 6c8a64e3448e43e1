// The decoder-only transformer (see decoder.h): loading, the KV cache, batching, and
// which backend's layer graph runs a batch.
#include "model/decoder.h"
#include "model/kv_cache.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "core/cache_dir.h"
#include "core/status.h"
#include "core/strings.h"
#include "experts/expert_directory.h"
#include "experts/hot_set.h"
#include "experts/loader.h"
#include "backend/cpu_fallback.h"
#include "backend/registry.h"
#include "telemetry/runtime_metrics.h"

namespace moert::model {

using format::ModelSpec;
using format::TensorKind;
using format::TensorWeightName;

namespace {

// Long prompts run in micro-batches of this many tokens: the scratch stays bounded
// and the results are the same bit for bit (see layers.h).
constexpr int64_t kMaxMicroBatch = 512;

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


DecoderModel::DecoderModel(ModelSpec spec, int threads)
    : spec_(std::move(spec)),
      attention_{spec_.arch->rope, spec_.arch->qk_norm, spec_.arch->qkv_bias},
      pool_(threads),
      cpu_(std::make_unique<backend::cpu::CpuBackend>(pool_)) {}

DecoderModel::~DecoderModel() = default;

ModelWeights DecoderModel::Weights() const {
  ModelWeights w;
  w.spec = &spec_;
  w.token_embd = &token_embd_;
  w.output_norm = &output_norm_;
  w.output = &output_;
  w.rope_freqs = &rope_freqs_;
  w.layers = &layers_;
  w.attention = attention_;
  return w;
}

namespace {

// The hot set's name for a model: its file's name, with the offset for a model that
// starts inside a bigger file (several models in one APK get a hot set each).
std::string HotSetName(const format::GgufFile& file) {
  std::string name = std::filesystem::path(file.name()).filename().string();
  if (file.file_offset() > 0) name += StrCat("@", file.file_offset());
  return name;
}

pipeline::PooledPlacement PlacementOf(PooledExperts placement) {
  switch (placement) {
    case PooledExperts::kDevice:
      return pipeline::PooledPlacement::kDevice;
    case PooledExperts::kDeviceCopy:
      return pipeline::PooledPlacement::kDeviceCopy;
    case PooledExperts::kHost:
      return pipeline::PooledPlacement::kHost;
  }
  return pipeline::PooledPlacement::kDevice;
}

}  // namespace

absl::Status DecoderModel::SetUpBackend(const ModelLoadOptions& options) {
  GraphOptions cpu_options;
  cpu_options.ffn_input_observer = &ffn_input_observer_;
  cpu_options.op_observer = &op_observer_;
  cpu_options.dense_fallback = &dense_fallback_;
  cpu_options.k_type = kv_types_.k;
  cpu_options.v_type = kv_types_.v;
  cpu_graph_ = std::make_unique<LayerGraph>(*cpu_, Weights(), &moe_services_, nullptr, cpu_options);
  MOERT_RETURN_IF_ERROR(cpu_graph_->Init());
  if (options.backend == Backend::kCpu) return absl::OkStatus();
  const bool is_auto = options.backend == Backend::kAuto;
  // What a device does not run: kOpenCl says so, kAuto stays on the CPU.
  std::string cpu_only;
  if (options.ffn_input_observer || options.route_observer || options.op_observer) {
    cpu_only = "FFN input, routing and op observers run on the CPU only";
  } else if (options.kv_type_k != backend::KvType::kF32 ||
             options.kv_type_v != backend::KvType::kF32) {
    cpu_only = StrCat("a KV cache of ", backend::KvTypeName(options.kv_type_k), " keys and ",
                      backend::KvTypeName(options.kv_type_v), " values runs on the CPU only");
  } else if (expert_cache_ == nullptr &&
             (options.router.dynamic_k_p != 0 ||
              (options.router.modality_lambda != 0 && router_ != nullptr &&
               router_->has_modality_bias()) ||
              options.resource_monitor.thermal_limit_c != 0)) {
    // Without an expert pool the device routes (its top-k): the router's adjustments
    // need the host.
    cpu_only = "dynamic top-k, the modality bias and the thermal limit run on the CPU only";
  }
  if (!cpu_only.empty()) {
    if (is_auto) {
      backend_.cpu_reason = cpu_only;
      return absl::OkStatus();
    }
    return absl::UnimplementedError(StrCat("--backend opencl: ", cpu_only));
  }
  // The device: the caller's, or the OpenCL backend (backend/registry.h).
  absl::StatusOr<std::unique_ptr<backend::Backend>> device;
  if (options.device_backend) {
    device = options.device_backend();
  } else {
    backend::BackendOptions open;
    open.require_gpu = is_auto;
    open.allow_cpu_device = options.opencl_allow_cpu_device;
    open.cache_dir = options.cache_dir;
    device = backend::CreateBackend("opencl", open);
    if (!device.ok() && absl::IsNotFound(device.status())) {
      device = absl::FailedPreconditionError(
          "--backend opencl: moert was built without the OpenCL backend (OpenCL not found at build)");
      if (is_auto) device = absl::FailedPreconditionError("moert was built without the OpenCL backend");
    }
  }
  absl::Status status = device.status();
  if (status.ok()) {
    // What the device lacks runs on the CPU (backend/cpu_fallback.h).
    device_ = std::make_unique<backend::CpuFallbackBackend>(std::move(*device), *cpu_);
    GraphOptions device_options;
    device_options.placement = PlacementOf(options.opencl_pooled_experts);
    device_options.kv_half = options.opencl_kv_half;
    device_options.dense_fallback = &dense_fallback_;
    device_graph_ = std::make_unique<LayerGraph>(*device_, Weights(), &moe_services_,
                                                 cpu_graph_.get(), device_options);
    status = device_graph_->Init();
  }
  if (!status.ok()) {
    device_graph_.reset();
    device_.reset();
    if (is_auto) {
      backend_.cpu_reason = std::string(status.message());
      return absl::OkStatus();
    }
    return status;
  }
  fallback_to_cpu_ = is_auto;
  const backend::DeviceDescription d = device_->device();
  backend_.backend = std::string(device_->name());
  backend_.device = StrCat(d.name, " (", d.type, ")");
  backend_.driver = d.driver;
  return absl::OkStatus();
}

BackendStats DecoderModel::backend_stats() const {
  BackendStats stats = backend_;
  stats.fallbacks = failures_.fallbacks();
  stats.last_fallback = failures_.last_failure();
  stats.device_batches = failures_.device_batches();
  if (device_graph_ != nullptr) {
    stats.cpu_placed_ops = device_->cpu_ops();
    stats.device_weight_bytes = device_graph_->weight_bytes();
    stats.device_kv_bytes = device_graph_->kv_bytes();
    if (expert_cache_ != nullptr) {
      const pipeline::PooledStats pooled = device_graph_->pooled_stats();
      stats.pooled_experts = pooled.placement;
      stats.pooled_device_batches = pooled.device_batches;
      stats.pooled_host_batches = pooled.host_batches;
      stats.pooled_published_bytes = pooled.published_bytes;
    }
  }
  return stats;
}


absl::Status DecoderModel::LoadWeights(const format::GgufFile& file,
                                       const ModelLoadOptions& options) {
  if (options.isa) {
    MOERT_ASSIGN_OR_RETURN(kernels::KernelConfig config, kernels::KernelConfigFor(*options.isa));
    pool_.set_kernels(config);
  }
  ffn_input_observer_ = options.ffn_input_observer;
  registry_ = telemetry::RegistryOrOwn(options.metrics);
  kv_types_ = {options.kv_type_k, options.kv_type_v};
  // A row width the type cannot hold is named now, not at the first cache.
  MOERT_RETURN_IF_ERROR(backend::KvRowBytes(kv_types_.k, KeyWidth(spec_)).status());
  MOERT_RETURN_IF_ERROR(backend::KvRowBytes(kv_types_.v, ValueWidth(spec_)).status());
  if (options.memory_budget_bytes > 0 || options.expert_pool_bytes > 0 ||
      options.expert_pool_fraction != 0) {
    MOERT_RETURN_IF_ERROR(SetUpExpertPool(file, options));
  }
  if (budget_ == nullptr) {  // no budget: the ledger only counts the KV caches
    budget_ = std::make_shared<memory::MemoryBudget>(memory::BudgetOptions{});
    memory_.kv_cache_positions = options.kv_cache_positions > 0
                                     ? options.kv_cache_positions
                                     : static_cast<int>(std::max<uint32_t>(spec_.n_ctx_train, 1));
  }
  WeightLoader loader(file, options.progress, options.quantized_kernels);
  loader.set_cancel(options.cancel);
  if (expert_cache_ != nullptr) {
    loader.set_skip_routed_experts(true);
    loader.set_release_pages(true);
  }
  MOERT_RETURN_IF_ERROR(LoadTensors(loader));
  moe_services_.router_latency.assign(layers_.size(), nullptr);
  for (size_t il = 0; il < layers_.size(); ++il) {
    if (layers_[il].moe.n_expert > 0) {
      moe_services_.router_latency[il] = &telemetry::RouterLatency(*registry_, static_cast<int>(il));
    }
  }
  if (options.lock_weights) weight_lock_.Lock(DenseWeightRanges(Weights()));
  if (expert_cache_ != nullptr) {
    moe_services_.cache = expert_cache_.get();
    if (options.hot_set) {
      hot_set_path_ = options.hot_set_path;
      if (hot_set_path_.empty()) {
        const std::string dir = core::CacheDirOr(options.cache_dir);
        if (!dir.empty()) {
          hot_set_path_ = StrCat(
              dir, "/hot/",
              experts::HotSetPath(HotSetName(file)));
        }
      }
      memory_.hot_set_path = hot_set_path_;
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
  // Auto polls on the CPU with every expert resident. With a pool the loader's threads
  // need the cores while a step waits for a load, and with a device its driver's (an
  // OpenCL device may be the CPU itself): spinning workers would hold one.
  pool_.set_poll(options.poll > 0 || (options.poll < 0 && expert_cache_ == nullptr &&
                                      options.backend == Backend::kCpu));
  MOERT_RETURN_IF_ERROR(SetUpRouter(file, options));
  MOERT_RETURN_IF_ERROR(SetPrefetch(options.prefetch, options.prefetch_depth));
  MOERT_RETURN_IF_ERROR(SetUpBackend(options));
  if (options.progress) options.progress(1.0f);
  return absl::OkStatus();
}

absl::Status DecoderModel::SetUpRouter(const format::GgufFile& file,
                                       const ModelLoadOptions& options) {
  route_observer_ = options.route_observer;
  moe_services_.route_observer = &route_observer_;
  op_observer_ = options.op_observer;
  moe_services_.op_observer = &op_observer_;
  last_router_logits_.assign(layers_.size(), {});
  moe_services_.last_router_logits = &last_router_logits_;
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
                                             static_cast<int>(spec_.n_expert), monitor_.get(),
                                             registry_.get());
  std::vector<float> bias;
  if (!options.modality_bias_path.empty()) {
    MOERT_ASSIGN_OR_RETURN(bias, router::ReadModalityBias(options.modality_bias_path));
  } else {
    for (const char* key : {router::kModalityBiasKey, router::kLegacyModalityBiasKey}) {
      if (file.FindKey(key) == nullptr) continue;
      MOERT_ASSIGN_OR_RETURN(bias, file.GetFloatArray(key));
      break;
    }
  }
  MOERT_RETURN_IF_ERROR(router_->SetModalityBias(std::move(bias)));
  moe_services_.router = router_.get();
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
  moe_services_.prefetcher = nullptr;
  moe_services_.prefetch_depth = 0;
  prefetcher_.reset();
  if (!enabled || expert_cache_ == nullptr) return absl::OkStatus();
  prefetcher_ = std::make_unique<pipeline::Prefetcher>(
      expert_cache_.get(), n_layer, static_cast<int>(spec_.n_expert),
      static_cast<int>(spec_.n_expert_used), depth, registry_.get());
  moe_services_.prefetcher = prefetcher_.get();
  moe_services_.prefetch_depth = depth;
  return absl::OkStatus();
}

void DecoderModel::CancelPendingLoads() {
  if (expert_cache_ != nullptr) expert_cache_->CancelQueuedLoads();
}

absl::Status DecoderModel::SetDenseFallback(bool on) {
  if (!has_dense_fallback_) return Model::SetDenseFallback(on);
  dense_fallback_requested_.store(on, std::memory_order_release);
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
  memory_.persistent_bytes = measure.measured_bytes();
  memory_.scratch_bytes = ScratchBytes(
      spec_, options.kv_cache_positions > 0 ? static_cast<uint64_t>(options.kv_cache_positions)
                                            : uint64_t{spec_.n_ctx_train});
  if (directory) {
    // The loader's staging buffer: three slots of the largest part plus alignment.
    const uint64_t a = experts::kDirectAlignment;
    memory_.scratch_bytes +=
        experts::kExpertParts * ((directory->max_part_file_bytes() + 3 * a - 1) / a * a);
  }
  // The runtime's own heap, thread stacks and code pages, which no arena holds: without
  // them, a budget the pool fills to the last page (it charges experts their pages)
  // would end with the process's resident set just past it.
  memory_.scratch_bytes += kRuntimeAllowanceBytes;
  const uint64_t budget = options.memory_budget_bytes;
  const uint64_t base = memory_.persistent_bytes + memory_.scratch_bytes;
  if (budget > 0 && base > budget && options.kv_cache_positions == 0) {  // else named below
    return absl::ResourceExhaustedError(StrCat(
        file.name(), ": the memory budget of ", budget, " bytes cannot hold the persistent weights (",
        memory_.persistent_bytes, " bytes) and scratch (", memory_.scratch_bytes,
        " bytes), before any KV cache or expert"));
  }

  // The pool's geometry: what one expert charges the budget (its pages, not its
  // power-of-two block: ExpertCache::ChargeBytes), every expert, the pool's floor (one
  // token's experts in every MoE layer, unless given).
  uint64_t charge = 0, all = 0, pool = 0, floor = 0;
  const uint64_t min_block = options.expert_cache.min_block_bytes;
  const bool pool_is_rest = moe && options.expert_pool_bytes == 0 && fraction == 0;
  const uint64_t k = spec_.n_expert_used;
  if (moe) {
    charge = std::min(experts::ExpertCache::ChargeBytes(directory->max_runtime_bytes()),
                      experts::ExpertCache::BlockBytes(directory->max_runtime_bytes(), min_block));
    all = directory->expert_count() * charge;
    if (options.expert_pool_bytes > 0) {
      pool = options.expert_pool_bytes;
    } else if (fraction > 0) {
      pool = static_cast<uint64_t>(std::ceil(fraction * static_cast<double>(all)));
      pool = (pool + charge - 1) / charge * charge;
    }
    pool = std::min(pool, all) / charge * charge;
    floor = options.expert_pool_floor_bytes > 0
                ? options.expert_pool_floor_bytes
                : k * static_cast<uint64_t>(directory->n_layer()) * charge;
    floor = std::max(floor / charge * charge, k * charge);
  }

  // The context the budget sets aside a KV cache for: given, else what fits (at most the
  // training context; with a budget, at most half of what the weights and scratch leave
  // when the pool takes the rest, and never the pool's floor).
  const uint64_t per_position = KvCacheBytes(spec_, 1, kv_types_);
  uint64_t positions = static_cast<uint64_t>(std::max(options.kv_cache_positions, 0));
  if (positions == 0) {
    positions = std::max<uint64_t>(spec_.n_ctx_train, 1);
    if (budget > 0) {
      const uint64_t avail = budget - base;
      const uint64_t pool_part = pool_is_rest ? floor : pool;
      uint64_t room = avail > pool_part ? avail - pool_part : 0;
      if (pool_is_rest) room = std::min(room, avail / 2);
      uint64_t fits = room / per_position;
      if (fits >= 256) fits = fits / 256 * 256;
      if (fits == 0) {
        return absl::ResourceExhaustedError(StrCat(
            file.name(), ": the memory budget of ", budget, " bytes leaves ", avail,
            " bytes after the persistent weights and scratch", moe ? " and an expert pool of " : "",
            moe ? StrCat(pool_part, " bytes") : std::string(), ": not one KV cache position (",
            per_position, " bytes)"));
      }
      positions = std::min(positions, fits);
    }
  }
  memory_.kv_cache_positions = static_cast<int>(positions);
  memory_.kv_cache_bytes = KvCacheBytes(spec_, positions, kv_types_);
  const uint64_t fixed = base + memory_.kv_cache_bytes;
  const std::string fixed_text =
      StrCat("the persistent weights (", memory_.persistent_bytes, " bytes), the KV cache (",
             memory_.kv_cache_bytes, " bytes for ", positions, " positions) and scratch (",
             memory_.scratch_bytes, " bytes): ", fixed, " bytes");
  if (budget > 0 && fixed > budget) {
    return absl::ResourceExhaustedError(StrCat(file.name(), ": the memory budget of ", budget,
                                               " bytes cannot hold ", fixed_text,
                                               ", before any expert"));
  }
  memory::BudgetOptions ledger;
  ledger.budget_bytes = budget;
  ledger.fixed_bytes = base;
  ledger.shrink_pool = options.shrink_pool_for_kv;
  if (!moe) {
    memory_.budget_bytes = budget;
    budget_ = std::make_shared<memory::MemoryBudget>(ledger);
    return absl::OkStatus();
  }

  if (pool_is_rest) pool = std::min(budget - fixed, all) / charge * charge;
  if (budget > 0 && fixed + pool > budget) {
    return absl::ResourceExhaustedError(
        StrCat(file.name(), ": the memory budget of ", budget, " bytes cannot hold an expert pool of ",
               pool, " bytes on top of ", fixed_text));
  }
  const uint64_t capacity = pool / charge;
  if (capacity < k) {
    return absl::ResourceExhaustedError(
        StrCat(file.name(), ": the expert pool of ", pool, " bytes holds ", capacity, " experts (",
               charge, " bytes each) but one token needs ", k, " experts resident together (",
               k * charge, " bytes)",
               pool_is_rest ? StrCat("; the pool is what the memory budget of ", budget,
                                     " bytes leaves after ", fixed_text)
                            : std::string()));
  }
  experts::ExpertCacheOptions cache_options = options.expert_cache;
  cache_options.pool_bytes = pool;
  cache_options.loader.mode = options.io_mode;
  cache_options.metrics = registry_;
  MOERT_ASSIGN_OR_RETURN(expert_cache_,
                         experts::ExpertCache::Create(std::move(*directory), cache_options));
  memory_.expert_pool = true;
  memory_.budget_bytes = budget > 0 ? budget : fixed + pool;
  memory_.all_experts_bytes = all;
  memory_.experts_per_token = k;
  ledger.pool_bytes = pool;
  ledger.pool_floor_bytes = std::min(floor, pool);
  ledger.pool_granule = charge;
  budget_ = std::make_shared<memory::MemoryBudget>(ledger);
  return absl::OkStatus();
}

void DecoderModel::ApplyMemoryLimits(bool drop_unused) {
  if (expert_cache_ == nullptr) return;
  const uint64_t target = budget_->pool_target();
  if (target != expert_cache_->pool_limit()) expert_cache_->SetPoolLimit(target);
  if (drop_unused) expert_cache_->EvictUnused();
}

absl::Status DecoderModel::Defragment() {
  if (expert_cache_ == nullptr) return Model::Defragment();
  return expert_cache_->Defragment();
}

absl::Status DecoderModel::UseCpuBackend(std::string_view why) {
  if (device_graph_ == nullptr) return Model::UseCpuBackend(why);
  GiveUpDevice(
      StrCat("the ", backend_.backend, " device ", backend_.device, " was given up: ", why));
  return absl::OkStatus();
}

void DecoderModel::GiveUpDevice(std::string reason) {
  backend_.cpu_reason = std::move(reason);
  backend_.backend = "CPU";
  backend_.device.clear();
  backend_.driver.clear();
  device_graph_.reset();
  device_.reset();
}

MemoryStats DecoderModel::memory_stats() const {
  MemoryStats stats = memory_;
  stats.locked_bytes = weight_lock_.locked_bytes();
  {
    std::lock_guard<std::mutex> lock(hot_set_mutex_);
    stats.hot_set_error = hot_set_error_;
  }
  stats.lock_error = weight_lock_.error();
  if (budget_ != nullptr) stats.ledger = budget_->stats();
  if (expert_cache_ != nullptr) {
    stats.pool = expert_cache_->stats();
    stats.io_mode = std::string(experts::IoModeName(expert_cache_->loader().mode()));
    stats.io_fallback = expert_cache_->loader().fallback_reason();
    if (const std::optional<experts::IoEngine> engine = expert_cache_->loader().io_engine()) {
      stats.io_engine = std::string(experts::IoEngineName(*engine));
    }
    stats.io_engine_fallback = expert_cache_->loader().io_engine_fallback_reason();
  }
  if (prefetcher_ != nullptr) {
    stats.prefetch = true;
    stats.prefetch_depth = prefetcher_->depth();
    stats.prefetcher = prefetcher_->stats();
  }
  return stats;
}

std::string DecoderModel::pool_state() const {
  if (expert_cache_ == nullptr) return "";
  const experts::ExpertCacheStats st = expert_cache_->stats();
  std::string out =
      StrCat("pool_bytes=", st.pool_bytes, "\nblock_bytes=", st.block_bytes,
             "\ncharge_bytes=", st.charge_bytes, "\nused_bytes=", st.used_bytes,
             "\nfree_bytes=", st.free_bytes, "\nlargest_free_block=", st.largest_free_block,
             "\nfragmentation=", st.fragmentation, "\nresident_experts=", st.resident_experts,
             "\npinned_experts=", st.pinned_experts, "\nhits=", st.hits, "\nmisses=", st.misses,
             "\nevictions=", st.evictions, "\n");
  const experts::ExpertDirectory& dir = expert_cache_->directory();
  // Per layer: the residency bitmap (64-bit words, hex, expert 0 the lowest bit of the
  // first) and the live blocks (expert@offset), which are the buddy allocator's.
  for (int l = 0; l < dir.n_layer(); ++l) {
    if (!dir.has_layer(l)) continue;
    std::string words, blocks;
    for (uint64_t w : expert_cache_->residency(l)) {
      char hex[20];
      std::snprintf(hex, sizeof(hex), "%s%016llx", words.empty() ? "" : ",",
                    static_cast<unsigned long long>(w));
      words += hex;
    }
    for (int e = 0; e < dir.n_expert(); ++e) {
      if (const std::optional<uint64_t> at = expert_cache_->BlockOffset(l, e)) {
        blocks += StrCat(blocks.empty() ? "" : ",", e, "@", *at);
      }
    }
    out += StrCat("layer", l, "_resident=", words, "\nlayer", l, "_blocks=", blocks, "\n");
  }
  return out;
}

absl::Status DecoderModel::SaveHotSet() {
  if (expert_cache_ == nullptr || hot_set_path_.empty()) return absl::OkStatus();
  const experts::ExpertDirectory& dir = expert_cache_->directory();
  absl::Status status =
      core::EnsureDirectory(std::filesystem::path(hot_set_path_).parent_path().string());
  if (status.ok()) {
    status = experts::WriteHotSet(
        hot_set_path_, {dir.file_size(), dir.n_layer(), dir.n_expert()},
        expert_cache_->HotExperts(expert_cache_->stats().capacity_experts));
  }
  std::lock_guard<std::mutex> lock(hot_set_mutex_);
  hot_set_error_ = status.ok() ? std::string() : std::string(status.message());
  return status;
}

absl::Status DecoderModel::LoadTensors(WeightLoader& loader) {
  const int64_t n_embd = spec_.n_embd;
  // Tied to the lm head, the table stays fp32: the head multiplies by it.
  MOERT_RETURN_IF_ERROR(
      loader.LoadEmbedding(TensorWeightName(TensorKind::kTokenEmbd), spec_.n_vocab, n_embd,
                           /*keep_quantized=*/!spec_.tied_embeddings, &token_embd_));
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
  int fallbacks = 0;
  for (int il = 0; il < static_cast<int>(spec_.n_layer); ++il) {
    MOERT_RETURN_IF_ERROR(LoadLayer(loader, il, &layers_[il]));
    fallbacks += layers_[il].dense_fallback.gate.empty() ? 0 : 1;
  }
  // In measure mode the matrices stay empty: the flag is set by the real load.
  if (fallbacks > 0 && fallbacks < static_cast<int>(spec_.n_layer)) {
    for (int il = 0; il < static_cast<int>(spec_.n_layer); ++il) {
      if (!layers_[il].dense_fallback.gate.empty()) continue;
      return absl::InvalidArgumentError(StrCat(
          "missing tensor '", TensorWeightName(TensorKind::kFfnGateDenseFallback, il), "': ",
          fallbacks, " of ", spec_.n_layer,
          " MoE layers have a dense fallback FFN (moert-pack --dense-fallback writes every one)"));
    }
  }
  has_dense_fallback_ = spec_.is_moe() && fallbacks == static_cast<int>(spec_.n_layer);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvCache>> DecoderModel::NewKvCache(int n_ctx) const {
  MOERT_ASSIGN_OR_RETURN(std::unique_ptr<DecoderKvCache> cache,
                         DecoderKvCache::Create(*cpu_, spec_, kv_types_, n_ctx, budget_));
  return std::unique_ptr<KvCache>(std::move(cache));
}

absl::Status DecoderModel::Forward(const ForwardInput& input, KvCache* cache, LogitsFor which,
                                   std::vector<float>* logits) {
  if (cache == nullptr || logits == nullptr) {
    return absl::InvalidArgumentError("Forward needs a KV cache and a logits vector");
  }
  auto* kv = dynamic_cast<DecoderKvCache*>(cache);
  if (kv == nullptr || !kv->Fits(spec_, kv_types_)) {
    return absl::InvalidArgumentError("the KV cache was not made by this model");
  }
  const std::span<const int32_t> tokens = input.tokens;
  if (tokens.empty()) return absl::InvalidArgumentError("Forward got an empty batch");
  const int64_t e = spec_.n_embd;
  int64_t rows = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == kEmbeddingToken) {
      ++rows;
    } else if (tokens[i] < 0 || static_cast<uint32_t>(tokens[i]) >= spec_.n_vocab) {
      return absl::InvalidArgumentError(StrCat("token id ", tokens[i], " at batch index ", i,
                                               " is outside the vocabulary [0, ", spec_.n_vocab,
                                               ")"));
    }
  }
  if (input.embeddings.size() != static_cast<size_t>(rows * e)) {
    return absl::InvalidArgumentError(
        StrCat("the batch has ", rows, " embedding positions (", rows * e,
               " floats of width n_embd ", e, ") but ", input.embeddings.size(),
               " embedding floats were given"));
  }
  for (size_t i = 0; i < input.embeddings.size(); ++i) {
    if (!std::isfinite(input.embeddings[i])) {
      return absl::InvalidArgumentError(StrCat("embedding row ", static_cast<int64_t>(i) / e,
                                               " holds a non-finite value at column ",
                                               static_cast<int64_t>(i) % e));
    }
  }
  if (!(input.image_share >= 0 && input.image_share <= 1)) {
    return absl::InvalidArgumentError(
        StrCat("image_share must be in [0, 1], got ", input.image_share));
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t pos0 = kv->size();
  if (n > kv->capacity() - pos0) {
    return absl::OutOfRangeError(StrCat("positions ", pos0, "..", pos0 + n - 1,
                                        " pass the KV cache capacity of ", kv->capacity(),
                                        " positions (", pos0, " already filled)"));
  }

  const bool dense_fallback = dense_fallback_requested_.load(std::memory_order_acquire);
  // Prefetches queued for the routed experts would only load what no step uses now.
  if (dense_fallback && !dense_fallback_) CancelPendingLoads();
  dense_fallback_ = dense_fallback;
  ApplyMemoryLimits(/*drop_unused=*/false);
  if (router_ != nullptr) router_->SetImageShare(input.image_share);
  const int64_t n_vocab = spec_.n_vocab;
  logits->resize(static_cast<size_t>(which == LogitsFor::kAll ? n * n_vocab : n_vocab));
  size_t row = 0;  // the next embedding row
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
    BatchInput batch;
    batch.tokens = tokens.subspan(static_cast<size_t>(b), static_cast<size_t>(m));
    const size_t batch_rows = static_cast<size_t>(
        std::count(batch.tokens.begin(), batch.tokens.end(), kEmbeddingToken));
    batch.embeddings = input.embeddings.subspan(row * static_cast<size_t>(e),
                                                batch_rows * static_cast<size_t>(e));
    row += batch_rows;
    absl::Status status = ForwardBatch(batch, pos0 + b, kv, first_row, dst);
    if (!status.ok()) {
      kv->set_size(static_cast<int>(pos0));  // the cache as it was
      return status;
    }
    kv->set_size(static_cast<int>(pos0 + b + m));
  }
  return absl::OkStatus();
}

absl::Status DecoderModel::ForwardBatch(const BatchInput& input, int64_t pos0,
                                        DecoderKvCache* cache, int64_t first_logit_row,
                                        float* logits) {
  // One step of the pool's clocks per batch, on whichever backend runs it.
  if (expert_cache_ != nullptr) expert_cache_->BeginStep();
  if (router_ != nullptr) router_->BeginStep();
  if (prefetcher_ != nullptr) prefetcher_->BeginStep();
  const SequenceKv kv = cache->Sequence();
  if (device_graph_ != nullptr) {
    absl::Status status = device_graph_->Forward(input, pos0, kv, first_logit_row, logits);
    if (status.ok()) {
      failures_.OnSuccess();
      return status;
    }
    if (!fallback_to_cpu_) return status;
    // Backend::kAuto: this batch runs on the CPU. A device run that failed part-way
    // left the host cache below pos0 as it was (it writes host rows only from pos0,
    // which the CPU rewrites below); the device copy is stale from pos0 on, so the
    // next device run uploads those rows from the host.
    telemetry::BackendFailures(*registry_, backend_.backend).Increment();
    if (!failures_.OnFailure(status)) {
      device_graph_->Invalidate(cache->id(), pos0);
    } else {
      GiveUpDevice(StrCat("the ", backend_.backend, " device ", backend_.device, " failed ",
                          failures_.failures_in_a_row(),
                          " requests in a row; the CPU runs the rest (the last: ",
                          std::string(status.message()), ")"));
    }
  }
  return cpu_graph_->Forward(input, pos0, kv, first_logit_row, logits);
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

absl::Status LoadDenseFallbackFfn(WeightLoader& loader, const ModelSpec& spec, int layer,
                                  FfnWeights* w) {
  const TensorKind kinds[3] = {TensorKind::kFfnGateDenseFallback, TensorKind::kFfnUpDenseFallback,
                               TensorKind::kFfnDownDenseFallback};
  bool any = false;
  for (TensorKind kind : kinds) any = any || loader.Has(TensorWeightName(kind, layer));
  if (!any) return absl::OkStatus();
  const uint64_t n_embd = spec.n_embd, n_ff = spec.n_ff_expert;
  const uint64_t in_dims[2] = {n_embd, n_ff}, out_dims[2] = {n_ff, n_embd};
  Matrix* outs[3] = {&w->gate, &w->up, &w->down};
  for (int i = 0; i < 3; ++i) {
    const std::string name = TensorWeightName(kinds[i], layer);
    const bool down = kinds[i] == TensorKind::kFfnDownDenseFallback;
    MOERT_RETURN_IF_ERROR(loader.CheckDims(name, down ? out_dims : in_dims));
    const int64_t rows = static_cast<int64_t>(down ? n_embd : n_ff);
    const int64_t cols = static_cast<int64_t>(down ? n_ff : n_embd);
    MOERT_RETURN_IF_ERROR(loader.LoadMatMul(name, rows, cols, 1, outs[i]));
  }
  return absl::OkStatus();
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

absl::Status DecoderModel::LoadLayer(WeightLoader& loader, int layer, LayerWeights* w) {
  const int64_t n_embd = spec_.n_embd;
  MOERT_RETURN_IF_ERROR(loader.LoadVector(
      format::TensorWeightName(format::TensorKind::kAttnNorm, layer), n_embd, &w->attn_norm));
  MOERT_RETURN_IF_ERROR(LoadAttention(loader, spec_, layer, attention_, &w->attn));
  MOERT_RETURN_IF_ERROR(loader.LoadVector(
      format::TensorWeightName(format::TensorKind::kFfnNorm, layer), n_embd, &w->ffn_norm));
  if (spec_.is_moe()) {
    MOERT_RETURN_IF_ERROR(LoadMoeFfn(loader, spec_, layer, spec_.arch->shared_expert, &w->moe));
    return LoadDenseFallbackFfn(loader, spec_, layer, &w->dense_fallback);
  }
  return LoadDenseFfn(loader, spec_, layer, &w->ffn);
}

}  // namespace moert::model
