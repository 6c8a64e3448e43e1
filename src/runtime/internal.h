// What the runtime's files share: a loaded model with its tokenizer and chat
// template, the Session implementation, and the bridge from absl::Status to the
// public moert::Status.
#ifndef MOERT_RUNTIME_INTERNAL_H_
#define MOERT_RUNTIME_INTERNAL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/strings.h"
#include "model/chat_template.h"
#include "model/model.h"
#include "moert/runtime.h"
#include "pipeline/degrade_policy.h"
#include "runtime/degrade_actions.h"
#include "runtime/inference_guard.h"
#include "runtime/repro.h"
#include "runtime/vision.h"
#include "telemetry/platform.h"
#include "telemetry/runtime_metrics.h"
#include "tokenizer/tokenizer.h"
#include "vision/image_embedding.h"

namespace moert::runtime {

// The public Status for an absl::Status (codes the API has no name for become
// kInternal, keeping the message).
Status FromAbsl(const absl::Status& status);

// The bytes a model is loaded from: a file, or a range of one (an APK asset).
struct ModelSource {
  std::string path;
  uint64_t offset = 0;
  std::optional<uint64_t> length;  // nullopt: the whole file
};

// The file and range of MoERuntime::LoadModelFromFd's arguments (length 0: to the end).
absl::StatusOr<ModelSource> SourceOfFd(int fd, int64_t offset, int64_t length);

// A model ready to generate with. Shared by the runtime and its sessions, so a
// session outlives a reload or the runtime itself.
struct LoadedModel {
  LoadedModel(std::unique_ptr<model::Model> m, tokenizer::Tokenizer t,
              std::shared_ptr<telemetry::Registry> r)
      : model(std::move(m)), tokenizer(std::move(t)), metrics(std::move(r)) {}
  // Unloading saves the hot set (a no-op without an expert pool or with hot_set off).
  ~LoadedModel() {
    if (model != nullptr) SaveHotSetOrLog();
  }
  // Writes the hot set where nobody can take the error back (a session's end, an
  // unload): a failure goes to the log.
  void SaveHotSetOrLog() {
    const absl::Status status = model->SaveHotSet();
    if (!status.ok()) {
      telemetry::Log(telemetry::LogLevel::kWarning,
                     StrCat("the hot set was not saved: ", status.message()));
    }
  }
  LoadedModel(const LoadedModel&) = delete;
  LoadedModel& operator=(const LoadedModel&) = delete;

  // Replaced by MoERuntime::ApplyUpdate under forward_mutex (sessions still on the old
  // weights hold them: Session::Impl::weights_).
  std::shared_ptr<model::Model> model;
  // The weights now, for readers that do not hold forward_mutex (the swap holds both).
  std::shared_ptr<model::Model> Weights() const {
    std::lock_guard<std::mutex> lock(weights_mutex);
    return model;
  }
  mutable std::mutex weights_mutex;
  tokenizer::Tokenizer tokenizer;
  // The runtime's registry, which the model and its sessions publish to (never null).
  std::shared_ptr<telemetry::Registry> metrics;
  model::ChatTemplateKind chat_template = model::ChatTemplateKind::kPlain;
  int context_length = 0;
  ModelInfo info;
  // Model::Forward keeps scratch state: sessions on different threads take turns.
  std::mutex forward_mutex;
  // The vision projector (MoERuntime::LoadMmproj); null: text only. Read and replaced
  // under forward_mutex.
  std::shared_ptr<VisionProjector> vision;
  // The sessions on this model, for TrimMemory (each registers itself).
  std::mutex sessions_mutex;
  std::vector<Session::Impl*> sessions;
  // Degrading instead of failing (RuntimeOptions::inference_guard, degrade_policy): each
  // session keeps its own policy state with these options; degrade_rules false: the
  // options' rules are not evaluated (the guard's retry orders and latch still hold).
  bool inference_guard = true;
  bool degrade_rules = false;
  pipeline::DegradePolicyOptions degrade;
  // The lasting degrades sessions applied to the model (ModelActuator); under
  // forward_mutex.
  std::vector<std::string> degrades_in_force;
  // Repro bundles: the options and model figures they record, where they go.
  ReproSettings repro;

