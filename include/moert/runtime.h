// moert's C++ API: load a GGUF model, open chat sessions on it and stream generated
// text. Self-contained (standard library only) so an app needs nothing but this
// header and libmoert. Errors come back as moert::Status values, never as
// exceptions of moert's own (std::bad_alloc and exceptions thrown by your callbacks
// pass through).
//
//   std::unique_ptr<moert::MoERuntime> runtime;
//   moert::Status s = moert::MoERuntime::Create({}, &runtime);
//   if (s.ok()) s = runtime->LoadModel("model.gguf");
//   std::unique_ptr<moert::Session> session;
//   if (s.ok()) s = runtime->CreateSession(&session);
//   moert::GenerateRequest request;
//   request.messages = {{"user", "Who art thou?"}};
//   if (s.ok()) s = session->Generate(request, [](std::string_view piece, int32_t) {
//     std::cout << piece << std::flush;
//     return true;  // false cancels
//   });
//
// Threads: a MoERuntime and each Session are used from one thread at a time; several
// sessions may generate on different threads at once (their steps take turns on the
// model). A Session keeps the model it was created on alive, even if the runtime
// loads another one or is destroyed first.
#ifndef MOERT_RUNTIME_H_
#define MOERT_RUNTIME_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "moert/export.h"

namespace moert {

// The kinds of failure; the values equal the C API's moert_status.
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,     // a bad argument, request or file contents
  kNotFound = 2,            // a file that does not exist
  kOutOfRange = 3,          // a prompt longer than the context
  kUnimplemented = 4,       // a model feature moert does not support yet
  kCancelled = 5,           // generation cancelled by the caller
  kInternal = 6,            // a bug, or an unexpected exception
  kFailedPrecondition = 7,  // a call in the wrong state (generate before a model is loaded)
  kDataLoss = 8,            // a truncated file
  kResourceExhausted = 9,   // out of memory
  kPermissionDenied = 10,   // a file that may not be read
};

// The outcome of a call: a code and, when not OK, a message saying what went wrong.
class MOERT_API Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "OK", or "<code name>: <message>".
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// "OK", "INVALID_ARGUMENT", ... for a code.
MOERT_API const char* StatusCodeName(StatusCode code);

// How a model's experts are read from its file when they live in an expert pool.
enum class IoMode {
  kDirect,    // O_DIRECT reads, bypassing the page cache (where the file system refuses
              // them, buffered reads instead, and the stats say why)
  kBuffered,  // reads through the page cache, then dropped from it
  kMmap,      // copies out of a read-only mapping of the file
};

// Where a model's forward pass runs.
enum class Backend {
  kCpu,     // the CPU kernels (the default)
  kOpenCl,  // the OpenCL device; LoadModel fails with kFailedPrecondition naming why
            // when there is none (kUnimplemented with an expert pool)
  kAuto,    // OpenCL on a GPU that passes a self-test at load, else the CPU; a request
            // that fails on the device runs on the CPU and is counted
};

struct RuntimeOptions {
  int threads = 0;         // compute threads; 0: one per online CPU
  // How idle compute threads wait for the next parallel section, as llama.cpp's --poll:
  // 1..100 they spin a while before sleeping (faster decode); 0 they sleep at once
  // (frees the cores between sections, e.g. for an app sharing them); -1 (default):
  // spin on the CPU with every expert resident, sleep when an expert pool streams
  // experts or a GPU backend runs the model.
  int poll = -1;
  // KV cache positions of a session (SessionOptions may give its own); 0: what fits:
  // the model's training context or, with a memory budget, the most whose KV cache fits
  // in half of what the weights and scratch leave, the expert pool keeping at least its
  // floor (ModelInfo::context_length says what it came to).
  int context_length = 0;

