// Session: a conversation's history and KV cache, and the generation loop
// (prefill of the new tokens, sampling, streaming with stop strings, context policy).
//
// The KV cache always holds a prefix of tokens_. A request turns into the token
// sequence the context should hold (the prompt); what it shares with the cache is
// kept and only the rest is prefilled. A raw prompt extends tokens_, so only its
// own tokens are new; a chat request re-renders the whole history with the
// template, and the common prefix with the cache is what earlier turns left there.
#include <algorithm>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/strings.h"
#include "model/chat_template.h"
#include "model/sampler.h"
#include "model/stop.h"
#include "moert/runtime.h"
#include "runtime/internal.h"
#include "telemetry/crash_repro.h"
#include "telemetry/platform.h"
#include "telemetry/runtime_metrics.h"
#include "tokenizer/tokenizer.h"
#include "vision/prompt.h"

namespace moert {
namespace {

using telemetry::NowNs;

double MillisSince(uint64_t start_ns) { return static_cast<double>(NowNs() - start_ns) / 1e6; }

absl::Status CheckRole(const std::string& role) {
  if (role == "system" || role == "user" || role == "assistant") return absl::OkStatus();
  return absl::InvalidArgumentError(
      StrCat("unknown message role \"", role, "\" (expected system, user or assistant)"));
}

std::vector<model::ChatMessage> ToChatMessages(const std::vector<Message>& messages) {
  std::vector<model::ChatMessage> out;
  out.reserve(messages.size());
  for (const Message& m : messages) out.push_back({m.role, m.content});
  return out;
}

}  // namespace

struct Session::Impl::Prompt {
  bool chat = false;
  model::ChatTemplateKind chat_template = model::ChatTemplateKind::kPlain;
  std::vector<Message> history;  // chat: the history the prompt renders
  std::vector<std::vector<runtime::EncodedImage>> history_images;  // per history message
  std::vector<int32_t> tokens;   // everything the context should hold
  std::vector<runtime::EmbeddingRow> rows;  // the rows of its kEmbeddingToken positions
};

namespace {

// Marks where a message's images go in the rendered chat text: characters no
// template writes and no user types (the image's pieces replace it).
constexpr char kImageMark[] = "\x1e\x1fmoert-image\x1f\x1e";

size_t CountEmbeddingPositions(std::span<const int32_t> tokens) {
  return static_cast<size_t>(std::count(tokens.begin(), tokens.end(), model::kEmbeddingToken));
}

// An image's pixels and digest; an error's message starts with `what`.
absl::StatusOr<runtime::DecodedImage> Decode(const Image& image, const std::string& what) {
  absl::StatusOr<vision::RgbImage> pixels = runtime::DecodePublicImage(image);
  if (!pixels.ok()) {
    return absl::Status(pixels.status().code(), StrCat(what, pixels.status().message()));
  }
  const uint64_t digest = runtime::PixelDigest(*pixels);
  return runtime::DecodedImage{std::move(*pixels), digest};
}

static_assert(model::kEmbeddingToken == -1, "vision::PromptPositions writes -1 at image positions");

// The vision projector's pieces -> ids and rows.
void AppendPieces(const tokenizer::Tokenizer& tokenizer,
                  const std::vector<vision::PromptPiece>& pieces,
                  const std::vector<runtime::EncodedImage>& images, std::vector<int32_t>* tokens,
                  std::vector<runtime::EmbeddingRow>* rows) {
  std::vector<const vision::ImageEmbedding*> views;
  for (const runtime::EncodedImage& image : images) views.push_back(image.get());
  vision::PromptPositions positions;
  vision::AppendPromptPositions(tokenizer, pieces, views, &positions);
  tokens->insert(tokens->end(), positions.ids.begin(), positions.ids.end());
  for (const vision::PromptPositions::Row& r : positions.rows) {
    rows->push_back({images[static_cast<size_t>(r.image)], r.row});
  }
}

}  // namespace

Status Session::Impl::AddMessage(std::string role, std::string content) {
  absl::Status status = CheckRole(role);
  if (!status.ok()) return runtime::FromAbsl(status);
  history_.push_back({std::move(role), std::move(content), {}});
  history_images_.emplace_back();
  return Status();
}

Status Session::Impl::AddImage(const Image& image) {
  {
    std::lock_guard<std::mutex> lock(model_->forward_mutex);
    if (model_->vision == nullptr) {
      return Status(StatusCode::kFailedPrecondition,
                    "the model has no vision projector: load one first (MoERuntime::LoadMmproj, "
                    "--mmproj)");
    }
  }
  absl::StatusOr<runtime::DecodedImage> decoded = Decode(image, "");
  if (!decoded.ok()) return runtime::FromAbsl(decoded.status());
  pending_images_.push_back(std::move(*decoded));
  return Status();
}

void Session::Impl::Reset() {
  std::lock_guard<std::mutex> busy(busy_);
  history_.clear();
  history_images_.clear();
  tokens_.clear();
  rows_.clear();
  pending_images_.clear();
  cache_->Truncate(0);
  stats_ = GenerationStats();
}

absl::StatusOr<std::vector<runtime::EncodedImage>> Session::Impl::EncodeImages(
    const GenerateRequest& request, std::vector<runtime::DecodedImage> images) {
  std::vector<runtime::EncodedImage> out;
  if (images.empty()) return out;
  std::shared_ptr<runtime::VisionProjector> vision;
  {
    std::lock_guard<std::mutex> lock(model_->forward_mutex);
    vision = model_->vision;
  }
  if (vision == nullptr) {
    return absl::FailedPreconditionError(
        "the request has an image but the model has no vision projector: load one first "
        "(MoERuntime::LoadMmproj, --mmproj)");
  }
  vision::EmbedOptions options;
  options.keep_ratio = request.image_keep_ratio;
  options.min_keep = request.image_min_keep;
  MOERT_RETURN_IF_ERROR(vision::ValidateEmbedOptions(options));
  for (runtime::DecodedImage& image : images) {
    auto cached = std::find_if(image_cache_.begin(), image_cache_.end(), [&](const CachedImage& c) {
      return c.digest == image.digest && c.keep_ratio == options.keep_ratio &&
             c.min_keep == options.min_keep;
    });
    if (cached != image_cache_.end()) {
      out.push_back(cached->image);
      continue;
    }
    MOERT_ASSIGN_OR_RETURN(vision::ImageEmbedding embedding, vision->Embed(image.pixels, options));
    ++stats_.images;
    stats_.image_slices += embedding.layout.n_slices;
    stats_.image_encode_ms += embedding.encode_ms;
    auto encoded = std::make_shared<const vision::ImageEmbedding>(std::move(embedding));
    constexpr size_t kCachedImages = 4;
    if (image_cache_.size() == kCachedImages) image_cache_.erase(image_cache_.begin());
    image_cache_.push_back({image.digest, options.keep_ratio, options.min_keep, encoded});
    out.push_back(std::move(encoded));
  }
  return out;
}

absl::Status Session::Impl::RenderChat(
    model::ChatTemplateKind kind, const std::vector<Message>& history,
    const std::vector<std::vector<runtime::EncodedImage>>& images, std::vector<int32_t>* tokens,
    std::vector<runtime::EmbeddingRow>* rows) const {
  const tokenizer::Tokenizer& tokenizer = model_->tokenizer;
  std::vector<model::ChatMessage> messages = ToChatMessages(history);
  std::vector<runtime::EncodedImage> order;  // the images in the order of their marks
  for (size_t i = 0; i < messages.size(); ++i) {
    std::string marks;
    for (const runtime::EncodedImage& image : images[i]) {
      marks += kImageMark;
      order.push_back(image);
    }
    messages[i].content = marks + messages[i].content;
  }
  MOERT_ASSIGN_OR_RETURN(std::string text, model::ApplyChatTemplate(kind, messages));
  tokens->clear();
  rows->clear();
  if (order.empty()) {
    *tokens = tokenizer.Encode(text, /*add_special=*/true, /*parse_special=*/true);
    return absl::OkStatus();
  }
  // The text between marks is tokenized piece by piece (BOS only before the first),
  // each image as minicpmv-cli lays it out.
  const std::string_view mark = kImageMark;
  size_t start = 0;
  for (size_t i = 0; i <= order.size(); ++i) {
    const size_t at = i < order.size() ? text.find(mark, start) : text.size();
    if (at == std::string::npos) {
      return absl::InternalError("the chat template dropped an image's place in the prompt");
    }
    const std::vector<int32_t> ids = tokenizer.Encode(
        std::string_view(text).substr(start, at - start), /*add_special=*/i == 0, true);
    tokens->insert(tokens->end(), ids.begin(), ids.end());
    if (i == order.size()) break;
    std::vector<vision::PromptPiece> pieces;
    vision::AppendImagePieces(0, order[i]->layout.n_slices, order[i]->layout.columns, "",
                              &pieces);
    AppendPieces(tokenizer, pieces, {order[i]}, tokens, rows);
    start = at + mark.size();
  }
  return absl::OkStatus();
}

absl::Status Session::Impl::BuildPrompt(const GenerateRequest& request, Prompt* prompt) {
  const tokenizer::Tokenizer& tokenizer = model_->tokenizer;
  prompt->chat_template = model_->chat_template;
  if (!request.chat_template.empty()) {
    MOERT_ASSIGN_OR_RETURN(prompt->chat_template,
                           model::ChatTemplateFromName(request.chat_template));
  }
  if (!request.prompt.empty() && !request.messages.empty()) {
    return absl::InvalidArgumentError("a request has either a prompt or messages, not both");
  }
  for (const Message& m : request.messages) MOERT_RETURN_IF_ERROR(CheckRole(m.role));
  // Every image of the request decoded (the session's pending ones first), then encoded.
  std::vector<runtime::DecodedImage> decoded = pending_images_;
  for (size_t i = 0; i < request.images.size(); ++i) {
    MOERT_ASSIGN_OR_RETURN(runtime::DecodedImage image,
                           Decode(request.images[i], StrCat("image ", i, ": ")));
    decoded.push_back(std::move(image));
  }
  const size_t request_images = decoded.size();
  std::vector<size_t> message_images;  // request.messages[i]'s own images
  for (const Message& m : request.messages) {
    message_images.push_back(m.images.size());
    for (size_t i = 0; i < m.images.size(); ++i) {
      MOERT_ASSIGN_OR_RETURN(runtime::DecodedImage image,
                             Decode(m.images[i], StrCat(m.role, " message image ", i, ": ")));
      decoded.push_back(std::move(image));
    }
  }
  const bool has_images = !decoded.empty();
  if (request.messages.empty() && request.prompt.empty() && has_images) {
    return absl::InvalidArgumentError("a request with images needs a prompt or messages");
  }
  MOERT_ASSIGN_OR_RETURN(std::vector<runtime::EncodedImage> encoded,
                         EncodeImages(request, std::move(decoded)));

  if (!request.messages.empty()) {
    prompt->chat = true;
    if (!stateless_) {
      prompt->history = history_;
      prompt->history_images = history_images_;
    }
    // The request's (and AddImage's) images join the last user message's.
    size_t last_user = request.messages.size();
    for (size_t i = 0; i < request.messages.size(); ++i) {
      if (request.messages[i].role == "user") last_user = i;
    }
    if (request_images > 0 && last_user == request.messages.size()) {
      return absl::InvalidArgumentError("the request's images need a user message to go with");
    }
    size_t next = request_images;
    for (size_t i = 0; i < request.messages.size(); ++i) {
      const Message& m = request.messages[i];
      std::vector<runtime::EncodedImage> images;
      for (size_t j = 0; i == last_user && j < request_images; ++j) images.push_back(encoded[j]);
      for (size_t j = 0; j < message_images[i]; ++j) images.push_back(encoded[next + j]);
      next += message_images[i];
      if (!images.empty() && m.role != "user") {
        return absl::InvalidArgumentError(
            StrCat("only user messages take images (a ", m.role, " message has one)"));
      }
      prompt->history.push_back(m);
      prompt->history_images.push_back(std::move(images));
    }
    MOERT_RETURN_IF_ERROR(RenderChat(prompt->chat_template, prompt->history,
                                     prompt->history_images, &prompt->tokens, &prompt->rows));
  } else if (has_images) {
    // minicpmv-cli's user turn, continuing what the session holds (no BOS).
    if (!stateless_) {
      prompt->tokens = tokens_;
      prompt->rows = rows_;
    }
    std::vector<vision::ImageLayout> layouts;
    for (const runtime::EncodedImage& image : encoded) layouts.push_back(image->layout);
    int version = 0;
    {
      std::lock_guard<std::mutex> lock(model_->forward_mutex);
      if (model_->vision != nullptr) version = model_->vision->hparams().minicpmv_version;
    }
    MOERT_ASSIGN_OR_RETURN(std::vector<vision::PromptPiece> pieces,
                           vision::MinicpmvUserTurn(version, layouts, request.prompt));
    AppendPieces(tokenizer, pieces, encoded, &prompt->tokens, &prompt->rows);
  } else {
    // Raw text continues what the session holds; BOS only at the very start.
    if (!stateless_) {
      prompt->tokens = tokens_;
      prompt->rows = rows_;
    }
    const bool first = prompt->tokens.empty();
    const std::vector<int32_t> added =
        tokenizer.Encode(request.prompt, /*add_special=*/first, /*parse_special=*/true);
    prompt->tokens.insert(prompt->tokens.end(), added.begin(), added.end());
  }
  if (prompt->tokens.empty()) {
    return absl::InvalidArgumentError("empty prompt: there is nothing to generate from");
  }
  return absl::OkStatus();
}

absl::Status Session::Impl::FitPrompt(const GenerateRequest& request, Prompt* prompt) const {
  const int n_ctx = Capacity();
  const auto size = [&] { return static_cast<int>(prompt->tokens.size()); };
  // A context shortened by the degrade policy slides whatever the request asked.
  if (request.context_policy == ContextPolicy::kError && context_limit_ == 0) {
    if (size() <= n_ctx) return absl::OkStatus();
    return absl::OutOfRangeError(StrCat("the prompt is ", size(), " tokens but the context holds ",
                                        n_ctx,
                                        (stateless_ || (tokens_.empty() && history_.empty()))
                                            ? " (raise context_length, shorten the prompt"
                                            : " (Reset the session, raise context_length",
                                        " or use ContextPolicy::kSlide)"));
  }

  // Sliding: leave room for the answer too, so it does not have to slide again at once.
  const int reserve =
      std::max(1, request.max_tokens > 0 ? std::min(request.max_tokens, n_ctx / 2) : n_ctx / 4);
  const int budget = std::max(1, n_ctx - reserve);
  if (size() <= budget) return absl::OkStatus();

  if (prompt->chat) {
    // Drop the oldest turns (a user message and what follows it up to the next user
    // message), keeping a leading system message and the newest message.
    std::vector<Message>& history = prompt->history;
    auto& images = prompt->history_images;
    const size_t first = (!history.empty() && history[0].role == "system") ? 1 : 0;
    const auto drop = [&] {
      history.erase(history.begin() + static_cast<std::ptrdiff_t>(first));
      images.erase(images.begin() + static_cast<std::ptrdiff_t>(first));
    };
    while (size() > budget && history.size() > first + 1) {
      drop();
      while (history.size() > first + 1 && history[first].role != "user") drop();
      MOERT_RETURN_IF_ERROR(
          RenderChat(prompt->chat_template, history, images, &prompt->tokens, &prompt->rows));
    }
    if (size() <= budget) return absl::OkStatus();
  }
  // Keep BOS and the tail.
  const tokenizer::TokenId bos = model_->tokenizer.vocab().bos();
  const int head = (bos != tokenizer::kNoToken && prompt->tokens[0] == bos) ? 1 : 0;
  const size_t tail_start = prompt->tokens.size() - static_cast<size_t>(budget - head);
  std::vector<int32_t> kept(prompt->tokens.begin(), prompt->tokens.begin() + head);
  kept.insert(kept.end(), prompt->tokens.begin() + static_cast<std::ptrdiff_t>(tail_start),
              prompt->tokens.end());
  const size_t dropped_rows = CountEmbeddingPositions(
      std::span<const int32_t>(prompt->tokens).subspan(0, tail_start));
  prompt->rows.erase(prompt->rows.begin(),
                     prompt->rows.begin() + static_cast<std::ptrdiff_t>(dropped_rows));
  prompt->tokens = std::move(kept);
  return absl::OkStatus();
}

namespace {

// The embedding rows of a batch's kEmbeddingToken positions, back to back.
std::vector<float> EmbeddingsOf(std::span<const runtime::EmbeddingRow> rows) {
  std::vector<float> embeddings;
  if (rows.empty()) return embeddings;
  const size_t width = static_cast<size_t>(rows[0].image->width);
  embeddings.reserve(rows.size() * width);
  for (const runtime::EmbeddingRow& r : rows) {
    const float* row = r.image->rows.data() + static_cast<size_t>(r.row) * width;
    embeddings.insert(embeddings.end(), row, row + width);
  }
  return embeddings;
}

}  // namespace

absl::Status Session::Impl::FollowWeights() {
  const uint64_t updates = model_->updates.load();
  const bool same_weights = weights_ == model_->model;
  if (same_weights && weights_updates_ == updates) return absl::OkStatus();
  // The cached context came from the old weights: evaluate it again on the new ones, so
  // that what follows is what the new model gives for this context. Experts replaced in
  // place (the same weights object): into the same cache, from its start; new weights:
  // into a cache of theirs.
  std::unique_ptr<model::KvCache> fresh;
  if (!same_weights) {
    MOERT_ASSIGN_OR_RETURN(fresh, model_->model->NewKvCache(cache_->capacity()));
  }
  model::KvCache* cache = same_weights ? cache_.get() : fresh.get();
  const size_t n = std::min(static_cast<size_t>(cache_->size()), tokens_.size());
  cache->Truncate(0);
  if (n > 0) {
    const std::span<const int32_t> prefix = std::span<const int32_t>(tokens_).subspan(0, n);
    const std::vector<float> embeddings = EmbeddingsOf(
        std::span<const runtime::EmbeddingRow>(rows_).subspan(0, CountEmbeddingPositions(prefix)));
    std::vector<float> logits;
    MOERT_RETURN_IF_ERROR(model_->model->Forward(
        model::ForwardInput{prefix, embeddings, image_share_}, cache, model::LogitsFor::kLast,
        &logits));
    evaluated_tokens_ += static_cast<int64_t>(n);
    stats_.prefill_tokens += static_cast<int>(n);
  }
  weights_updates_ = updates;
  if (same_weights) return absl::OkStatus();
  cache_ = std::move(fresh);  // the old cache goes before the old weights
  weights_ = model_->model;
  actuator_.Rebind(weights_.get());
  degrade_metrics_.Rebind(weights_.get());
  return absl::OkStatus();
}

absl::Status Session::Impl::Forward(std::span<const int32_t> tokens,
                                    std::span<const runtime::EmbeddingRow> rows) {
  model::ForwardInput input;
  input.tokens = tokens;
  input.image_share = image_share_;
  const std::vector<float> embeddings = EmbeddingsOf(rows);
  input.embeddings = embeddings;
  const auto attempt = [&] {
    std::lock_guard<std::mutex> lock(model_->forward_mutex);
    MOERT_RETURN_IF_ERROR(FollowWeights());
    evaluated_tokens_ += static_cast<int64_t>(tokens.size());
    absl::Status status = weights_->Forward(input, cache_.get(), model::LogitsFor::kLast, &logits_);
    if (status.ok() && tokens.size() == 1 && !first_decode_seen_) {
      // The first decoded token's routing, for a repro bundle.
      first_decode_seen_ = true;
      first_decode_router_logits_ = weights_->last_router_logits();
    }
    return status;
  };
  ++step_;
  if (model_->repro.on_crash) {
    // What a crash during this step leaves behind (telemetry/crash_repro.h).
    const runtime::ReproSettings& repro = model_->repro;
    telemetry::PublishCrashRecord(repro.fingerprint, repro.model, repro.options, tokens_);
  }
  MOERT_RETURN_IF_ERROR(guard_ != nullptr ? guard_->Run(step_, attempt, &degrades_) : attempt());
  DegradeStep(static_cast<int64_t>(tokens.size()));
  return absl::OkStatus();
}

int Session::Impl::Capacity() const {
  const int capacity = cache_->capacity();
  return context_limit_ > 0 ? std::min(capacity, context_limit_) : capacity;
}

absl::Status Session::Impl::ShortenContext(bool longer) {
  if (longer) {
    if (context_limit_ == 0) {
      return absl::FailedPreconditionError("shorter_context: the session keeps its whole context");
    }
    context_limit_ *= 2;
    if (context_limit_ >= cache_->capacity()) context_limit_ = 0;
    return absl::OkStatus();
  }
  const int now = Capacity();
  if (now <= kMinContext) {
    return absl::FailedPreconditionError(
        StrCat("shorter_context: the session keeps ", now, " positions, the least it may"));
  }
  context_limit_ = std::max(kMinContext, now / 2);
  return absl::OkStatus();
}

void Session::Impl::DegradeStep(int64_t tokens) {
  if (!model_->degrade_rules || policy_.latched()) return;
  std::vector<pipeline::DegradeEvent> events;
  {
    std::lock_guard<std::mutex> lock(model_->forward_mutex);
    events = policy_.Step(step_, degrade_metrics_.Read(tokens), actuator_);
  }
  for (const pipeline::DegradeEvent& e : events) {
    if (!e.status.ok()) continue;
    if (e.undo) {
      telemetry::CountDegradeRecovery(*model_->metrics, e.reason);
      degrades_.push_back(StrCat(e.reason, ": undid ", pipeline::DegradeActionName(e.action),
                                 " (clear again at step ", e.step, ")"));
      continue;
    }
    telemetry::CountDegradeEvent(*model_->metrics, e.reason);
    degrades_.push_back(StrCat(e.reason, ": ", pipeline::DegradeActionName(e.action), " (", e.value,
                               " against ", e.bound, ")"));
  }
}

Session::Impl::Impl(std::shared_ptr<runtime::LoadedModel> model,
                    std::shared_ptr<model::Model> weights, std::unique_ptr<model::KvCache> cache,
                    bool stateless)
    : model_(std::move(model)),
      weights_(std::move(weights)),
      weights_updates_(model_->updates.load()),
      cache_(std::move(cache)),
      stateless_(stateless),
      policy_(model_->degrade),
      actuator_(
          weights_.get(), [this](bool longer) { return ShortenContext(longer); }, &model_->degrades_in_force),
      degrade_metrics_(weights_.get(), model_->metrics.get()),
      metrics_(*model_->metrics) {
  if (model_->inference_guard) {
    guard_ =
        std::make_unique<runtime::InferenceGuard>(&policy_, &actuator_, &model_->forward_mutex,
                                                  model_->metrics.get());
  }
  std::lock_guard<std::mutex> lock(model_->sessions_mutex);
  model_->sessions.push_back(this);
}

Session::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> lock(model_->sessions_mutex);
    std::erase(model_->sessions, this);
  }
  std::lock_guard<std::mutex> lock(model_->forward_mutex);
  model_->SaveHotSetOrLog();
}