  // Expert hot updates: the options the model was loaded with (the new weights load
  // with them too), one update at a time, and how many were applied.
  ModelSource source;
  RuntimeOptions options;
  std::mutex update_mutex;
  // Written under forward_mutex; sessions compare it with the count their context was
  // evaluated at (an update in place keeps `model`).
  std::atomic<uint64_t> updates{0};
};

// MoERuntime::TrimMemory's work on one model: caps the expert pool (applied now when no
// step runs, else at the next), evicts unused experts, and at the strongest level frees
// the KV caches of sessions not generating.
void Trim(LoadedModel& model, int level);

// An encoded image a conversation holds (shared by every position that reads it).
using EncodedImage = std::shared_ptr<const vision::ImageEmbedding>;

// What an embedding position of the context holds: row `row` of an encoded image.
struct EmbeddingRow {
  EncodedImage image;
  int row = 0;
  bool operator==(const EmbeddingRow& o) const { return image == o.image && row == o.row; }
};

// A decoded image waiting to be encoded, with its pixels' digest.
struct DecodedImage {
  vision::RgbImage pixels;
  uint64_t digest = 0;
};

// The library's names for the public enums.
experts::IoMode ToExpertsIoMode(IoMode mode);
model::Backend ToModelBackend(Backend backend);

// Loads the model at `path` (MoERuntime::LoadModel's work; progress may be empty).
absl::StatusOr<std::shared_ptr<LoadedModel>> Load(const ModelSource& source,
                                                  const RuntimeOptions& options,
                                                  const ProgressCallback& progress,
                                                  std::shared_ptr<telemetry::Registry> metrics);

// MoERuntime::ApplyUpdate's work on `model` (runtime/update.cc).
absl::Status ApplyUpdate(LoadedModel& model, const std::string& package_path,
                         const std::string& public_key_hex,
                         const std::shared_ptr<telemetry::Registry>& metrics);

// "chatml", "llama2", "llama3", "plain".
const char* ChatTemplateName(model::ChatTemplateKind kind);

// The process's peak resident set size in bytes (getrusage), 0 where unknown.
int64_t PeakRssBytes();

}  // namespace moert::runtime

// Session is exported from the shared library, and a nested class would be too:
// keep the implementation's symbols out of the library's interface.
#if defined(__GNUC__) && !defined(_WIN32)
#define MOERT_RUNTIME_HIDDEN __attribute__((visibility("hidden")))
#else
#define MOERT_RUNTIME_HIDDEN
#endif

namespace moert {

class MOERT_RUNTIME_HIDDEN Session::Impl {
 public:
  // `stateless`: every Generate starts a fresh conversation (the runtime's one-shot
  // Generate); the KV cache is still reused for a shared prefix.
  // `weights`: the model `cache` was made by (model->model when it was made).
  Impl(std::shared_ptr<runtime::LoadedModel> model, std::shared_ptr<model::Model> weights,
       std::unique_ptr<model::KvCache> cache, bool stateless);
  // A session's end saves the model's hot set (see RuntimeOptions::hot_set).
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  Status AddMessage(std::string role, std::string content);
  Status AddImage(const Image& image);
  Status Generate(const GenerateRequest& request, const TokenCallback& on_token,
                  GenerateResult* result);
  void Reset();
  // Frees the KV cache's memory when no Generate or Reset runs (TrimMemory); the next
  // request evaluates the context again. Any thread.
  bool ReleaseIfIdle();