  // Memory budget (mixture-of-experts models on the integer kernels). Setting any of
  // the next three keeps the routed experts in an expert pool: each is read from the
  // file when a token needs it and evicted when the pool is full, and the model's
  // output is bit for bit the same as with every expert resident. None set: every
  // expert is loaded at start.
  //
  // Everything the model may hold, in bytes: the weights outside the pool, the KV cache
  // of context_length positions, scratch, and the pool (which gets the rest unless
  // sized below). LoadModel fails with kResourceExhausted, naming the numbers, when the
  // weights outside the pool alone do not fit, or the pool cannot hold the experts one
  // token needs. 0: no budget.
  int64_t memory_budget_bytes = 0;
  // The expert pool in bytes; 0: from expert_pool_fraction or the budget.
  int64_t expert_pool_bytes = 0;
  // The expert pool as a fraction in (0, 1] of what all routed experts take in it
  // (1: every expert fits); 0: unset.
  double expert_pool_fraction = 0;
  IoMode io_mode = IoMode::kDirect;
  // Every session's KV cache is inside the budget: the budget sets one of
  // context_length positions aside, and a session whose cache does not fit what is left
  // fails with kResourceExhausted naming the numbers, or, with shrink_pool_for_sessions,
  // takes the bytes from the expert pool, down to expert_pool_floor_bytes (0: the
  // experts of one token in every layer); the pool grows back as sessions end.
  bool shrink_pool_for_sessions = false;
  int64_t expert_pool_floor_bytes = 0;
  // The KV cache's key and value types, llama.cpp's --cache-type-k / --cache-type-v:
  // "f32" (default, the reference), "f16" (half the memory) or "q8_0" (a bit over a
  // quarter; docs/memory.md gives its perplexity cost). Not f32: the model runs on the
  // CPU backend. InvalidArgument naming the choices otherwise.
  std::string cache_type_k = "f32";
  std::string cache_type_v = "f32";
  // With an expert pool: the most used experts are written to
  // CACHE_DIR/hot/MODEL.gguf.moert-hot when a session ends, when the model is unloaded
  // and by SaveHotSet, and loaded first at the next start. A failed write is returned
  // by SaveHotSet and logged (telemetry's log sink) when a session ends or the model
  // is unloaded; ModelInfo::hot_set_path says where it goes.
  bool hot_set = true;
  // Where moert keeps files between runs: the hot set (CACHE_DIR/hot) and OpenCL
  // program binaries (CACHE_DIR/opencl); an Android app passes its getCacheDir(). Made
  // when first written. Empty: $XDG_CACHE_HOME/moert, else $HOME/.cache/moert; with
  // neither set, no hot set. Nothing is ever written beside the model.
  std::string cache_dir;
  // mlock the weights outside the expert pool (llama.cpp's --mlock), so that memory
  // pressure never pages them out. Best effort: when the system refuses (RLIMIT_MEMLOCK),
  // the model loads unlocked and ModelInfo::lock_note says why.
  bool lock_weights = false;
  // With an expert pool: the longest a step waits on the loader thread for an expert
  // (or for room in its queue), in milliseconds; past it the step reads the expert
  // itself and the timeout is counted. At least 1.
  int loader_wait_deadline_ms = 1000;

  // Routing (mixture-of-experts models). While the experts a token wants fit in the
  // pool, routing is the model's own, bit for bit.
  //
  // Under memory pressure (the experts wanted in the last steps do not fit the pool)
  // the router prefers resident experts: a non-resident expert's gate logit is lowered
  // by router_alpha * pressure (pressure in [0, 1]). 0: off at any pressure (outputs
  // then equal fully resident experts, as documented above). docs/routing.md
  // measures the choice of the default.
  float router_alpha = 1.0f;
  // Dynamic top-k: each token takes the fewest experts (at least 1, at most the
  // model's k) whose routing probabilities sum to at least this; 0: off.
  float dynamic_k = 0;
  // Above this CPU temperature (degrees Celsius) every token takes one expert fewer
  // (never fewer than 1); 0: no limit. The temperature is the hottest CPU zone of
  // /sys/class/thermal, or what SetTemperature reported.
  float thermal_limit_c = 0;

