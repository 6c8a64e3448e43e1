// MoERuntime: options, model loading (GGUF -> model, tokenizer, chat template) and
// sessions on the loaded model.
#include "moert/runtime.h"

#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "backend/kv_type.h"
#include "core/status.h"
#include "core/strings.h"
#include "experts/delta_package.h"
#include "experts/io_mode.h"
#include "format/gguf.h"
#include "format/model_spec.h"
#include "model/chat_template.h"
#include "model/model.h"
#include "pipeline/degrade_policy.h"
#include "runtime/internal.h"
#include "runtime/repro.h"
#include "telemetry/crash_repro.h"
#include "telemetry/platform.h"
#include "telemetry/runtime_metrics.h"
#include "telemetry/trace.h"
#include "tokenizer/tokenizer.h"

namespace moert {
namespace runtime {

experts::IoMode ToExpertsIoMode(IoMode mode) {
  switch (mode) {
    case IoMode::kDirect:
      return experts::IoMode::kDirect;
    case IoMode::kBuffered:
      return experts::IoMode::kBuffered;
    case IoMode::kMmap:
      return experts::IoMode::kMmap;
  }
  return experts::IoMode::kDirect;
}

model::Backend ToModelBackend(Backend backend) {
  return backend == Backend::kOpenCl ? model::Backend::kOpenCl
         : backend == Backend::kAuto ? model::Backend::kAuto
                                     : model::Backend::kCpu;
}

const char* ChatTemplateName(model::ChatTemplateKind kind) {
  switch (kind) {
    case model::ChatTemplateKind::kChatMl:
      return "chatml";
    case model::ChatTemplateKind::kLlama2:
      return "llama2";
    case model::ChatTemplateKind::kLlama3:
      return "llama3";
    case model::ChatTemplateKind::kPlain:
      return "plain";
  }
  return "plain";
}

int64_t PeakRssBytes() {
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux and Android: KiB
}

namespace {

// Every load error names the file: messages from below that do not are prefixed.
absl::Status WithPath(const absl::Status& status, const std::string& path) {
  if (status.ok()) return status;
  const std::string message(status.message());
  if (message.find(path) != std::string::npos) return status;
  return absl::Status(status.code(), StrCat(path, ": ", message));
}

// Reports progress rising monotonically, keeping 1 for the very end of the load.
class ProgressReporter {
 public:
  explicit ProgressReporter(const ProgressCallback& callback) : callback_(callback) {}

  void Report(float fraction) {
    if (!callback_) return;
    if (!(fraction >= last_)) return;  // also drops NaN
    last_ = std::min(fraction, kBeforeDone);
    if (!callback_(last_)) cancel_.store(true);
  }
  const std::atomic<bool>* cancel() const { return &cancel_; }
  bool cancelled() const { return cancel_.load(); }
  void Done() {
    if (callback_) callback_(1.0f);
  }