bool Session::Impl::ReleaseIfIdle() {
  std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
  if (!busy.owns_lock()) return false;
  cache_->Release();
  return true;
}

model::MemoryStats Session::Impl::MemoryStats() const {
  std::lock_guard<std::mutex> lock(model_->forward_mutex);
  return model_->model->memory_stats();
}

size_t Session::Impl::CachedPrefix(const std::vector<int32_t>& target,
                                   const std::vector<runtime::EmbeddingRow>& rows) const {
  const size_t in_cache = std::min(static_cast<size_t>(cache_->size()), tokens_.size());
  size_t common = 0;
  size_t row = 0;  // embedding positions passed
  while (common < in_cache && common < target.size() && tokens_[common] == target[common]) {
    if (target[common] == model::kEmbeddingToken) {
      if (!(rows_[row] == rows[row])) break;
      ++row;
    }
    ++common;
  }
  // The last token is evaluated again when everything is cached: its logits are needed.
  if (common > 0 && common == target.size()) --common;
  return common;
}

absl::Status Session::Impl::Prefill(const std::vector<int32_t>& target,
                                    const std::vector<runtime::EmbeddingRow>& rows) {
  const size_t common = CachedPrefix(target, rows);
  cache_->Truncate(static_cast<int>(common));

  const uint64_t start = NowNs();
  const std::span<const int32_t> fresh = std::span(target).subspan(common);
  size_t row = CountEmbeddingPositions(std::span(target).subspan(0, common));
  // In chunks, so that a cancel stops a long prefill between them (the logits are
  // the same: a batch gives its tokens' logits bit for bit, however it is split). The
  // cache then holds a prefix of the target, as it always holds one of tokens_.
  tokens_ = target;
  rows_ = rows;
  constexpr size_t kChunk = 512;
  for (size_t at = 0; at < fresh.size(); at += kChunk) {
    if (cancel_ != nullptr && cancel_->load()) {
      stats_.prefill_ms += MillisSince(start);
      return absl::CancelledError(StrCat("prefill cancelled after ", at, " of ", fresh.size(),
                                         " tokens"));
    }
    const std::span<const int32_t> chunk = fresh.subspan(at, std::min(kChunk, fresh.size() - at));
    const size_t chunk_rows = CountEmbeddingPositions(chunk);
    const uint64_t chunk_start = NowNs();
    MOERT_RETURN_IF_ERROR(Forward(chunk, std::span(rows).subspan(row, chunk_rows)));
    metrics_.prefill_ns.Increment(NowNs() - chunk_start);
    metrics_.prefill_tokens.Increment(chunk.size());
    row += chunk_rows;
    stats_.prefill_tokens += static_cast<int>(chunk.size());
  }
  stats_.prefill_ms += MillisSince(start);
  return absl::OkStatus();
}