  // With an expert pool: while layer L's experts compute, the loader reads the experts
  // the router of layer L + prefetch_depth predicts from layer L's input. Outputs do not
  // change (with router_alpha > 0 residency feeds routing, so they may). On by
  // default: it decoded faster than off in every pair measured, on every disk
  // (docs/performance.md); without an expert pool it does nothing.
  bool prefetch = true;
  int prefetch_depth = 1;  // layers ahead, 1 .. the model's layers - 1

  Backend backend = Backend::kCpu;

  // Modality-biased routing (mixture-of-experts models with a modality bias: the
  // `moert.modality_bias` metadata, or a side file): each expert's gate logit gets
  // lambda * bias, lambda = modality_lambda * the request's share of image tokens
  // (text only: 0, routing exactly the model's own; image only: modality_lambda;
  // docs/routing.md). 0: off. Finite.
  float modality_lambda = 1.0f;
  // A modality bias side file (n_layer x n_expert whitespace-separated numbers) used
  // instead of the model's metadata; empty: the metadata's, when it has one.
  std::string modality_bias_path;

  // Degrading instead of failing (docs/degrade.md). The inference guard: a step that
  // fails with exhaustion, an I/O error, a timeout or a lost device is retried degraded
  // (a compacted pool, one expert fewer per token, the dense fallback FFN, the CPU instead
  // of OpenCL, in the order docs/degrade.md gives) before the request fails;
  // GenerateResult::degraded says so and why. A request that succeeds first time is bit
  // for bit what it is without the guard.
  bool inference_guard = true;
  // The degrade policy: rules over the runtime's metrics evaluated after every step
  // (fragmentation above 0.4: defragment; above the thermal limit: k - 1; a slow router
  // or long expert stalls: the dense fallback FFN), each firing counted and reported as a
  // degrade; more than 5 degrades in 64 steps keep the session degraded. Off by default:
  // a firing rule may change the output.
  bool degrade_policy = false;
  // The policy's rules from this file instead of the defaults (docs/degrade.md gives the
  // format); empty: the defaults. Read by LoadModel: a bad file fails it, naming the
  // line and what is wrong.
  std::string degrade_rules_path;

  // Repro bundles (docs/repro.md): a small file with what a request looked like (the
  // device, the model's hash, these options, the context's token ids, the router logits
  // of the first decoded token, the first layers' KV cache, the expert pool, the last 2 s
  // of trace events, the error) that moert-replay re-runs. Session::WriteRepro writes
  // one on request. With repro_on_error, a request that fails (not one the caller
  // cancelled) writes one; with repro_on_degrade, one that ran degraded; both into
  // repro_dir (empty: CACHE_DIR/repro; none when no cache directory is known), and
  // GenerateResult::repro_path says where. Off by default. A failed write is logged and
  // never changes the request's outcome.
  bool repro_on_error = false;
  bool repro_on_degrade = false;
  std::string repro_dir;
  // The cap on a bundle's file, in bytes: past it the KV cache is left out, then the
  // trace (the bundle says which). 0: the default, 5 MB.
  int64_t repro_max_bytes = 5 << 20;
  // With repro_on_crash, a load installs a handler of SIGSEGV, SIGBUS, SIGILL, SIGFPE and
  // SIGABRT (process-wide, once) that writes REPRO_DIR/crash-<pid>.moert-repro: the
  // device, the model, the options and the context's token ids of the session that last
  // stepped (the crash variant: only what a signal handler can write safely), then lets
  // the signal go on to the handler before it (the process dies as it would have).
  bool repro_on_crash = false;

  // --- Expert hot updates (MoERuntime::ApplyUpdate, docs/updates.md).
  // The Ed25519 public key delta packages must be signed with: 64 hex digits (the text
  // of moert-delta keygen's NAME.pub). Empty: ApplyUpdate refuses every package.
  std::string update_public_key;
};

// A session's own settings (MoERuntime::CreateSession).
struct SessionOptions {
  // KV cache positions; 0: the runtime's (ModelInfo::context_length). The cache is
  // reserved in the memory budget in full for the session's life.
  int context_length = 0;
};