 private:
  static constexpr float kBeforeDone = 0.999f;
  const ProgressCallback& callback_;
  float last_ = 0.0f;
  std::atomic<bool> cancel_{false};
};


}  // namespace

absl::StatusOr<std::shared_ptr<LoadedModel>> Load(const ModelSource& source,
                                                  const RuntimeOptions& options,
                                                  const ProgressCallback& progress,
                                                  std::shared_ptr<telemetry::Registry> metrics) {
  const auto start = std::chrono::steady_clock::now();
  ProgressReporter reporter(progress);
  reporter.Report(0.0f);
  // A bad rule file is named before the model is read.
  pipeline::DegradePolicyOptions degrade;
  if (options.degrade_policy && !options.degrade_rules_path.empty()) {
    MOERT_ASSIGN_OR_RETURN(degrade.rules,
                           pipeline::ReadDegradeRulesFile(options.degrade_rules_path));
  }

  const std::string path =
      source.length.has_value() ? StrCat(source.path, "@", source.offset) : source.path;
  auto file = source.length.has_value()
                  ? format::GgufFile::OpenRange(source.path, source.offset, *source.length)
                  : format::GgufFile::Open(source.path);
  if (!file.ok()) return WithPath(file.status(), path);
  const format::GgufFile& gguf = **file;
  if (gguf.tensors().empty()) {
    return absl::InvalidArgumentError(
        StrCat(path, " is not an LLM: it has no tensors (only metadata, such as a vocabulary)"));
  }
  // The hyperparameters and tensor shapes first: an unsupported architecture or a
  // broken model is named before anything is read at length.
  const absl::Status spec_status = format::ReadModelSpec(gguf).status();
  if (!spec_status.ok()) return WithPath(spec_status, path);
  auto tokenizer = tokenizer::Tokenizer::FromGguf(gguf);
  if (!tokenizer.ok()) return WithPath(tokenizer.status(), path);

  model::ModelLoadOptions load_options;
  load_options.threads = options.threads;
  load_options.poll = options.poll;
  load_options.progress = [&reporter](float fraction) { reporter.Report(fraction); };
  load_options.cancel = reporter.cancel();
  load_options.memory_budget_bytes = static_cast<uint64_t>(options.memory_budget_bytes);
  load_options.expert_pool_bytes = static_cast<uint64_t>(options.expert_pool_bytes);
  load_options.expert_pool_fraction = options.expert_pool_fraction;
  load_options.io_mode = ToExpertsIoMode(options.io_mode);
  load_options.hot_set = options.hot_set;
  load_options.cache_dir = options.cache_dir;
  load_options.router.alpha = options.router_alpha;
  load_options.router.dynamic_k_p = options.dynamic_k;
  load_options.resource_monitor.thermal_limit_c = options.thermal_limit_c;
  load_options.router.modality_lambda = options.modality_lambda;
  load_options.modality_bias_path = options.modality_bias_path;
  load_options.shrink_pool_for_kv = options.shrink_pool_for_sessions;
  // Checked by CheckOptions.
  load_options.kv_type_k = backend::ParseKvType(options.cache_type_k).value_or(backend::KvType::kF32);
  load_options.kv_type_v = backend::ParseKvType(options.cache_type_v).value_or(backend::KvType::kF32);
  load_options.expert_pool_floor_bytes = static_cast<uint64_t>(options.expert_pool_floor_bytes);
  load_options.prefetch = options.prefetch;
  load_options.lock_weights = options.lock_weights;
  load_options.expert_cache.loader.wait_deadline_ms =
      static_cast<uint32_t>(options.loader_wait_deadline_ms);  // checked by CheckOptions
  load_options.prefetch_depth = options.prefetch_depth;
  load_options.backend = ToModelBackend(options.backend);
  // The budget sets the KV cache aside for the context sessions will get (0: what fits).
  load_options.kv_cache_positions = options.context_length;
  load_options.metrics = metrics;
  auto model = model::Model::Load(gguf, load_options);
  if (!model.ok()) {
    if (reporter.cancelled()) {
      return absl::CancelledError(StrCat("loading ", path, " was cancelled by the progress callback"));
    }
    return WithPath(model.status(), path);
  }
  const format::ModelSpec& spec = (*model)->spec();
  if (static_cast<uint32_t>(tokenizer->vocab().size()) > spec.n_vocab) {
    return absl::InvalidArgumentError(
        StrCat(path, ": the vocabulary has ", tokenizer->vocab().size(),
               " tokens but the model's output has only ", spec.n_vocab));
  }

  auto loaded =
      std::make_shared<LoadedModel>(std::move(*model), std::move(*tokenizer), std::move(metrics));
  // A template of no known family falls back to plain rather than failing the load.
  loaded->chat_template = model::ChatTemplateKind::kPlain;
  if (gguf.FindKey("tokenizer.chat_template") != nullptr) {
    auto text = gguf.GetString("tokenizer.chat_template");
    if (text.ok()) {
      auto kind = model::DetectChatTemplate(*text, /*allow_plain_fallback=*/true);
      if (kind.ok()) loaded->chat_template = *kind;
    }
  }
  loaded->context_length = loaded->model->memory_stats().kv_cache_positions;
  loaded->source = source;
  loaded->options = options;
  loaded->inference_guard = options.inference_guard;
  loaded->degrade_rules = options.degrade_policy;
  loaded->degrade = std::move(degrade);

  ModelInfo& info = loaded->info;
  info.path = path;
  info.architecture = spec.arch != nullptr ? std::string(spec.arch->name) : std::string();
  info.name = spec.name;
  info.vocab_size = static_cast<int>(spec.n_vocab);
  for (const format::GgufTensorInfo& tensor : gguf.tensors()) {
    info.parameters += static_cast<int64_t>(tensor.n_elements);
  }
  info.layers = static_cast<int>(spec.n_layer);
  info.embedding_length = static_cast<int>(spec.n_embd);
  info.experts = static_cast<int>(spec.n_expert);
  info.experts_used = static_cast<int>(spec.n_expert_used);
  info.file_offset = static_cast<int64_t>(source.offset);
  info.training_context_length = static_cast<int>(spec.n_ctx_train);
  info.context_length = loaded->context_length;
  info.chat_template = ChatTemplateName(loaded->chat_template);
  const model::BackendStats backend = loaded->model->backend_stats();
  info.backend = backend.backend;
  info.device = backend.device;
  info.driver = backend.driver;
  info.backend_note = backend.cpu_reason;
  info.pooled_experts = backend.pooled_experts;
  const model::MemoryStats memory = loaded->model->memory_stats();
  info.locked_bytes = static_cast<int64_t>(memory.locked_bytes);
  info.hot_set_path = memory.hot_set_path;
  info.lock_note = memory.lock_error;
  loaded->repro = MakeReproSettings(options, info);
  if (options.repro_on_crash) {
    // A handler that cannot be installed leaves the load as it is, and says so.
    const absl::Status crash =
        loaded->repro.dir.empty()
            ? absl::FailedPreconditionError("no repro directory (repro_dir or cache_dir)")
            : telemetry::InstallCrashHandler(loaded->repro.dir);
    loaded->repro.on_crash = crash.ok();
    if (!crash.ok()) {
      telemetry::Log(telemetry::LogLevel::kWarning,
                     StrCat("repro_on_crash: no crash bundles: ", crash.message()));
    }
  }
  info.load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  reporter.Done();
  return loaded;
}

absl::StatusOr<ModelSource> SourceOfFd(int fd, int64_t offset, int64_t length) {
  // Each bad argument by name: an app passes these straight from an AssetFileDescriptor.
  if (fd < 0) {
    return absl::InvalidArgumentError(
        StrCat("fd ", fd, " is negative: not an open file (a closed descriptor?)"));
  }
  if (offset < 0) {
    return absl::InvalidArgumentError(
        StrCat("a model from fd ", fd, " at offset ", offset, ": the offset is negative"));
  }
  if (length < 0) {
    return absl::InvalidArgumentError(
        StrCat("a model from fd ", fd, " of length ", length, ": the length is negative"));
  }
  struct stat by_fd {};
  if (::fstat(fd, &by_fd) != 0) {
    return absl::InvalidArgumentError(
        StrCat("fd ", fd, " is not an open file: ", std::strerror(errno)));
  }
  if (!S_ISREG(by_fd.st_mode)) {
    return absl::InvalidArgumentError(StrCat("fd ", fd, " is not a regular file"));
  }
  // The loader opens the file again (O_DIRECT, its own offsets): by the name the fd has.
  const std::string link = StrCat("/proc/self/fd/", fd);
  std::error_code error;
  std::string path = std::filesystem::read_symlink(link, error).string();
  struct stat by_name {};
  if (error || ::stat(path.c_str(), &by_name) != 0 || by_name.st_dev != by_fd.st_dev ||
      by_name.st_ino != by_fd.st_ino) {
    return absl::InvalidArgumentError(
        StrCat("fd ", fd, " names no file moert can open again (", link, " -> '", path,
               "'): pass a file that has a path, such as an APK's asset or a model file"));
  }
  const uint64_t size = static_cast<uint64_t>(by_fd.st_size);
  const uint64_t start = static_cast<uint64_t>(offset);
  if (start > size || static_cast<uint64_t>(length) > size - start) {
    return absl::InvalidArgumentError(StrCat("'", path, "' (fd ", fd, ") has ", size,
                                             " bytes: no model of ", length, " bytes at offset ",
                                             offset, " (the range ends past the end of the file)"));
  }
  ModelSource source;
  source.path = std::move(path);
  source.offset = start;
  source.length = length > 0 ? static_cast<uint64_t>(length) : size - start;
  return source;
}

}  // namespace runtime

namespace runtime {

void Trim(LoadedModel& model, int level) {
  // Android's levels: 5 running moderate, 10 running low, 15 running critical, 20 UI
  // hidden, 40 background, 60 moderate, 80 complete (TrimLevel in runtime.h).
  double pool_fraction = 1;
  bool drop_unused = false;
  bool free_idle_sessions = false;
  if (level >= 80) {
    pool_fraction = 0;
    drop_unused = free_idle_sessions = true;
  } else if (level >= 40 || (level >= 15 && level < 20)) {
    pool_fraction = 0;
    drop_unused = true;
  } else if (level >= 10) {
    pool_fraction = 0.5;
    drop_unused = true;
  } else if (level >= 5) {
    pool_fraction = 0.75;
  }
  const std::shared_ptr<model::Model> weights = model.Weights();
  if (memory::MemoryBudget* budget = weights->budget(); budget != nullptr) {
    budget->Trim(pool_fraction);
  }
  // The router reads the level as device memory pressure (docs/routing.md).
  if (router::ResourceMonitor* monitor = weights->resource_monitor(); monitor != nullptr) {
    monitor->SetTrimLevel(router::TrimLevelFromAndroid(level));
  }
  {
    // Between steps: now; during one, the next step keeps to the new limit.
    std::unique_lock<std::mutex> lock(model.forward_mutex, std::try_to_lock);
    if (lock.owns_lock()) model.model->ApplyMemoryLimits(drop_unused);
  }
  if (free_idle_sessions) {
    std::lock_guard<std::mutex> lock(model.sessions_mutex);
    for (Session::Impl* session : model.sessions) session->ReleaseIfIdle();
  }
}

}  // namespace runtime

struct MOERT_RUNTIME_HIDDEN MoERuntime::Impl {
  // Guards what follows: calls documented for any thread (SetTemperature, TrimMemory,
  // CreateSession) read them while LoadModel may replace them.
  mutable std::mutex mutex;
  RuntimeOptions options;
  float temperature = std::numeric_limits<float>::quiet_NaN();  // SetTemperature's
  int trim_level = 0;                                           // TrimMemory's
  std::shared_ptr<runtime::LoadedModel> model;
  // The runtime's own session for one-shot Generate, made on first use; one call at a
  // time runs on it (one_shot_mutex, taken before `mutex`).
  mutable std::mutex one_shot_mutex;
  std::unique_ptr<Session> one_shot;
  // What every model this runtime loads publishes to: counters go on across reloads.
  const std::shared_ptr<telemetry::Registry> metrics = [] {
    auto registry = std::make_shared<telemetry::Registry>();
    telemetry::RegisterRuntimeMetrics(*registry);
    return registry;
  }();