absl::Status Session::Impl::Slide() {
  const tokenizer::TokenId bos = model_->tokenizer.vocab().bos();
  const size_t capacity = static_cast<size_t>(Capacity());
  const size_t head =
      (capacity >= 4 && bos != tokenizer::kNoToken && !tokens_.empty() && tokens_[0] == bos);
  const size_t tail = std::max<size_t>(1, capacity / 2);
  if (tokens_.size() <= head + tail) return absl::InternalError("nothing to slide");
  std::vector<int32_t> kept(tokens_.begin(), tokens_.begin() + static_cast<std::ptrdiff_t>(head));
  kept.insert(kept.end(), tokens_.end() - static_cast<std::ptrdiff_t>(tail), tokens_.end());
  // The rows of the embedding positions that stay (head is BOS, never an image's).
  const size_t dropped = CountEmbeddingPositions(
      std::span<const int32_t>(tokens_).subspan(0, tokens_.size() - tail));
  std::vector<runtime::EmbeddingRow> rows(rows_.begin() + static_cast<std::ptrdiff_t>(dropped),
                                          rows_.end());
  ++stats_.context_slides;
  return Prefill(kept, rows);
}

absl::Status Session::Impl::RunGeneration(const GenerateRequest& request,
                                          const TokenCallback& on_token, GenerateResult* result) {
  const uint64_t start = NowNs();
  cancel_ = request.cancel;

  // Everything that can be wrong with the request is found before the session changes.
  model::SamplerOptions sampler_options;
  sampler_options.temperature = request.temperature;
  sampler_options.top_k = request.top_k;
  sampler_options.top_p = request.top_p;
  sampler_options.min_p = request.min_p;
  sampler_options.repeat_penalty = request.repeat_penalty;
  sampler_options.repeat_last_n = request.repeat_last_n;
  sampler_options.seed = request.seed;
  MOERT_RETURN_IF_ERROR(model::ValidateSamplerOptions(sampler_options));
  MOERT_ASSIGN_OR_RETURN(model::Sampler sampler, model::Sampler::Create(sampler_options));
  for (size_t i = 0; i < request.stop.size(); ++i) {
    if (request.stop[i].empty()) {
      return absl::InvalidArgumentError(StrCat("stop string ", i, " is empty"));
    }
  }
  Prompt prompt;
  MOERT_RETURN_IF_ERROR(BuildPrompt(request, &prompt));
  MOERT_RETURN_IF_ERROR(FitPrompt(request, &prompt));

  stats_.prompt_tokens = static_cast<int>(prompt.tokens.size());
  stats_.cached_tokens = static_cast<int>(CachedPrefix(prompt.tokens, prompt.rows));
  stats_.image_tokens = static_cast<int>(prompt.rows.size());
  // The routing lambda's share (docs/routing.md): image positions over all of them.
  image_share_ = static_cast<float>(static_cast<double>(prompt.rows.size()) /
                                    static_cast<double>(prompt.tokens.size()));
  stats_.image_share = image_share_;
  MOERT_RETURN_IF_ERROR(Prefill(prompt.tokens, prompt.rows));
  pending_images_.clear();
  if (prompt.chat) {
    history_ = std::move(prompt.history);
    history_images_ = std::move(prompt.history_images);
  } else if (stateless_) {
    history_.clear();
    history_images_.clear();
  }

  const tokenizer::Tokenizer& tokenizer = model_->tokenizer;
  std::vector<std::string> stop_strings = request.stop;
  // The plain template has no end-of-turn token: the next turn's opener ends a reply.
  if (prompt.chat && prompt.chat_template == model::ChatTemplateKind::kPlain) {
    stop_strings.push_back("\nuser:");
  }
  model::StopMatcher stops(std::move(stop_strings));
  tokenizer::StreamDecoder decoder(tokenizer);
  auto emit = [&](const std::string& text, int32_t token) {
    result->text += text;
    return on_token ? on_token(text, token) : true;
  };
  const auto cancelled = [&] { return request.cancel != nullptr && request.cancel->load(); };
  const auto length_reached = [&] {
    return request.max_tokens >= 0 && static_cast<int>(result->tokens.size()) >= request.max_tokens;
  };

  FinishReason finish = FinishReason::kNone;
  int decode_steps = 0;
  double decode_ms = 0;
  bool sampled_any = false;
  while (true) {
    if (cancelled()) {
      finish = FinishReason::kCancelled;
      break;
    }
    if (length_reached()) {
      finish = FinishReason::kMaxTokens;
      break;
    }
    absl::StatusOr<int32_t> sampled = sampler.TrySample(logits_, tokens_);
    if (!sampled.ok()) {
      return absl::InternalError(StrCat("sampling failed: ", sampled.status().message()));
    }
    const int32_t token = *sampled;
    if (!sampled_any) {
      stats_.time_to_first_token_ms = MillisSince(start);
      metrics_.time_to_first_token.Observe(stats_.time_to_first_token_ms / 1000.0);
      sampled_any = true;
    }
    if (tokenizer.vocab().Contains(token) && tokenizer.vocab().IsEog(token)) {
      finish = FinishReason::kEndOfGeneration;
      break;
    }
    tokens_.push_back(token);
    result->tokens.push_back(token);
    const bool go_on = emit(stops.Push(decoder.Push(token)), token);
    if (stops.stopped()) {
      finish = FinishReason::kStopString;
      break;
    }
    if (!go_on || cancelled()) {
      finish = FinishReason::kCancelled;
      break;
    }
    if (length_reached()) {
      finish = FinishReason::kMaxTokens;
      break;
    }
    if (cache_->size() >= Capacity()) {
      if (request.context_policy != ContextPolicy::kSlide && context_limit_ == 0) {
        finish = FinishReason::kContextFull;
        break;
      }
      MOERT_RETURN_IF_ERROR(Slide());  // evaluates `token` too
      continue;
    }
    const uint64_t step_start = NowNs();
    MOERT_RETURN_IF_ERROR(Forward(std::span<const int32_t>(&token, 1)));
    const uint64_t step_ns = NowNs() - step_start;
    metrics_.decode_ns.Increment(step_ns);
    metrics_.decode_tokens.Increment();
    decode_ms += static_cast<double>(step_ns) / 1e6;
    ++decode_steps;
  }
  if (!stops.stopped()) {
    std::string rest = stops.Push(decoder.Flush());
    rest += stops.Flush();
    if (!rest.empty()) emit(rest, -1);
  }
  result->finish_reason = finish;

  if (prompt.chat) {
    // Stored as the template would render the model's words, so the next turn's
    // prompt matches what the cache holds: the plain template writes "assistant: "
    // where the generation prompt ended at "assistant:".
    std::string reply = result->text;
    if (prompt.chat_template == model::ChatTemplateKind::kPlain && !reply.empty() &&
        reply[0] == ' ') {
      reply.erase(0, 1);
    }
    history_.push_back({"assistant", std::move(reply), {}});
    history_images_.emplace_back();
  }

  stats_.generated_tokens = static_cast<int>(result->tokens.size());
  stats_.decode_ms = decode_ms;
  if (stats_.prefill_ms > 0) {
    stats_.prefill_tokens_per_second = stats_.prefill_tokens / (stats_.prefill_ms / 1000.0);
  }
  if (decode_ms > 0) stats_.decode_tokens_per_second = decode_steps / (decode_ms / 1000.0);
  if (finish == FinishReason::kCancelled) {
    return absl::CancelledError(
        StrCat("generation cancelled after ", result->tokens.size(), " tokens"));
  }
  return absl::OkStatus();
}