// How hard to give memory back (MoERuntime::TrimMemory), with the values of Android's
// ComponentCallbacks2.onTrimMemory levels, so an app can pass its level through.
enum class TrimLevel {
  kNone = 0,               // lift an earlier trim: the pool may grow back
  kRunningModerate = 5,    // the expert pool to 75% of its size
  kRunningLow = 10,        // to 50%, and evict experts a hot-set preload brought in unused
  kRunningCritical = 15,   // to its floor, evict unused experts
  kUiHidden = 20,          // to 50%, evict unused experts
  kBackground = 40,        // to its floor, evict unused experts
  kModerate = 60,          // the same
  kComplete = 80,          // the same, and free idle sessions' KV caches (they re-evaluate
                           // their context on their next request)
};

struct ModelInfo {
  std::string path;
  std::string architecture;  // general.architecture, e.g. "llama"
  std::string name;          // general.name (may be empty)
  int vocab_size = 0;
  int64_t parameters = 0;   // weights in the file's tensors (every expert counted)
  int layers = 0;           // block_count
  int embedding_length = 0; // n_embd
  int experts = 0;          // routed experts per MoE layer (0: a dense model)
  int experts_used = 0;     // experts each token takes (the model's k)
  // Where the model's bytes start in its file: not 0 for LoadModelFromFd of an
  // uncompressed APK asset.
  int64_t file_offset = 0;
  int training_context_length = 0;
  int context_length = 0;     // what each session gets
  std::string chat_template;  // the template family sessions use by default: "chatml", ...
  double load_ms = 0;
  // The backend the model runs on: "CPU" or "OpenCL"; with OpenCL the device's name
  // and type and its driver version. backend_note: with Backend::kAuto on the CPU, why.
  std::string backend = "CPU";
  std::string device;
  std::string driver;
  std::string backend_note;
  // With an expert pool on OpenCL, where the pooled experts compute: "device
  // (zero-copy)", "device (copied per load)" or "host: <why>"; empty otherwise.
  std::string pooled_experts;
  // With an expert pool and the hot set on: its file (empty: no hot set, as when no
  // cache directory is known).
  std::string hot_set_path;
  // With RuntimeOptions::lock_weights: the bytes mlocked, or why none are.
  int64_t locked_bytes = 0;
  std::string lock_note;
  // With a vision projector (MoERuntime::LoadMmproj): its file, its MiniCPM-V version
  // (2: 2.5, 3: 2.6, 4: o 2.6) and the image positions one slice takes; empty / 0
  // without.
  std::string mmproj_path;
  int minicpmv_version = 0;
  int image_tokens_per_slice = 0;
};

// An image for a vision model: a PNG or JPEG file, the bytes of one, or decoded RGB8
// pixels. Set exactly one of them; the factories do. Alpha is dropped; JPEG EXIF
// orientation is applied.
struct MOERT_API Image {
  std::string path;             // a PNG or JPEG file
  std::vector<uint8_t> encoded; // or PNG or JPEG bytes
  std::vector<uint8_t> rgb;     // or RGB8 pixels, rows tightly packed (width * 3 bytes)
  int width = 0;                // of `rgb`
  int height = 0;

  static Image FromFile(std::string path);
  static Image FromEncoded(std::vector<uint8_t> bytes);
  // Copies `height` rows of width * 3 bytes, row y starting at pixels + y * stride_bytes
  // (0: width * 3).
  static Image FromRgb8(const uint8_t* pixels, int width, int height, size_t stride_bytes = 0);
};

struct Message {
  Message() = default;
  Message(std::string r, std::string c, std::vector<Image> i = {})  // NOLINT: {role, text}
      : role(std::move(r)), content(std::move(c)), images(std::move(i)) {}