  std::shared_ptr<runtime::LoadedModel> Model() const {
    std::lock_guard<std::mutex> lock(mutex);
    return model;
  }
};

MoERuntime::MoERuntime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MoERuntime::~MoERuntime() = default;

namespace {

// Create's and SetOptions' checks; fills in the thread count.
Status CheckOptions(RuntimeOptions* options) {
  if (options->threads < 0) {
    return Status(StatusCode::kInvalidArgument,
                  StrCat("threads must be >= 0 (0: one per CPU), got ", options->threads));
  }
  if (options->poll < -1 || options->poll > 100) {
    return Status(StatusCode::kInvalidArgument,
                  StrCat("poll must be -1..100 (-1: auto, 0: idle threads sleep at once), got ",
                         options->poll));
  }
  if (options->context_length < 0) {
    return Status(
        StatusCode::kInvalidArgument,
        StrCat("context_length must be >= 0 (0: the model's), got ", options->context_length));
  }
  if (options->memory_budget_bytes < 0 || options->expert_pool_bytes < 0) {
    return Status(StatusCode::kInvalidArgument,
                  StrCat("memory_budget_bytes and expert_pool_bytes must be >= 0 (0: unset), got ",
                         options->memory_budget_bytes, " and ", options->expert_pool_bytes));
  }
  for (const std::string* type : {&options->cache_type_k, &options->cache_type_v}) {
    if (absl::StatusOr<backend::KvType> parsed = backend::ParseKvType(*type); !parsed.ok()) {
      return Status(StatusCode::kInvalidArgument,
                    StrCat(type == &options->cache_type_k ? "cache_type_k" : "cache_type_v", ": ",
                           parsed.status().message()));
    }
  }
  if (options->repro_max_bytes < 0) {
    return Status(StatusCode::kInvalidArgument,
                  StrCat("repro_max_bytes must be >= 0 (0: 5 MB), got ", options->repro_max_bytes));
  }
  if (options->loader_wait_deadline_ms < 1) {
    return Status(StatusCode::kInvalidArgument,
                  StrCat("loader_wait_deadline_ms must be >= 1 (a wait always has a deadline), got ",
                         options->loader_wait_deadline_ms));
  }
  if (options->expert_pool_floor_bytes < 0) {
    return Status(StatusCode::kInvalidArgument,
                  StrCat("expert_pool_floor_bytes must be >= 0 (0: one token's experts per layer), "
                         "got ", options->expert_pool_floor_bytes));
  }
  if (!(options->expert_pool_fraction >= 0 && options->expert_pool_fraction <= 1)) {
    return Status(StatusCode::kInvalidArgument,
                  StrCat("expert_pool_fraction must be in (0, 1] (0: unset), got ",
                         options->expert_pool_fraction));
  }
  if (options->backend != Backend::kCpu && options->backend != Backend::kOpenCl &&
      options->backend != Backend::kAuto) {
    return Status(StatusCode::kInvalidArgument,
                  StrCat("unknown backend ", static_cast<int>(options->backend)));
  }
  if (options->io_mode != IoMode::kDirect && options->io_mode != IoMode::kBuffered &&
      options->io_mode != IoMode::kMmap) {
    return Status(StatusCode::kInvalidArgument,
                  StrCat("unknown io_mode ", static_cast<int>(options->io_mode)));
  }
  if (!(options->router_alpha >= 0) || !std::isfinite(options->router_alpha)) {
    return Status(StatusCode::kInvalidArgument,
                  StrCat("router_alpha must be a finite number >= 0 (0: off), got ",
                         options->router_alpha));
  }
  if (!(options->dynamic_k >= 0 && options->dynamic_k <= 1)) {
    return Status(StatusCode::kInvalidArgument,
                  StrCat("dynamic_k must be in [0, 1] (0: off), got ", options->dynamic_k));
  }
  if (!(options->thermal_limit_c >= 0) || !std::isfinite(options->thermal_limit_c)) {
    return Status(StatusCode::kInvalidArgument,
                  StrCat("thermal_limit_c must be >= 0 degrees C (0: none), got ",
                         options->thermal_limit_c));
  }
  if (!std::isfinite(options->modality_lambda)) {
    return Status(StatusCode::kInvalidArgument,
                  StrCat("modality_lambda must be finite (0: off), got ", options->modality_lambda));
  }
  if (options->prefetch_depth < 1) {
    return Status(StatusCode::kInvalidArgument,
                  StrCat("prefetch_depth must be >= 1 (layers ahead), got ", options->prefetch_depth));
  }
  if (!options->update_public_key.empty()) {
    if (auto key = experts::ParsePublicKey(options->update_public_key); !key.ok()) {
      return Status(StatusCode::kInvalidArgument,
                    StrCat("update_public_key: ", key.status().message()));
    }
  }
  if (options->threads == 0) {
    options->threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  return Status();
}

}  // namespace

Status MoERuntime::Create(const RuntimeOptions& options, std::unique_ptr<MoERuntime>* runtime) {
  if (runtime == nullptr) {
    return Status(StatusCode::kInvalidArgument, "MoERuntime::Create: runtime is null");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (Status status = CheckOptions(&impl->options); !status.ok()) return status;
  runtime->reset(new MoERuntime(std::move(impl)));
  return Status();
}

std::string MoERuntime::Metrics() const { return impl_->metrics->PrometheusText(); }

void SetTracing(bool enabled) {
  if (enabled) {
    telemetry::EnableTracing();
  } else {
    telemetry::DisableTracing();
  }
}

void ClearTrace() { telemetry::ClearTrace(); }

Status WriteTrace(const std::string& path) {
  if (path.empty()) return Status(StatusCode::kInvalidArgument, "WriteTrace: empty path");
  return runtime::FromAbsl(telemetry::WriteTraceFile(path));
}

Status MoERuntime::SetOptions(const RuntimeOptions& options) {
  RuntimeOptions checked = options;
  if (Status status = CheckOptions(&checked); !status.ok()) return status;
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->options = checked;
  return Status();
}

Status MoERuntime::SaveHotSet() {
  const std::shared_ptr<runtime::LoadedModel> model = impl_->Model();
  if (model == nullptr) {
    return Status(StatusCode::kFailedPrecondition, "no model is loaded: call LoadModel first");
  }
  std::lock_guard<std::mutex> lock(model->forward_mutex);
  return runtime::FromAbsl(model->model->SaveHotSet());
}

namespace {

// The model's router reads the app's temperature (NaN: sysfs) and trim level.
void ApplyDeviceState(runtime::LoadedModel& model, float celsius) {
  // The monitor's state is atomic: no need to wait for a running Forward.
  const std::shared_ptr<model::Model> weights = model.Weights();
  router::ResourceMonitor* monitor = weights->resource_monitor();
  if (monitor == nullptr) return;
  monitor->SetTemperature(std::isnan(celsius) ? std::nullopt : std::optional<float>(celsius));
}

}  // namespace

Status MoERuntime::LoadModel(const std::string& path, const ProgressCallback& progress) {
  return LoadRange(path, 0, -1, progress);
}

Status MoERuntime::LoadModelFromFd(int fd, int64_t offset, int64_t length,
                                   const ProgressCallback& progress) {
  auto source = runtime::SourceOfFd(fd, offset, length);
  if (!source.ok()) return runtime::FromAbsl(source.status());
  return LoadRange(source->path, source->offset, static_cast<int64_t>(*source->length), progress);
}

Status MoERuntime::LoadRange(const std::string& path, uint64_t offset, int64_t length,
                             const ProgressCallback& progress) {
  runtime::ModelSource source{path, offset, std::nullopt};
  if (length >= 0) source.length = static_cast<uint64_t>(length);
  RuntimeOptions options;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    options = impl_->options;
  }
  auto loaded = runtime::Load(source, options, progress, impl_->metrics);
  if (!loaded.ok()) return runtime::FromAbsl(loaded.status());
  std::shared_ptr<runtime::LoadedModel> old;
  std::unique_ptr<Session> old_one_shot;
  std::lock_guard<std::mutex> one_shot(impl_->one_shot_mutex);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  old = std::move(impl_->model);
  old_one_shot = std::move(impl_->one_shot);
  impl_->model = std::move(*loaded);
  const ModelInfo& info = impl_->model->info;
  if (telemetry::LogEnabled(telemetry::LogLevel::kDebug)) {
    telemetry::Log(telemetry::LogLevel::kDebug,
                   StrCat("loaded ", path, " (", info.architecture, ", ", info.backend, ") in ",
                          static_cast<int64_t>(info.load_ms), " ms"));
  }
  ApplyDeviceState(*impl_->model, impl_->temperature);
  runtime::Trim(*impl_->model, impl_->trim_level);
  return Status();
}

Status MoERuntime::LoadMmproj(const std::string& path) {
  const std::shared_ptr<runtime::LoadedModel> model = impl_->Model();
  if (model == nullptr) {
    return Status(StatusCode::kFailedPrecondition,
                  "no model is loaded: call LoadModel before LoadMmproj");
  }
  int threads = 1;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    threads = impl_->options.threads;
  }
  auto vision = runtime::VisionProjector::Load(
      path, static_cast<int64_t>(model->Weights()->spec().n_embd), threads);
  if (!vision.ok()) return runtime::FromAbsl(vision.status());
  std::shared_ptr<runtime::VisionProjector> projector = std::move(*vision);
  std::lock_guard<std::mutex> lock(model->forward_mutex);
  ModelInfo& info = model->info;
  info.mmproj_path = path;
  info.minicpmv_version = projector->hparams().minicpmv_version;
  info.image_tokens_per_slice = projector->hparams().n_query;
  model->vision = std::move(projector);
  return Status();
}

void MoERuntime::SetTemperature(float celsius) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->temperature = celsius;
  if (impl_->model != nullptr) ApplyDeviceState(*impl_->model, celsius);
}