Status Session::Impl::Generate(const GenerateRequest& request, const TokenCallback& on_token,
                               GenerateResult* result) {
  std::lock_guard<std::mutex> busy(busy_);
  GenerateResult local;
  GenerateResult* out = result != nullptr ? result : &local;
  *out = GenerateResult();
  stats_ = GenerationStats();
  evaluated_tokens_ = 0;
  degrades_.clear();
  first_decode_seen_ = false;
  first_decode_router_logits_.clear();
  metrics_.requests.Increment();
  const telemetry::Registry& registry = *model_->metrics;
  const auto before = telemetry::GenerationSnapshot::Read(registry);
  const absl::Status status = RunGeneration(request, on_token, out);
  cancel_ = nullptr;
  if (absl::IsCancelled(status)) {
    // Prefetches queued for the steps that will not run now.
    std::lock_guard<std::mutex> lock(model_->forward_mutex);
    model_->model->CancelPendingLoads();
  }
  if (absl::IsCancelled(status) && out->finish_reason == FinishReason::kNone) {
    out->finish_reason = FinishReason::kCancelled;  // during the prefill
  }
  const auto now = telemetry::GenerationSnapshot::Read(registry);
  if (const double n = now.token_layers - before.token_layers; n > 0) {
    stats_.average_experts_per_token = (now.experts_chosen - before.experts_chosen) / n;
    stats_.router_changed_fraction = (now.router_changed - before.router_changed +
                                      now.thermal_drops - before.thermal_drops) /
                                     n;
  }
  stats_.finish_reason = out->finish_reason;
  std::vector<std::string> in_force;
  {
    std::lock_guard<std::mutex> lock(model_->forward_mutex);
    // Once per action, "xN" when applied more than once and not undone.
    for (const std::string& name : model_->degrades_in_force) {
      if (std::find(in_force.begin(), in_force.end(), name) != in_force.end()) continue;
      const auto n = std::count(model_->degrades_in_force.begin(),
                                model_->degrades_in_force.end(), name);
      in_force.push_back(n > 1 ? StrCat(name, " x", n) : name);
    }
  }
  if (context_limit_ > 0) {
    in_force.push_back(StrCat("shorter_context (", context_limit_, " positions)"));
  }
  if (!in_force.empty()) degrades_.push_back(StrCat("in force: ", StrJoin(in_force, ", ")));
  if (policy_.latched()) degrades_.push_back(policy_.latch_reason());
  out->degraded = stats_.degraded = !degrades_.empty();
  out->degrade_reason = stats_.degrade_reason = StrJoin(degrades_, "; ");
  stats_.peak_rss_bytes = runtime::PeakRssBytes();
  const model::MemoryStats after = MemoryStats();
  stats_.budget_bytes = static_cast<int64_t>(after.budget_bytes);
  stats_.kv_cache_bytes = static_cast<int64_t>(cache_->bytes());
  stats_.kv_reserved_bytes = static_cast<int64_t>(after.ledger.kv_bytes);
  stats_.kv_caches = static_cast<int>(after.ledger.kv_caches);
  if (after.expert_pool) {
    const experts::ExpertCacheStats& p = after.pool;
    stats_.expert_pool_bytes = static_cast<int64_t>(p.pool_bytes);
    stats_.expert_pool_used_bytes = static_cast<int64_t>(p.used_bytes);
    stats_.expert_pool_free_bytes = static_cast<int64_t>(p.free_bytes);
    stats_.expert_pool_fragmentation = p.fragmentation;
    const double hits = now.expert_hits - before.expert_hits;
    const double needed = hits + now.expert_misses - before.expert_misses;
    stats_.expert_hit_rate = needed > 0 ? hits / needed : 0;
    if (const double predicted = now.predicted - before.predicted; after.prefetch && predicted > 0) {
      stats_.prefetch_precision = (now.predicted_correct - before.predicted_correct) / predicted;
    }
    if (const double chosen = now.predicted_chosen - before.predicted_chosen;
        after.prefetch && chosen > 0) {
      stats_.prefetch_recall = (now.predicted_correct - before.predicted_correct) / chosen;
    }
    if (evaluated_tokens_ > 0) {
      const double tokens = static_cast<double>(evaluated_tokens_);
      stats_.expert_bytes_read_per_token = (now.read_bytes - before.read_bytes) / tokens;
      stats_.expert_stall_ms_per_token = (now.stall_seconds - before.stall_seconds) * 1e3 / tokens;
    }
  }
  // Repro bundles of a failed or degraded request (never one the caller cancelled).
  const runtime::ReproSettings& repro = model_->repro;
  const char* trigger = nullptr;
  if (!status.ok() && !absl::IsCancelled(status) && repro.on_error) {
    trigger = "error";
  } else if (out->degraded && repro.on_degrade) {
    trigger = "degrade";
  }
  if (trigger != nullptr) {
    const std::string why = status.ok() ? out->degrade_reason : status.ToString();
    if (absl::StatusOr<std::string> path = WriteReproBundle(trigger, why, ""); path.ok()) {
      out->repro_path = *path;
    } else {
      telemetry::Log(telemetry::LogLevel::kWarning,
                     StrCat("the repro bundle was not written: ", path.status().message()));
    }
  }
  return runtime::FromAbsl(status);
}