  const std::vector<Message>& history() const { return history_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int context_length() const { return cache_->capacity(); }
  const GenerationStats& stats() const { return stats_; }
  // Session::WriteRepro.
  Status WriteRepro(const std::string& path, std::string* written);

 private:
  struct Prompt;  // the context a request asks for (session.cc)

  absl::Status BuildPrompt(const GenerateRequest& request, Prompt* prompt);
  absl::Status FitPrompt(const GenerateRequest& request, Prompt* prompt) const;
  // The token ids (kEmbeddingToken at image positions, their rows appended to *rows)
  // of a chat history rendered with `kind`; images[i] are message i's.
  absl::Status RenderChat(model::ChatTemplateKind kind, const std::vector<Message>& history,
                          const std::vector<std::vector<runtime::EncodedImage>>& images,
                          std::vector<int32_t>* tokens,
                          std::vector<runtime::EmbeddingRow>* rows) const;
  // Decoded images encoded for the request (the session's cache first).
  absl::StatusOr<std::vector<runtime::EncodedImage>> EncodeImages(
      const GenerateRequest& request, std::vector<runtime::DecodedImage> images);
  // How many of `target`'s first positions the cache holds and Prefill keeps (never
  // all: the last is evaluated for its logits). `rows`: target's embedding rows.
  size_t CachedPrefix(const std::vector<int32_t>& target,
                      const std::vector<runtime::EmbeddingRow>& rows) const;
  // Brings the KV cache to `target` (reusing the common prefix), leaving the last
  // token's logits in logits_.
  absl::Status Prefill(const std::vector<int32_t>& target,
                       const std::vector<runtime::EmbeddingRow>& rows);
  // Drops the oldest half of the context (keeping BOS) and re-prefills the rest.
  absl::Status Slide();
  // Runs positions; `rows` are the embedding rows of their kEmbeddingToken positions.
  absl::Status Forward(std::span<const int32_t> tokens,
                       std::span<const runtime::EmbeddingRow> rows = {});
  // forward_mutex held: when an update swapped the model's weights since this session's
  // last step, evaluates the cached context again on the new weights into a new KV cache
  // and moves onto them (their old ones are freed with the last session holding them).
  absl::Status FollowWeights();
  // The context the session keeps: the cache's capacity, or less after shorter_context.
  int Capacity() const;
  // The degrade policy's shorter_context: halves Capacity() (not below kMinContext);
  // longer (its undo): doubles it again, up to the cache's capacity.
  absl::Status ShortenContext(bool longer);
  // After a step of `tokens` tokens: the degrade policy's rules, once.
  void DegradeStep(int64_t tokens);
  absl::Status RunGeneration(const GenerateRequest& request, const TokenCallback& on_token,
                             GenerateResult* result);
  // The model's memory figures, read between other sessions' steps.
  model::MemoryStats MemoryStats() const;

  std::shared_ptr<runtime::LoadedModel> model_;
  // The weights cache_ belongs to: model_->model, or older ones until the next step.
  std::shared_ptr<model::Model> weights_;
  // model_->updates when cache_'s context was last evaluated: an update in place (the
  // same weights_ with new experts) shows only there.
  uint64_t weights_updates_ = 0;
  std::unique_ptr<model::KvCache> cache_;
  // Held while Generate or Reset use the cache (ReleaseIfIdle keeps off it then).
  std::mutex busy_;
  const bool stateless_;
  std::vector<Message> history_;
  // The conversation's tokens; the first cache_->size() of them are in the cache.
  // kEmbeddingToken at image positions, whose rows are rows_, in order.
  std::vector<int32_t> tokens_;
  std::vector<runtime::EmbeddingRow> rows_;
  // Per history_ message, its encoded images.
  std::vector<std::vector<runtime::EncodedImage>> history_images_;
  // Images AddImage decoded for the next request.
  std::vector<runtime::DecodedImage> pending_images_;
  // The last images encoded (digest and pruning options -> embedding), so a repeated
  // image is encoded once and its positions stay in the KV cache.
  struct CachedImage {
    uint64_t digest = 0;
    float keep_ratio = 1;
    int min_keep = 1;
    runtime::EncodedImage image;
  };
  std::vector<CachedImage> image_cache_;
  // The request's share of image positions (the routing lambda's; 0 for text).
  float image_share_ = 0;
  // The running request's cancel flag (checked between prefill chunks); null outside.
  const std::atomic<bool>* cancel_ = nullptr;
  std::vector<float> logits_;
  GenerationStats stats_;
  int64_t evaluated_tokens_ = 0;  // tokens run through the model by this Generate

  // Degrading (docs/degrade.md): the session's policy state, what it acts through, the
  // guard (null when off), the steps run so far, and this Generate's degrades.
  static constexpr int kMinContext = 32;
  int context_limit_ = 0;  // 0: the cache's capacity
  pipeline::DegradePolicy policy_;
  runtime::ModelActuator actuator_;
  runtime::ModelMetrics degrade_metrics_;
  std::unique_ptr<runtime::InferenceGuard> guard_;
  int64_t step_ = 0;
  std::vector<std::string> degrades_;
  telemetry::GenerationMetrics metrics_;

  // Repro bundles (runtime/repro.h): the router logits of this request's first decoded
  // token (first_decode_seen_: taken), and the bundle of `trigger` written to `path`
  // (empty: a new file under the repro directory).
  bool first_decode_seen_ = false;
  std::vector<std::vector<float>> first_decode_router_logits_;
  absl::StatusOr<std::string> WriteReproBundle(const std::string& trigger, const std::string& error,
                                               const std::string& path);
};

}  // namespace moert

#endif  // MOERT_RUNTIME_INTERNAL_H_