Status MoERuntime::TrimMemory(int level) {
  if (level < 0) {
    return Status(StatusCode::kInvalidArgument,
                  StrCat("trim level must be >= 0 (Android's onTrimMemory levels), got ", level));
  }
  std::shared_ptr<runtime::LoadedModel> model;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->trim_level = level;
    model = impl_->model;
  }
  if (model != nullptr) runtime::Trim(*model, level);
  return Status();
}

bool MoERuntime::model_loaded() const { return impl_->Model() != nullptr; }

ModelInfo MoERuntime::model_info() const {
  const std::shared_ptr<runtime::LoadedModel> model = impl_->Model();
  if (model == nullptr) return ModelInfo();
  std::lock_guard<std::mutex> lock(model->forward_mutex);
  return model->info;
}

const RuntimeOptions& MoERuntime::options() const { return impl_->options; }

namespace {

Status NewSession(const std::shared_ptr<runtime::LoadedModel>& model, const SessionOptions& options,
                  bool stateless, std::unique_ptr<Session::Impl>* impl) {
  if (model == nullptr) {
    return Status(StatusCode::kFailedPrecondition, "no model is loaded: call LoadModel first");
  }
  if (options.context_length < 0) {
    return Status(StatusCode::kInvalidArgument,
                  StrCat("SessionOptions::context_length must be >= 0 (0: the runtime's), got ",
                         options.context_length));
  }
  // The cache and the weights it belongs to, read together (an update swaps them).
  std::unique_lock<std::mutex> step(model->forward_mutex);
  std::shared_ptr<model::Model> weights = model->model;
  auto cache = weights->NewKvCache(options.context_length > 0 ? options.context_length
                                                              : model->context_length);
  step.unlock();
  if (!cache.ok()) return runtime::FromAbsl(cache.status());
  *impl = std::make_unique<Session::Impl>(model, std::move(weights), std::move(*cache), stateless);
  return Status();
}

}  // namespace

