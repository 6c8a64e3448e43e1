// MoERuntime: options, model loading (GGUF -> model, tokenizer, chat template) and
// sessions on the loaded model.
#include "moert/runtime.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "core/status.h"
#include "core/strings.h"
#include "experts/io_mode.h"
#include "format/gguf.h"
#include "format/model_spec.h"
#include "model/chat_template.h"
#include "model/model.h"
#include "runtime/internal.h"
#include "tokenizer/tokenizer.h"

namespace moert {
namespace runtime {

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

absl::StatusOr<std::shared_ptr<LoadedModel>> Load(const std::string& path,
                                                  const RuntimeOptions& options,
                                                  const ProgressCallback& progress) {
  const auto start = std::chrono::steady_clock::now();
  ProgressReporter reporter(progress);
  reporter.Report(0.0f);

  auto file = format::GgufFile::Open(path);
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
  load_options.progress = [&reporter](float fraction) { reporter.Report(fraction); };
  load_options.cancel = reporter.cancel();
  load_options.memory_budget_bytes = static_cast<uint64_t>(options.memory_budget_bytes);
  load_options.expert_pool_bytes = static_cast<uint64_t>(options.expert_pool_bytes);
  load_options.expert_pool_fraction = options.expert_pool_fraction;
  load_options.io_mode = ToExpertsIoMode(options.io_mode);
  load_options.hot_set = options.hot_set;
  load_options.router.alpha = options.router_alpha;
  load_options.router.dynamic_k_p = options.dynamic_k;
  load_options.resource_monitor.thermal_limit_c = options.thermal_limit_c;
  load_options.router.modality_lambda = options.modality_lambda;
  load_options.modality_bias_path = options.modality_bias_path;
  load_options.prefetch = options.prefetch;
  load_options.prefetch_depth = options.prefetch_depth;
  load_options.backend = options.backend == Backend::kOpenCl ? model::Backend::kOpenCl
                         : options.backend == Backend::kAuto ? model::Backend::kAuto
                                                             : model::Backend::kCpu;
  // The budget sets the KV cache aside for the context sessions will get.
  if (auto spec = format::ReadModelSpec(gguf); spec.ok()) {
    load_options.kv_cache_positions =
        options.context_length > 0 ? options.context_length : static_cast<int>(spec->n_ctx_train);
  }
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

  auto loaded = std::make_shared<LoadedModel>(std::move(*model), std::move(*tokenizer));
  // A template of no known family falls back to plain rather than failing the load.
  loaded->chat_template = model::ChatTemplateKind::kPlain;
  if (gguf.FindKey("tokenizer.chat_template") != nullptr) {
    auto text = gguf.GetString("tokenizer.chat_template");
    if (text.ok()) {
      auto kind = model::DetectChatTemplate(*text, /*allow_plain_fallback=*/true);
      if (kind.ok()) loaded->chat_template = *kind;
    }
  }
  loaded->context_length =
      options.context_length > 0 ? options.context_length : static_cast<int>(spec.n_ctx_train);

  ModelInfo& info = loaded->info;
  info.path = path;
  info.architecture = spec.arch != nullptr ? std::string(spec.arch->name) : std::string();
  info.name = spec.name;
  info.vocab_size = static_cast<int>(spec.n_vocab);
  info.training_context_length = static_cast<int>(spec.n_ctx_train);
  info.context_length = loaded->context_length;
  info.chat_template = ChatTemplateName(loaded->chat_template);
  const model::BackendStats backend = loaded->model->backend_stats();
  info.backend = backend.backend;
  info.device = backend.device;
  info.driver = backend.driver;
  info.backend_note = backend.cpu_reason;
  info.pooled_experts = backend.pooled_experts;
  info.load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  reporter.Done();
  return loaded;
}

}  // namespace
}  // namespace runtime