  std::string role;  // "system", "user" or "assistant"
  std::string content;
  // Images of a user message (a vision projector must be loaded): they come before
  // the text, each as minicpmv-cli lays an image out (<image>..</image>, its slices).
  std::vector<Image> images;
};

// What to do when a prompt, or a prompt plus what is being generated, does not fit
// the context.
enum class ContextPolicy {
  kError,  // a prompt that does not fit is OutOfRange; generation stops at a full context
  kSlide,  // drop the oldest turns (keeping a leading system message) or, for raw text,
           // keep the tail, then re-prefill what is left
};

enum class FinishReason {
  kNone,             // did not start (an error)
  kEndOfGeneration,  // the model produced an end-of-generation token (EOS, EOT, ...)
  kStopString,       // one of the request's stop strings appeared
  kMaxTokens,        // max_tokens were generated
  kCancelled,        // the cancel flag or the callback asked to stop
  kContextFull,      // the context filled up (ContextPolicy::kError)
};

struct GenerateRequest {
  // The input: either raw text (no chat template), appended to what the session
  // already holds, or chat messages, appended to the session's history and
  // formatted with the chat template together with it. Not both.
  std::string prompt;
  std::vector<Message> messages;

  int max_tokens = -1;  // llama.cpp's n_predict; < 0: until end of generation or a full context

  // Sampling (llama.cpp's meanings and defaults); temperature 0 is greedy.
  float temperature = 0.8f;
  int top_k = 40;               // <= 0: off
  float top_p = 0.95f;          // 1: off
  float min_p = 0.05f;          // 0: off
  float repeat_penalty = 1.0f;  // 1: off
  int repeat_last_n = 64;       // tokens the repeat penalty looks back over (-1: all)
  uint64_t seed = 0xFFFFFFFF;   // same seed, same tokens

  // Generation stops where one of these appears in the text; it is not emitted.
  std::vector<std::string> stop;
  // Set to true from any thread to stop generating (checked before every step).
  const std::atomic<bool>* cancel = nullptr;
  // Chat template by name ("chatml", "llama2", "llama3", "plain"); empty: the
  // model's own (tokenizer.chat_template), plain when it has none.
  std::string chat_template;
  ContextPolicy context_policy = ContextPolicy::kError;

  // Images (a vision projector must be loaded: MoERuntime::LoadMmproj). With `prompt`,
  // the request is one user turn laid out exactly as llama.cpp's minicpmv-cli builds it
  // (the projector version's turn opener, each image's slices, the prompt, the
  // assistant opener; no BOS); with `messages`, they join the last user message's
  // images. Session::AddImage adds to these.
  std::vector<Image> images;
  // Visual-token pruning (docs/vision.md): each image slice keeps this fraction of its
  // tokens, those whose resampler attention is most focused (lowest entropy), at
  // least image_min_keep. 1: off. (0, 1].
  float image_keep_ratio = 1.0f;
  int image_min_keep = 1;
};

struct GenerateResult {
  std::string text;             // everything the callback received
  std::vector<int32_t> tokens;  // the generated token ids (end-of-generation excluded)
  FinishReason finish_reason = FinishReason::kNone;
  // The request ran degraded (RuntimeOptions::inference_guard, degrade_policy), or its
  // session stays degraded; degrade_reason says each degrade and why, "; "-separated.
  bool degraded = false;
  std::string degrade_reason;
  // The repro bundle this request wrote (RuntimeOptions::repro_on_error /
  // repro_on_degrade); empty: none.
  std::string repro_path;
};

// Figures of the last Generate call.
struct GenerationStats {
  int prompt_tokens = 0;     // tokens of context the request needed before generating
  int cached_tokens = 0;     // of those, already in the KV cache from earlier turns
  int prefill_tokens = 0;    // tokens evaluated as a batch (the prompt's new tokens and
                             // any re-prefill after a context slide)
  int generated_tokens = 0;  // tokens sampled and passed on (end-of-generation excluded)
  int context_slides = 0;    // times ContextPolicy::kSlide dropped old context
  double prefill_ms = 0;
  double decode_ms = 0;
  double time_to_first_token_ms = 0;  // from the call to the first sampled token
  double prefill_tokens_per_second = 0;
  double decode_tokens_per_second = 0;  // one-token steps after the first token
  int64_t peak_rss_bytes = 0;           // the process's peak resident memory so far
  FinishReason finish_reason = FinishReason::kNone;

