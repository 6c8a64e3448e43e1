// Session: a conversation's history and KV cache, and the generation loop
// (prefill of the new tokens, sampling, streaming with stop strings, context policy).
//
// The KV cache always holds a prefix of tokens_. A request turns into the token
// sequence the context should hold (the prompt); what it shares with the cache is
// kept and only the rest is prefilled. A raw prompt extends tokens_, so only its
// own tokens are new; a chat request re-renders the whole history with the
// template, and the common prefix with the cache is what earlier turns left there.
#include <algorithm>
#include <chrono>
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
#include "tokenizer/tokenizer.h"

namespace moert {
namespace {

using Clock = std::chrono::steady_clock;

double MillisSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

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
  std::vector<int32_t> tokens;   // everything the context should hold
};

Status Session::Impl::AddMessage(std::string role, std::string content) {
  absl::Status status = CheckRole(role);
  if (!status.ok()) return runtime::FromAbsl(status);
  history_.push_back({std::move(role), std::move(content)});
  return Status();
}

void Session::Impl::Reset() {
  history_.clear();
  tokens_.clear();
  cache_->Truncate(0);
  stats_ = GenerationStats();
}

absl::Status Session::Impl::BuildPrompt(const GenerateRequest& request, Prompt* prompt) const {
  const tokenizer::Tokenizer& tokenizer = model_->tokenizer;
  prompt->chat_template = model_->chat_template;
  if (!request.chat_template.empty()) {
    MOERT_ASSIGN_OR_RETURN(prompt->chat_template,
                           model::ChatTemplateFromName(request.chat_template));
  }
  if (!request.prompt.empty() && !request.messages.empty()) {
    return absl::InvalidArgumentError("a request has either a prompt or messages, not both");
  }
  if (!request.messages.empty()) {
    prompt->chat = true;
    if (!stateless_) prompt->history = history_;
    for (const Message& m : request.messages) {
      MOERT_RETURN_IF_ERROR(CheckRole(m.role));
      prompt->history.push_back(m);
    }
    const std::vector<model::ChatMessage> messages = ToChatMessages(prompt->history);
    MOERT_ASSIGN_OR_RETURN(std::string text,
                           model::ApplyChatTemplate(prompt->chat_template, messages));
    prompt->tokens = tokenizer.Encode(text, /*add_special=*/true, /*parse_special=*/true);
  } else {
    // Raw text continues what the session holds; BOS only at the very start.
    if (!stateless_) prompt->tokens = tokens_;
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
  const int n_ctx = cache_->capacity();
  const auto size = [&] { return static_cast<int>(prompt->tokens.size()); };
  if (request.context_policy == ContextPolicy::kError) {
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
    const size_t first = (!history.empty() && history[0].role == "system") ? 1 : 0;
    while (size() > budget && history.size() > first + 1) {
      history.erase(history.begin() + static_cast<std::ptrdiff_t>(first));
      while (history.size() > first + 1 && history[first].role != "user") {
        history.erase(history.begin() + static_cast<std::ptrdiff_t>(first));
      }
      const std::vector<model::ChatMessage> messages = ToChatMessages(history);
      MOERT_ASSIGN_OR_RETURN(std::string text,
                             model::ApplyChatTemplate(prompt->chat_template, messages));
      prompt->tokens = model_->tokenizer.Encode(text, true, true);
    }
    if (size() <= budget) return absl::OkStatus();
  }
  // Keep BOS and the tail.
  const tokenizer::TokenId bos = model_->tokenizer.vocab().bos();
  const int head = (bos != tokenizer::kNoToken && prompt->tokens[0] == bos) ? 1 : 0;
  std::vector<int32_t> kept(prompt->tokens.begin(), prompt->tokens.begin() + head);
  kept.insert(kept.end(), prompt->tokens.end() - (budget - head), prompt->tokens.end());
  prompt->tokens = std::move(kept);
  return absl::OkStatus();
}

absl::Status Session::Impl::Forward(std::span<const int32_t> tokens) {
  std::lock_guard<std::mutex> lock(model_->forward_mutex);
  evaluated_tokens_ += static_cast<int64_t>(tokens.size());
  return model_->model->Forward(tokens, cache_.get(), model::LogitsFor::kLast, &logits_);
}

Session::Impl::~Impl() {
  std::lock_guard<std::mutex> lock(model_->forward_mutex);
  (void)model_->model->SaveHotSet();
}

model::MemoryStats Session::Impl::MemoryStats() const {
  std::lock_guard<std::mutex> lock(model_->forward_mutex);
  return model_->model->memory_stats();
}

router::RouterStats Session::Impl::RouterStats() const {
  std::lock_guard<std::mutex> lock(model_->forward_mutex);
  const router::Router* r = model_->model->router();
  return r != nullptr ? r->stats() : router::RouterStats();
}

size_t Session::Impl::CachedPrefix(const std::vector<int32_t>& target) const {
  const size_t in_cache = std::min(static_cast<size_t>(cache_->size()), tokens_.size());
  size_t common = 0;
  while (common < in_cache && common < target.size() && tokens_[common] == target[common]) {
    ++common;
  }
  // The last token is evaluated again when everything is cached: its logits are needed.
  if (common > 0 && common == target.size()) --common;
  return common;
}

absl::Status Session::Impl::Prefill(const std::vector<int32_t>& target) {
  const size_t common = CachedPrefix(target);
  cache_->Truncate(static_cast<int>(common));

  const auto start = Clock::now();
  const std::span<const int32_t> fresh = std::span(target).subspan(common);
  MOERT_RETURN_IF_ERROR(Forward(fresh));
  stats_.prefill_ms += MillisSince(start);
  stats_.prefill_tokens += static_cast<int>(fresh.size());
  tokens_ = target;
  return absl::OkStatus();
}

absl::Status Session::Impl::Slide() {
  const tokenizer::TokenId bos = model_->tokenizer.vocab().bos();
  const size_t capacity = static_cast<size_t>(cache_->capacity());
  const size_t head =
      (capacity >= 4 && bos != tokenizer::kNoToken && !tokens_.empty() && tokens_[0] == bos);
  const size_t tail = std::max<size_t>(1, capacity / 2);
  if (tokens_.size() <= head + tail) return absl::InternalError("nothing to slide");
  std::vector<int32_t> kept(tokens_.begin(), tokens_.begin() + static_cast<std::ptrdiff_t>(head));
  kept.insert(kept.end(), tokens_.end() - static_cast<std::ptrdiff_t>(tail), tokens_.end());
  ++stats_.context_slides;
  return Prefill(kept);
}

absl::Status Session::Impl::RunGeneration(const GenerateRequest& request,
                                          const TokenCallback& on_token, GenerateResult* result) {
  const auto start = Clock::now();

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
  stats_.cached_tokens = static_cast<int>(CachedPrefix(prompt.tokens));
  MOERT_RETURN_IF_ERROR(Prefill(prompt.tokens));
  if (prompt.chat) {
    history_ = std::move(prompt.history);
  } else if (stateless_) {
    history_.clear();
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
    if (cache_->size() >= cache_->capacity()) {
      if (request.context_policy != ContextPolicy::kSlide) {
        finish = FinishReason::kContextFull;
        break;
      }
      MOERT_RETURN_IF_ERROR(Slide());  // evaluates `token` too
      continue;
    }
    const auto step_start = Clock::now();
    MOERT_RETURN_IF_ERROR(Forward(std::span<const int32_t>(&token, 1)));
    decode_ms += MillisSince(step_start);
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
    history_.push_back({"assistant", std::move(reply)});
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
  GenerateResult local;
  GenerateResult* out = result != nullptr ? result : &local;
  *out = GenerateResult();
  stats_ = GenerationStats();
  evaluated_tokens_ = 0;
  const model::MemoryStats before = MemoryStats();
  const router::RouterStats routed_before = RouterStats();
  const absl::Status status = RunGeneration(request, on_token, out);
  const router::RouterStats routed = RouterStats();
  if (const uint64_t n = routed.token_layers - routed_before.token_layers; n > 0) {
    stats_.average_experts_per_token =
        static_cast<double>(routed.experts - routed_before.experts) / static_cast<double>(n);
    stats_.router_changed_fraction =
        static_cast<double>(routed.changed - routed_before.changed + routed.thermal_drops -
                            routed_before.thermal_drops) /
        static_cast<double>(n);
  }
  stats_.finish_reason = out->finish_reason;
  stats_.peak_rss_bytes = runtime::PeakRssBytes();
  const model::MemoryStats after = MemoryStats();
  stats_.budget_bytes = static_cast<int64_t>(after.budget_bytes);
  if (after.expert_pool) {
    const experts::ExpertCacheStats& p = after.pool;
    const experts::ExpertCacheStats& p0 = before.pool;
    stats_.expert_pool_bytes = static_cast<int64_t>(p.pool_bytes);
    stats_.expert_pool_used_bytes = static_cast<int64_t>(p.used_bytes);
    stats_.expert_pool_free_bytes = static_cast<int64_t>(p.free_bytes);
    stats_.expert_pool_fragmentation = p.fragmentation;
    const uint64_t hits = p.hits - p0.hits;
    const uint64_t needed = hits + p.misses - p0.misses;
    stats_.expert_hit_rate = needed > 0 ? static_cast<double>(hits) / static_cast<double>(needed) : 0;
    const pipeline::PrefetchStats& f = after.prefetcher;
    const pipeline::PrefetchStats& f0 = before.prefetcher;
    if (after.prefetch && f.predicted > f0.predicted) {
      stats_.prefetch_precision =
          static_cast<double>(f.correct - f0.correct) / static_cast<double>(f.predicted - f0.predicted);
    }
    if (after.prefetch && f.used > f0.used) {
      stats_.prefetch_recall =
          static_cast<double>(f.correct - f0.correct) / static_cast<double>(f.used - f0.used);
    }
    if (evaluated_tokens_ > 0) {
      const double tokens = static_cast<double>(evaluated_tokens_);
      stats_.expert_bytes_read_per_token =
          static_cast<double>(p.bytes_loaded - p0.bytes_loaded) / tokens;
      stats_.expert_stall_ms_per_token = static_cast<double>(p.stall_ns - p0.stall_ns) / 1e6 / tokens;
    }
  }
  return runtime::FromAbsl(status);
}

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

Status Session::AddMessage(std::string role, std::string content) {
  return impl_->AddMessage(std::move(role), std::move(content));
}

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

}  // namespace moert