Status MoERuntime::CreateSession(std::unique_ptr<Session>* session) {
  return CreateSession(SessionOptions(), session);
}

Status MoERuntime::CreateSession(const SessionOptions& options, std::unique_ptr<Session>* session) {
  if (session == nullptr) {
    return Status(StatusCode::kInvalidArgument, "CreateSession: session is null");
  }
  std::unique_ptr<Session::Impl> impl;
  Status status = NewSession(impl_->Model(), options, /*stateless=*/false, &impl);
  if (!status.ok()) return status;
  session->reset(new Session(std::move(impl)));
  return Status();
}

Status MoERuntime::Generate(const GenerateRequest& request, const TokenCallback& on_token,
                            GenerateResult* result) {
  std::lock_guard<std::mutex> one_shot(impl_->one_shot_mutex);
  if (impl_->one_shot == nullptr) {
    std::unique_ptr<Session::Impl> impl;
    Status status = NewSession(impl_->Model(), SessionOptions(), /*stateless=*/true, &impl);
    if (!status.ok()) return status;
    impl_->one_shot.reset(new Session(std::move(impl)));
  }
  return impl_->one_shot->Generate(request, on_token, result);
}

GenerationStats MoERuntime::Stats() const {
  std::lock_guard<std::mutex> one_shot(impl_->one_shot_mutex);
  return impl_->one_shot != nullptr ? impl_->one_shot->Stats() : GenerationStats();
}

// --- Expert hot updates (runtime/update.cc).

Status MoERuntime::ApplyUpdate(const std::string& package_path) {
  const std::shared_ptr<runtime::LoadedModel> model = impl_->Model();
  if (model == nullptr) {
    return Status(StatusCode::kFailedPrecondition, "no model is loaded: call LoadModel first");
  }
  std::string key;
  float celsius = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    key = impl_->options.update_public_key;
    celsius = impl_->temperature;
  }
  const absl::Status status = runtime::ApplyUpdate(*model, package_path, key, impl_->metrics);
  if (status.ok()) ApplyDeviceState(*model, celsius);
  return runtime::FromAbsl(status);
}

}  // namespace moert