  // Memory, with a budget or an expert pool (0 otherwise). The per-token figures
  // divide what the model's pool did during this call (steps of other sessions running
  // at the same time included) by the tokens this call evaluated.
  int64_t budget_bytes = 0;            // the total budget in force (given, or derived:
                                       // weights + KV cache + scratch + pool)
  int64_t kv_cache_bytes = 0;          // this session's KV cache (reserved in full)
  int64_t kv_reserved_bytes = 0;       // the KV caches of every session of the model
  int kv_caches = 0;                   // how many there are
  int64_t expert_pool_bytes = 0;       // the pool's size
  int64_t expert_pool_used_bytes = 0;  // bytes of resident experts (their pages)
  int64_t expert_pool_free_bytes = 0;
  double expert_pool_fragmentation = 0;    // 1 - largest free block / free bytes
  double expert_hit_rate = 0;              // experts found resident / experts needed
  double expert_bytes_read_per_token = 0;  // bytes read from the model file
  double expert_stall_ms_per_token = 0;    // time spent waiting for experts to load

  // Routing (mixture-of-experts models; 0 otherwise), over this call's tokens.
  double average_experts_per_token = 0;  // experts per token and MoE layer (k)
  double router_changed_fraction = 0;    // token-layers where residency or thermal
                                         // state changed the experts chosen
  // Prefetch (with RuntimeOptions::prefetch), over this call's tokens.
  double prefetch_precision = 0;  // predicted experts the router then chose / predicted
  double prefetch_recall = 0;     // chosen experts that had been predicted / chosen

  // Images (with a vision projector), over this call's new images.
  int images = 0;            // images encoded (a repeated image is encoded once)
  int image_slices = 0;      // their slices
  int image_tokens = 0;      // image positions in the prompt (after pruning)
  double image_encode_ms = 0;  // decoding, preprocessing and encoding them
  double image_share = 0;      // image positions / prompt positions: the routing lambda's share

  // As GenerateResult::degraded and degrade_reason.
  bool degraded = false;
  std::string degrade_reason;
};

// Called once per generated token with the text that became final with it (empty
// while a possible stop string or an incomplete UTF-8 character is held back), and
// once more with token -1 for text still held back at the end. Return false to
// cancel generation.
using TokenCallback = std::function<bool(std::string_view piece, int32_t token)>;

// Called while a model loads with the fraction done, rising to exactly 1. A callable
// returning bool may return false to cancel the load (LoadModel then returns
// kCancelled and the model loaded before stays); one returning void never cancels.
class ProgressCallback {
 public:
  ProgressCallback() = default;
  template <typename F,
            typename = std::enable_if_t<std::is_invocable_v<F&, float> &&
                                        !std::is_same_v<std::decay_t<F>, ProgressCallback>>>
  ProgressCallback(F f)  // NOLINT: callables convert, as to std::function
      : fn_(Wrap(std::move(f))) {}

  // true: go on.
  bool operator()(float fraction) const { return fn_ ? fn_(fraction) : true; }
  explicit operator bool() const { return static_cast<bool>(fn_); }

 private:
  template <typename F>
  static std::function<bool(float)> Wrap(F f) {
    if constexpr (std::is_void_v<std::invoke_result_t<F&, float>>) {
      return [f = std::move(f)](float x) mutable {
        f(x);
        return true;
      };
    } else {
      return [f = std::move(f)](float x) mutable { return static_cast<bool>(f(x)); };
    }
  }
  std::function<bool(float)> fn_;
};