struct MOERT_RUNTIME_HIDDEN MoERuntime::Impl {
  RuntimeOptions options;
  float temperature = std::numeric_limits<float>::quiet_NaN();  // SetTemperature's
  std::shared_ptr<runtime::LoadedModel> model;
  // The runtime's own session for one-shot Generate, made on first use.
  std::unique_ptr<Session> one_shot;
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

Status MoERuntime::SetOptions(const RuntimeOptions& options) {
  RuntimeOptions checked = options;
  if (Status status = CheckOptions(&checked); !status.ok()) return status;
  impl_->options = checked;
  return Status();
}

Status MoERuntime::SaveHotSet() {
  if (impl_->model == nullptr) {
    return Status(StatusCode::kFailedPrecondition, "no model is loaded: call LoadModel first");
  }
  std::lock_guard<std::mutex> lock(impl_->model->forward_mutex);
  return runtime::FromAbsl(impl_->model->model->SaveHotSet());
}

Status MoERuntime::LoadModel(const std::string& path, const ProgressCallback& progress) {
  auto loaded = runtime::Load(path, impl_->options, progress);
  if (!loaded.ok()) return runtime::FromAbsl(loaded.status());
  impl_->model = std::move(*loaded);
  impl_->one_shot.reset();
  SetTemperature(impl_->temperature);
  return Status();
}

Status MoERuntime::LoadMmproj(const std::string& path) {
  if (impl_->model == nullptr) {
    return Status(StatusCode::kFailedPrecondition,
                  "no model is loaded: call LoadModel before LoadMmproj");
  }
  auto vision = runtime::VisionProjector::Load(
      path, static_cast<int64_t>(impl_->model->model->spec().n_embd), impl_->options.threads);
  if (!vision.ok()) return runtime::FromAbsl(vision.status());
  std::shared_ptr<runtime::VisionProjector> projector = std::move(*vision);
  std::lock_guard<std::mutex> lock(impl_->model->forward_mutex);
  ModelInfo& info = impl_->model->info;
  info.mmproj_path = path;
  info.minicpmv_version = projector->hparams().minicpmv_version;
  info.image_tokens_per_slice = projector->hparams().n_query;
  impl_->model->vision = std::move(projector);
  return Status();
}

void MoERuntime::SetTemperature(float celsius) {
  impl_->temperature = celsius;
  if (impl_->model == nullptr) return;
  // The monitor's temperature is atomic: no need to wait for a running Forward.
  router::ResourceMonitor* monitor = impl_->model->model->resource_monitor();
  if (monitor == nullptr) return;
  monitor->SetTemperature(std::isnan(celsius) ? std::nullopt : std::optional<float>(celsius));
}

bool MoERuntime::model_loaded() const { return impl_->model != nullptr; }

ModelInfo MoERuntime::model_info() const {
  if (impl_->model == nullptr) return ModelInfo();
  std::lock_guard<std::mutex> lock(impl_->model->forward_mutex);
  return impl_->model->info;
}

const RuntimeOptions& MoERuntime::options() const { return impl_->options; }

namespace {

Status NewSession(const std::shared_ptr<runtime::LoadedModel>& model, bool stateless,
                  std::unique_ptr<Session::Impl>* impl) {
  if (model == nullptr) {
    return Status(StatusCode::kFailedPrecondition, "no model is loaded: call LoadModel first");
  }
  auto cache = model->model->NewKvCache(model->context_length);
  if (!cache.ok()) return runtime::FromAbsl(cache.status());
  *impl = std::make_unique<Session::Impl>(model, std::move(*cache), stateless);
  return Status();
}

}  // namespace

Status MoERuntime::CreateSession(std::unique_ptr<Session>* session) {
  if (session == nullptr) {
    return Status(StatusCode::kInvalidArgument, "CreateSession: session is null");
  }
  std::unique_ptr<Session::Impl> impl;
  Status status = NewSession(impl_->model, /*stateless=*/false, &impl);
  if (!status.ok()) return status;
  session->reset(new Session(std::move(impl)));
  return Status();
}

Status MoERuntime::Generate(const GenerateRequest& request, const TokenCallback& on_token,
                            GenerateResult* result) {
  if (impl_->one_shot == nullptr) {
    std::unique_ptr<Session::Impl> impl;
    Status status = NewSession(impl_->model, /*stateless=*/true, &impl);
    if (!status.ok()) return status;
    impl_->one_shot.reset(new Session(std::move(impl)));
  }
  return impl_->one_shot->Generate(request, on_token, result);
}

GenerationStats MoERuntime::Stats() const {
  return impl_->one_shot != nullptr ? impl_->one_shot->Stats() : GenerationStats();
}

}  // namespace moert