absl::StatusOr<std::string> Session::Impl::WriteReproBundle(const std::string& trigger,
                                                            const std::string& error,
                                                            const std::string& path) {
  const runtime::ReproSettings& repro = model_->repro;
  std::string target = path;
  if (target.empty()) {
    if (repro.dir.empty()) {
      return absl::FailedPreconditionError(
          "no repro directory: set RuntimeOptions::repro_dir or cache_dir, or give a path");
    }
    target = runtime::ReproPath(repro.dir, trigger);
  }
  telemetry::ReproBundle bundle;
  {
    std::lock_guard<std::mutex> lock(model_->forward_mutex);
    runtime::ReproCapture capture;
    capture.trigger = trigger;
    capture.error = error;
    capture.tokens = tokens_;
    capture.cache = cache_.get();
    capture.router_logits = &first_decode_router_logits_;
    bundle = runtime::BuildReproBundle(repro, *weights_, capture);
  }
  MOERT_ASSIGN_OR_RETURN(const std::vector<std::string> dropped,
                         telemetry::WriteReproBundle(target, bundle, repro.max_bytes));
  telemetry::Log(telemetry::LogLevel::kInfo,
                 StrCat("repro bundle (", trigger, ") written to ", target,
                        dropped.empty() ? std::string() : StrCat(", without ", StrJoin(dropped, ", "))));
  return target;
}