// A conversation: chat history plus the KV cache of everything said so far, so each
// turn only evaluates its new tokens.
class MOERT_API Session {
 public:
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Appends a message to the history without generating (a system prompt, or
  // earlier turns). InvalidArgument for a role other than system, user, assistant.
  Status AddMessage(std::string role, std::string content);

  // Adds an image to the next Generate or Chat call (as if in its request's images).
  // The image is decoded now: a bad one is an error naming what is wrong, and nothing
  // is added. FailedPrecondition when the model has no vision projector.
  Status AddImage(const Image& image);

  // Generates a continuation, streaming it to `on_token` (may be empty) and, when
  // `result` is not null, collecting it there. On a bad request the session is left
  // as it was. Cancelling gives Cancelled; what was generated until then stays in
  // the session (and in `result`).
  Status Generate(const GenerateRequest& request, const TokenCallback& on_token = {},
                  GenerateResult* result = nullptr);

  // One chat turn: `request` with messages = {{"user", user_message}}.
  Status Chat(std::string user_message, GenerateRequest request, const TokenCallback& on_token = {},
              GenerateResult* result = nullptr);

  // Forgets the history and the KV cache.
  void Reset();

  const std::vector<Message>& history() const;
  // Token ids of the conversation so far (what the KV cache holds or will hold).
  const std::vector<int32_t>& context_tokens() const;
  int context_length() const;
  GenerationStats Stats() const;

  // Writes a repro bundle of the session now (RuntimeOptions::repro_*; docs/repro.md) to
  // `path`, or, when empty, to a new file under the repro directory; `written` (may be
  // null) gets the file's path. FailedPrecondition when `path` is empty and no repro
  // directory is known; an error naming the path when it cannot be written.
  Status WriteRepro(const std::string& path = "", std::string* written = nullptr);

  class Impl;  // opaque: the library's own

 private:
  friend class MoERuntime;
  explicit Session(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class MOERT_API MoERuntime {
 public:
  // InvalidArgument for negative threads or context_length.
  static Status Create(const RuntimeOptions& options, std::unique_ptr<MoERuntime>* runtime);
  ~MoERuntime();
  MoERuntime(const MoERuntime&) = delete;
  MoERuntime& operator=(const MoERuntime&) = delete;

  // Loads a GGUF model, replacing the loaded one only on success (a vision projector
  // loaded with the old one goes with it). Errors name the file and what is wrong
  // (missing, not a GGUF, truncated, unsupported architecture, no tensors in it, ...).
  Status LoadModel(const std::string& path, const ProgressCallback& progress = {});

  // As LoadModel, for the `length` bytes at `offset` of the open file `fd` (0: to the
  // file's end): an Android app's AssetFileDescriptor of a model stored uncompressed
  // in its APK (getParcelFileDescriptor().getFd(), getStartOffset(), getLength()). Any
  // offset. The fd stays the caller's: moert opens the file again by the name the
  // fd has (/proc/self/fd), which must be a regular file that still names it.
  // InvalidArgument for a negative fd, offset or length, or a range past its end.
  Status LoadModelFromFd(int fd, int64_t offset, int64_t length,
                         const ProgressCallback& progress = {});

  // Loads a vision projector for the loaded model: llama.cpp's clip GGUF of a
  // MiniCPM-V model (llama.cpp's --mmproj), versions 2, 3 and 4, replacing one loaded
  // before. The model's sessions take images from then on. FailedPrecondition without
  // a model; InvalidArgument naming
  // the key or tensor at fault, another projector type, or a projection width that is
  // not the model's n_embd.
  Status LoadMmproj(const std::string& path);
  bool model_loaded() const;
  // Empty (default values) when no model is loaded.
  ModelInfo model_info() const;

  // A new session on the loaded model; FailedPrecondition when none is loaded,
  // ResourceExhausted naming the numbers when its KV cache does not fit the memory
  // budget (RuntimeOptions::shrink_pool_for_sessions). Any thread.
  Status CreateSession(std::unique_ptr<Session>* session);
  Status CreateSession(const SessionOptions& options, std::unique_ptr<Session>* session);

  // Gives memory back at `level` (see TrimLevel; an app's onTrimMemory level, any
  // value: the nearest level below it applies). The pool shrinks at once when no step
  // is running, else before the next step. Routing reads the level as device pressure.
  // InvalidArgument for a negative level. Any thread.
  Status TrimMemory(int level);

  // One-shot generation on a fresh context (no history kept between calls; a
  // prompt sharing a prefix with the previous call's reuses its KV cache).
  // FailedPrecondition when no model is loaded.
  Status Generate(const GenerateRequest& request, const TokenCallback& on_token = {},
                  GenerateResult* result = nullptr);
  // Figures of the last one-shot Generate.
  GenerationStats Stats() const;

  // The runtime's metrics (every model it loaded and their sessions: expert loads,
  // bytes read, stalls, pool state, router latency, prefill and decode, ...) in the
  // Prometheus text exposition format 0.0.4; docs/telemetry.md lists them. Any thread.
  std::string Metrics() const;

  const RuntimeOptions& options() const;
  // Replaces the options (checked as Create checks them); they apply from the next
  // LoadModel on. The loaded model keeps the ones it was loaded with.
  Status SetOptions(const RuntimeOptions& options);

  // Writes the hot set of the loaded model now (see RuntimeOptions::hot_set); OK and
  // nothing written without an expert pool or with hot_set off. FailedPrecondition
  // when no model is loaded.
  Status SaveHotSet();

  // The device temperature in degrees Celsius as the host app reads it (phones often
  // forbid reading /sys/class/thermal), for RuntimeOptions::thermal_limit_c; NaN: back
  // to reading sysfs. Applies to the loaded model and to those loaded later. Any thread.
  void SetTemperature(float celsius);

  // --- Expert hot update (docs/updates.md). Applies the delta package at `package_path`
  // (moert-delta make) to the loaded model while it keeps answering: checks the
  // signature against RuntimeOptions::update_public_key and that the model file is the
  // package's base, writes the new model file crash-safely over the old one (write
  // new, fsync, rename, fsync the folder), and puts the new weights in between steps:
  // the changed experts alone where only experts changed and the model runs on the CPU
  // (resident: converted ahead, copied over the old between two steps; pooled: evicted,
  // read anew at their next miss), else the new file loaded whole and swapped in. A
  // step in flight finishes on the old weights, every session's next step runs on the
  // new ones (its context evaluated again on them first), and old weights swapped out
  // are freed when the last session has moved off them. No step ever mixes the two.
  // Refusals name their reason and leave the model and its file as they were:
  // FailedPrecondition without a model or key, for a package of another base (or one
  // already applied), or while another update runs; PermissionDenied for a bad
  // signature; DataLoss for a truncated package or a delta that decodes to the wrong
  // checksum; ResourceExhausted for a full disk. Any thread.
  Status ApplyUpdate(const std::string& package_path);

 private:
  struct Impl;
  explicit MoERuntime(std::unique_ptr<Impl> impl);
  // LoadModel's work, for the `length` bytes at `offset` of `path` (length < 0: all).
  Status LoadRange(const std::string& path, uint64_t offset, int64_t length,
                   const ProgressCallback& progress);
  std::unique_ptr<Impl> impl_;
};

// "end_of_generation", "stop_string", ... for logs and the CLI.
MOERT_API const char* FinishReasonName(FinishReason reason);

// Trace spans (docs/tracing.md), process-wide: on or off (off by default; off costs a
// relaxed load and a branch per span). Any thread.
MOERT_API void SetTracing(bool enabled);
// Drops every span recorded so far.
MOERT_API void ClearTrace();
// Every span recorded (each thread's ring keeps its newest 32768) as Chrome trace-event
// JSON (ui.perfetto.dev opens it) into `path`. Internal naming the path when it cannot
// be written. Any thread; tracing may stay on.
MOERT_API Status WriteTrace(const std::string& path);

}  // namespace moert

#endif  // MOERT_RUNTIME_H_