Status Session::Impl::WriteRepro(const std::string& path, std::string* written) {
  std::lock_guard<std::mutex> busy(busy_);
  absl::StatusOr<std::string> target = WriteReproBundle("request", "", path);
  if (!target.ok()) return runtime::FromAbsl(target.status());
  if (written != nullptr) *written = *target;
  return Status();
}

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

Status Session::AddMessage(std::string role, std::string content) {
  return impl_->AddMessage(std::move(role), std::move(content));
}

Status Session::AddImage(const Image& image) { return impl_->AddImage(image); }

Status Session::Generate(const GenerateRequest& request, const TokenCallback& on_token,
                         GenerateResult* result) {
  return impl_->Generate(request, on_token, result);
}

Status Session::Chat(std::string user_message, GenerateRequest request,
                     const TokenCallback& on_token, GenerateResult* result) {
  request.prompt.clear();
  request.messages = {{"user", std::move(user_message)}};
  return impl_->Generate(request, on_token, result);
}

void Session::Reset() { impl_->Reset(); }
const std::vector<Message>& Session::history() const { return impl_->history(); }
const std::vector<int32_t>& Session::context_tokens() const { return impl_->tokens(); }
int Session::context_length() const { return impl_->context_length(); }
GenerationStats Session::Stats() const { return impl_->stats(); }
Status Session::WriteRepro(const std::string& path, std::string* written) {
  return impl_->WriteRepro(path, written);
}

}  // namespace moert
