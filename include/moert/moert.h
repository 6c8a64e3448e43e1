/* moert's C API, for JNI and other foreign-function callers: load a GGUF model,
 * open sessions on it and stream generated text through a callback.
 *
 * Conventions: every function that can fail returns a moert_status and writes its
 * results through out-parameters; the message of a failure is read with
 * moert_last_error() (runtime) or moert_session_last_error() (session). A NULL handle
 * or a NULL required argument gives MOERT_INVALID_ARGUMENT. No C++ exception ever
 * leaves these functions. Strings are UTF-8 and NUL-terminated; the library copies
 * what it keeps. A handle is used from one thread at a time, except
 * moert_session_cancel(), moert_runtime_set_temperature() and moert_runtime_trim(),
 * which may be called from any thread (they leave the handle's last error alone), and
 * moert_session_create*(), which may run on several threads at once for one runtime
 * (each then reads its error only through the session it got, or its own calls). */
#ifndef MOERT_MOERT_H_
#define MOERT_MOERT_H_

#include <stddef.h>
#include <stdint.h>

#include "moert/export.h"
#include "moert/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A runtime: options and the loaded model. Create with moert_runtime_create(). */
typedef struct moert_runtime moert_runtime;

/** A conversation on a runtime's model: chat history and KV cache. Create with
 * moert_session_create(). It keeps its model alive, so it may outlive the runtime. */
typedef struct moert_session moert_session;

/** What a call returned. The values are stable. */
typedef enum moert_status {
  MOERT_OK = 0,                  /**< success */
  MOERT_INVALID_ARGUMENT = 1,    /**< a bad argument, request or file contents */
  MOERT_NOT_FOUND = 2,           /**< a file that does not exist */
  MOERT_OUT_OF_RANGE = 3,        /**< a prompt longer than the context */
  MOERT_UNIMPLEMENTED = 4,       /**< a model feature moert does not support yet */
  MOERT_CANCELLED = 5,           /**< generation cancelled by the caller */
  MOERT_INTERNAL = 6,            /**< a bug, or an unexpected exception inside */
  MOERT_FAILED_PRECONDITION = 7, /**< a call in the wrong state (no model loaded) */
  MOERT_DATA_LOSS = 8,           /**< a truncated file */
  MOERT_RESOURCE_EXHAUSTED = 9,  /**< out of memory */
  MOERT_PERMISSION_DENIED = 10   /**< a file that may not be read */
} moert_status;

/** Why generation ended. */
typedef enum moert_finish_reason {
  MOERT_FINISH_NONE = 0,              /**< it did not start (an error) */
  MOERT_FINISH_END_OF_GENERATION = 1, /**< the model produced EOS / end of turn */
  MOERT_FINISH_STOP_STRING = 2,       /**< a stop string appeared (it is not emitted) */
  MOERT_FINISH_MAX_TOKENS = 3,        /**< max_tokens were generated */
  MOERT_FINISH_CANCELLED = 4,         /**< the callback or moert_session_cancel() stopped it */
  MOERT_FINISH_CONTEXT_FULL = 5       /**< the context filled up (MOERT_CONTEXT_ERROR) */
} moert_finish_reason;

/** What to do when the context cannot hold a prompt or its continuation. */
typedef enum moert_context_policy {
  /** A prompt that does not fit is MOERT_OUT_OF_RANGE; generation stops at a full
   * context (MOERT_FINISH_CONTEXT_FULL). */
  MOERT_CONTEXT_ERROR = 0,
  /** Drop the oldest turns (a leading system message stays) or, for raw text, keep
   * the tail; then re-evaluate what is left. */
  MOERT_CONTEXT_SLIDE = 1
} moert_context_policy;

/** How a model's experts are read from its file when they live in an expert pool
 * (see moert_runtime_set_memory_budget()). */
typedef enum moert_io_mode {
  /** O_DIRECT reads, bypassing the page cache; where the file system refuses them,
   * buffered reads instead. */
  MOERT_IO_DIRECT = 0,
  MOERT_IO_BUFFERED = 1, /**< reads through the page cache, then dropped from it */
  MOERT_IO_MMAP = 2      /**< copies out of a read-only mapping of the file */
} moert_io_mode;

/** Where a model's forward pass runs (see moert_runtime_set_backend()). */
typedef enum moert_backend {
  MOERT_BACKEND_CPU = 0,    /**< the CPU kernels (the default) */
  MOERT_BACKEND_OPENCL = 1, /**< the OpenCL device; loading fails when there is none */
  MOERT_BACKEND_AUTO = 2    /**< OpenCL on a GPU passing a self-test, else the CPU */
} moert_backend;

/** Runtime options. Fill with moert_runtime_options_default() first. */
typedef struct moert_runtime_options {
  int32_t threads;        /**< compute threads; 0: one per online CPU */
  int32_t context_length; /**< KV cache positions per session; 0: the model's training context */
} moert_runtime_options;

/** Sampling settings, with llama.cpp's meanings; temperature 0 is greedy. */
typedef struct moert_sampler_params {
  float temperature;     /**< default 0.8; <= 0: greedy (argmax) */
  int32_t top_k;         /**< default 40; <= 0: off */
  float top_p;           /**< default 0.95; 1: off */
  float min_p;           /**< default 0.05; 0: off */
  float repeat_penalty;  /**< default 1 (off) */
  int32_t repeat_last_n; /**< default 64: tokens the penalty looks back over; -1: all */
  uint64_t seed;         /**< default 0xFFFFFFFF; same seed, same tokens */
} moert_sampler_params;

/** One chat message. */
typedef struct moert_message {
  const char* role;    /**< "system", "user" or "assistant" */
  const char* content; /**< the text */
} moert_message;

/** A generation request. Fill with moert_generate_params_default() first. Give
 * either `prompt` (raw text appended to the session, no chat template) or
 * `messages` (appended to the session's history and formatted with the chat
 * template), not both. */
typedef struct moert_generate_params {
  const char* prompt;            /**< raw text, or NULL */
  const moert_message* messages; /**< chat messages, or NULL */
  size_t n_messages;             /**< number of `messages` */
  int32_t max_tokens;            /**< llama.cpp's n_predict; < 0 (default): no limit */
  moert_sampler_params sampler;  /**< sampling settings */
  const char* const* stop;       /**< stop strings (never emitted), or NULL */
  size_t n_stop;                 /**< number of `stop` strings */
  /** Chat template by name ("chatml", "llama2", "llama3", "plain"); NULL or "": the
   * model's own (plain when it has none). */
  const char* chat_template;
  moert_context_policy context_policy; /**< default MOERT_CONTEXT_ERROR */
  /** Visual-token pruning: each image slice keeps this fraction (0, 1] of its tokens,
   * the most focused ones (default 1: all); at least `image_min_keep` (default 1). */
  float image_keep_ratio;
  int32_t image_min_keep;
} moert_generate_params;

/** Figures of a session's last generation. */
typedef struct moert_stats {
  int32_t prompt_tokens;         /**< tokens of context the request needed before generating */
  int32_t cached_tokens;         /**< of those, already in the KV cache from earlier turns */
  int32_t prefill_tokens;        /**< tokens evaluated as a batch */
  int32_t generated_tokens;      /**< tokens passed to the callback (end of generation excluded) */
  int32_t context_slides;        /**< times MOERT_CONTEXT_SLIDE dropped old context */
  double prefill_ms;             /**< time spent in prefill */
  double decode_ms;              /**< time spent in one-token steps */
  double time_to_first_token_ms; /**< from the call to the first sampled token */
  double prefill_tokens_per_second;  /**< prefill_tokens / prefill time */
  double decode_tokens_per_second;   /**< one-token steps per second */
  int64_t peak_rss_bytes;            /**< the process's peak resident memory so far */
  moert_finish_reason finish_reason; /**< why it ended */
  double average_experts_per_token;  /**< MoE: experts per token and layer (k) */
  double router_changed_fraction;    /**< MoE: token-layers where residency or heat changed the choice */
  int32_t images;                    /**< images encoded for this generation */
  int32_t image_tokens;              /**< image positions in its prompt (after pruning) */
  double image_encode_ms;            /**< decoding, preprocessing and encoding them */
  int32_t degraded;                  /**< 1: it ran degraded, or the session stays degraded */
  /** Each degrade and why, "; "-separated ("" when not degraded); valid until the
   * next moert_session_stats call on the session or its destroy. */
  const char* degrade_reason;
  /* Since MOERT_ABI_VERSION 1 (Android/JNI additions). */
  double prefetch_precision; /**< predicted experts the router then chose / predicted */
  double prefetch_recall;    /**< chosen experts that had been predicted / chosen */
  int32_t image_slices;      /**< slices of the images encoded for this generation */
  double image_share;        /**< image positions / prompt positions */
} moert_stats;

/** Memory figures of a session's last generation, with a memory budget or an expert
 * pool (all 0 otherwise). The per-token figures divide what the model's pool did during
 * the generation by the tokens it evaluated. */
typedef struct moert_memory_stats {
  int64_t budget_bytes;           /**< the total budget in force (given, or derived from the pool) */
  int64_t expert_pool_bytes;      /**< the expert pool's size */
  int64_t expert_pool_used_bytes; /**< bytes of resident experts (their pages) */
  int64_t expert_pool_free_bytes; /**< free bytes of the pool */
  double expert_pool_fragmentation;   /**< 1 - largest free block / free bytes */
  double expert_hit_rate;             /**< experts found resident / experts needed */
  double expert_bytes_read_per_token; /**< bytes read from the model file per token */
  double expert_stall_ms_per_token;   /**< time waiting for experts to load per token */
  int64_t peak_rss_bytes;             /**< the process's peak resident memory so far */
  int64_t kv_cache_bytes;    /**< this session's KV cache, reserved in the budget in full */
  int64_t kv_reserved_bytes; /**< the KV caches of every session of the model */
  int32_t kv_caches;         /**< how many sessions hold one */
} moert_memory_stats;

/** Called while a model loads with the fraction done, rising to exactly 1.0. */
typedef void (*moert_progress_callback)(float progress, void* user_data);

/** As moert_progress_callback; return 0 to go on, non-zero to cancel the load. */
typedef int (*moert_cancellable_progress_callback)(float progress, void* user_data);

/** Called once per generated token with the NUL-terminated text that became final
 * with it (may be "", while a possible stop string or a partial UTF-8 character is
 * held back) and the token id, and once more with token -1 for text still held back
 * at the end. Return 0 to go on, non-zero to cancel (the generation then returns
 * MOERT_CANCELLED). `piece` is valid only during the call. */
typedef int (*moert_token_callback)(const char* piece, int32_t token, void* user_data);

/** "MOERT_OK", "MOERT_INVALID_ARGUMENT", ...; never NULL. */
MOERT_API const char* moert_status_string(moert_status status);

/** Fills `options` with the defaults. Does nothing when `options` is NULL. */
MOERT_API void moert_runtime_options_default(moert_runtime_options* options);

/** Fills `params` with the defaults (no prompt, no limit, llama.cpp's sampling
 * defaults). Does nothing when `params` is NULL. */
MOERT_API void moert_generate_params_default(moert_generate_params* params);

/** Creates a runtime. `options` may be NULL (defaults). On failure `*runtime` is
 * NULL and moert_last_error(NULL) says why. */
MOERT_API moert_status moert_runtime_create(const moert_runtime_options* options,
                                            moert_runtime** runtime);

/** Destroys a runtime (NULL is ignored). Its sessions stay usable. */
MOERT_API void moert_runtime_destroy(moert_runtime* runtime);

/** The message of the last call on `runtime` ("" when it succeeded). With NULL:
 * the message of the calling thread's last call that had no handle to keep it on
 * (moert_runtime_create, or a call given a NULL handle or out-parameter). Valid
 * until the next call on the handle (or, for NULL, on the thread). Never NULL. */
MOERT_API const char* moert_last_error(const moert_runtime* runtime);

/** Loads a GGUF model, replacing the loaded one only on success. `progress` may be
 * NULL. Errors name the file and what is wrong with it. */
MOERT_API moert_status moert_runtime_load_model(moert_runtime* runtime, const char* path,
                                                moert_progress_callback progress, void* user_data);

/** As moert_runtime_load_model, with a progress callback that may cancel: when it
 * returns non-zero the load stops before the next tensor and returns MOERT_CANCELLED;
 * the model loaded before stays. */
MOERT_API moert_status moert_runtime_load_model_cancellable(
    moert_runtime* runtime, const char* path, moert_cancellable_progress_callback progress,
    void* user_data);

/** The context length sessions of the loaded model get; MOERT_FAILED_PRECONDITION
 * when no model is loaded. */
MOERT_API moert_status moert_runtime_context_length(const moert_runtime* runtime,
                                                    int32_t* context_length);

/** Loads a vision projector for the loaded model: llama.cpp's clip GGUF of a MiniCPM-V
 * model (llama.cpp's --mmproj; versions 2, 3 and 4). The model's sessions take images
 * from then on (moert_session_add_image). MOERT_FAILED_PRECONDITION without a model;
 * MOERT_INVALID_ARGUMENT naming the key or tensor at fault, another projector type, or
 * a projection width that is not the model's n_embd. */
MOERT_API moert_status moert_runtime_load_mmproj(moert_runtime* runtime, const char* path);

/** Creates a session on the loaded model; MOERT_FAILED_PRECONDITION when no model
 * is loaded. */
MOERT_API moert_status moert_session_create(moert_runtime* runtime, moert_session** session);

/** As moert_session_create() with a KV cache of `context_length` positions (0: the
 * runtime's, moert_runtime_context_length()). Every session's cache is reserved in the
 * memory budget in full: MOERT_RESOURCE_EXHAUSTED, naming the numbers, when it does not
 * fit (see moert_runtime_set_session_pool_shrink()); MOERT_INVALID_ARGUMENT for a
 * negative length. */
MOERT_API moert_status moert_session_create_with_context(moert_runtime* runtime,
                                                         int32_t context_length,
                                                         moert_session** session);

/** Destroys a session (NULL is ignored). */
MOERT_API void moert_session_destroy(moert_session* session);

/** As moert_last_error(), for a session; NULL gives "". Never NULL. */
MOERT_API const char* moert_session_last_error(const moert_session* session);

/** Appends a message to the session's history without generating (a system prompt,
 * or earlier turns). */
MOERT_API moert_status moert_session_add_message(moert_session* session, const char* role,
                                                 const char* content);

/** Adds a PNG or JPEG file to the session's next generation: with a raw prompt, that
 * generation is one user turn laid out as llama.cpp's minicpmv-cli builds it (the
 * image's slices, then the prompt); with messages, the image joins the last user
 * message. The image is decoded now: a bad one is an error naming what is wrong and
 * nothing is added. MOERT_FAILED_PRECONDITION when no vision projector is loaded. */
MOERT_API moert_status moert_session_add_image(moert_session* session, const char* path);

/** As moert_session_add_image, for the `size` bytes of a PNG or JPEG held in memory
 * (copied). */
MOERT_API moert_status moert_session_add_image_bytes(moert_session* session, const uint8_t* data,
                                                     size_t size);

/** As moert_session_add_image, for decoded RGB8 pixels: `height` rows of width * 3
 * bytes, row y at pixels + y * stride_bytes (0: width * 3); copied. */
MOERT_API moert_status moert_session_add_image_rgb8(moert_session* session, const uint8_t* pixels,
                                                    int32_t width, int32_t height,
                                                    size_t stride_bytes);

/** Generates a continuation for `params`, streaming it to `callback` (may be NULL).
 * Only the tokens the session's KV cache does not hold yet are evaluated. A bad
 * request leaves the session unchanged. */
MOERT_API moert_status moert_session_generate(moert_session* session,
                                              const moert_generate_params* params,
                                              moert_token_callback callback, void* user_data);

/** Asks the generation running on `session` to stop before its next step (it then
 * returns MOERT_CANCELLED); safe to call from any thread. A cancel while no
 * generation runs is forgotten when the next one starts. */
MOERT_API moert_status moert_session_cancel(moert_session* session);

/** Forgets the session's history and KV cache. */
MOERT_API moert_status moert_session_reset(moert_session* session);

/** The figures of the session's last generation. */
MOERT_API moert_status moert_session_stats(const moert_session* session, moert_stats* stats);

/** Sets the memory budget of the models `runtime` loads from now on: everything a
 * model may hold, in bytes (the weights outside the expert pool, the KV cache, scratch
 * and the pool, which gets the rest unless sized by the next two functions). Setting
 * a budget or a pool keeps a mixture-of-experts model's routed experts in a pool: each
 * is read from the file when a token needs it and evicted when the pool is full; the
 * output is bit for bit that of fully resident experts. Loading then fails with
 * MOERT_RESOURCE_EXHAUSTED, naming the numbers, when the weights outside the pool do
 * not fit or the pool cannot hold the experts one token needs. 0 (the default): no
 * budget. MOERT_INVALID_ARGUMENT for a negative value. */
MOERT_API moert_status moert_runtime_set_memory_budget(moert_runtime* runtime, int64_t bytes);

/** Sets the expert pool's size in bytes for the models loaded from now on; 0 (the
 * default): from the fraction or the budget. MOERT_INVALID_ARGUMENT if negative. */
MOERT_API moert_status moert_runtime_set_expert_pool_bytes(moert_runtime* runtime, int64_t bytes);

/** Sets the expert pool as a fraction in (0, 1] of what all routed experts take in it
 * (1: every expert fits) for the models loaded from now on; 0 (the default): unset.
 * MOERT_INVALID_ARGUMENT outside [0, 1]. */
MOERT_API moert_status moert_runtime_set_expert_pool_fraction(moert_runtime* runtime,
                                                              double fraction);

/** Sets how experts are read (default MOERT_IO_DIRECT) for the models loaded from now
 * on. MOERT_INVALID_ARGUMENT for an unknown mode. */
MOERT_API moert_status moert_runtime_set_io_mode(moert_runtime* runtime, moert_io_mode mode);

/** Turns the hot set on (non-zero, the default) or off for the models loaded from now
 * on: with an expert pool, the most used experts are written beside the model file
 * (MODEL.gguf.moert-hot) when a session ends and when the model is unloaded, and
 * loaded first at the next start. */
MOERT_API moert_status moert_runtime_set_hot_set(moert_runtime* runtime, int enabled);

/** For the models loaded from now on: where moert keeps files between runs (the hot
 * set, OpenCL program binaries), made when first written; an Android app passes its
 * cache directory. NULL or "": $XDG_CACHE_HOME/moert, else $HOME/.cache/moert (with
 * neither, no hot set). Nothing is written beside the model. */
MOERT_API moert_status moert_runtime_set_cache_dir(moert_runtime* runtime, const char* dir);

/** For the models loaded from now on: mlock the weights outside the expert pool
 * (non-zero `enabled`; llama.cpp's --mlock), best effort: a lock the system refuses
 * leaves them unlocked. Off by default. */
MOERT_API moert_status moert_runtime_set_mlock(moert_runtime* runtime, int enabled);

/** For the models loaded from now on: the inference guard (non-zero `enabled`, the
 * default): a step that fails with exhaustion, an I/O error, a timeout or a lost device
 * is retried degraded before the generation fails, and moert_stats::degraded says so
 * (docs/degrade.md). A generation that succeeds first time is unchanged by it. */
MOERT_API moert_status moert_runtime_set_inference_guard(moert_runtime* runtime, int enabled);

/** For the models loaded from now on: the degrade policy's rules, evaluated after every
 * step (non-zero `enabled`; off by default: a firing rule may change the output), from
 * `rules_path` (NULL or "": the default rules; docs/degrade.md gives the format). A bad
 * rules file fails moert_runtime_load_model, naming the line and what is wrong. */
MOERT_API moert_status moert_runtime_set_degrade_policy(moert_runtime* runtime, int enabled,
                                                        const char* rules_path);

/** For the models loaded from now on: the longest a step waits for the loader thread,
 * in milliseconds (default 1000); past it the step reads the expert itself and counts
 * the timeout. MOERT_INVALID_ARGUMENT below 1. */
MOERT_API moert_status moert_runtime_set_loader_deadline(moert_runtime* runtime, int32_t ms);

/** Writes the loaded model's hot set now (MOERT_OK and nothing written without an
 * expert pool or with the hot set off). MOERT_FAILED_PRECONDITION when no model is
 * loaded. */
MOERT_API moert_status moert_runtime_save_hot_set(moert_runtime* runtime);

/** For the models loaded from now on: a session whose KV cache does not fit what the
 * memory budget has left takes the bytes from the expert pool (non-zero `enabled`),
 * down to `floor_bytes` (0: the experts of one token in every layer), instead of failing
 * with MOERT_RESOURCE_EXHAUSTED (0, the default). The pool grows back as sessions end.
 * MOERT_INVALID_ARGUMENT for a negative floor. */
MOERT_API moert_status moert_runtime_set_session_pool_shrink(moert_runtime* runtime, int enabled,
                                                             int64_t floor_bytes);

/** Gives memory back, as Android's ComponentCallbacks2.onTrimMemory(level) asks: pass
 * the app's level through. 5 (running moderate): the expert pool to 75%; 10 (running
 * low) and 20 (UI hidden): to 50%, and experts a hot-set preload brought in unused are
 * evicted; 15 (running critical), 40 (background) and 60 (moderate): the pool to its
 * floor; 80 (complete): also the KV caches of sessions not generating are freed (their
 * next request evaluates their context again, with the same output). Other values: the
 * nearest level below. 0: lift the cap. The pool shrinks at once when no step runs,
 * else before the next step; routing reads the level as device memory pressure. Any
 * thread; it does not change moert_last_error() on success. MOERT_INVALID_ARGUMENT for
 * a negative level. */
MOERT_API moert_status moert_runtime_trim(moert_runtime* runtime, int32_t level);

/** The memory figures of the session's last generation. */
MOERT_API moert_status moert_session_memory_stats(const moert_session* session,
                                                  moert_memory_stats* stats);

/** Routing of mixture-of-experts models, for the models loaded from now on. While the
 * experts tokens want fit in the expert pool, routing is the model's own, bit for bit.
 * Under memory pressure a non-resident expert's gate logit is lowered by alpha times the
 * pressure (in [0, 1]), so resident experts are preferred; 0 turns that off (default 1).
 * MOERT_INVALID_ARGUMENT for a negative or non-finite alpha. */
MOERT_API moert_status moert_runtime_set_router_alpha(moert_runtime* runtime, float alpha);

/** Dynamic top-k: each token takes the fewest experts whose routing probabilities sum
 * to at least p (at most the model's k); 0 (the default): off. MOERT_INVALID_ARGUMENT
 * outside [0, 1]. */
MOERT_API moert_status moert_runtime_set_dynamic_k(moert_runtime* runtime, float p);

/** Above this CPU temperature in degrees Celsius each token takes one expert fewer
 * (never fewer than one); 0 (the default): no limit. MOERT_INVALID_ARGUMENT if
 * negative. */
MOERT_API moert_status moert_runtime_set_thermal_limit(moert_runtime* runtime, float celsius);

/** The device temperature as the host app reads it (phones often forbid reading
 * /sys/class/thermal); NaN: back to sysfs. Applies now and to later loads; may be
 * called from any thread. */
MOERT_API moert_status moert_runtime_set_temperature(moert_runtime* runtime, float celsius);

/** Prefetch of predicted experts, with an expert pool, for the models loaded from now
 * on: while a layer's experts compute, the experts the router of the layer `depth`
 * ahead predicts are read. On (1, depth 1) by default. MOERT_INVALID_ARGUMENT for depth < 1
 * (and, at load, for a depth past the model's last layer). */
MOERT_API moert_status moert_runtime_set_prefetch(moert_runtime* runtime, int enabled, int depth);

/** Sets the backend of the models loaded from now on (default MOERT_BACKEND_CPU).
 * With MOERT_BACKEND_OPENCL, loading fails with MOERT_FAILED_PRECONDITION naming why
 * when no OpenCL device is usable, and with MOERT_UNIMPLEMENTED for a model the device
 * path cannot run (an expert pool); MOERT_BACKEND_AUTO then runs on the CPU.
 * MOERT_INVALID_ARGUMENT for an unknown value. */
MOERT_API moert_status moert_runtime_set_backend(moert_runtime* runtime, moert_backend backend);

/** The runtime's metrics (every model it loaded and their sessions: expert loads, bytes
 * read, stall time, pool state, router latency, prefill and decode tokens and time, ...)
 * in the Prometheus text exposition format 0.0.4, as snprintf writes: at most `len`
 * bytes including the terminating NUL go to `buf` (NULL with len 0: nothing written,
 * to learn the size). Returns the text's full length without the NUL (a return >= len
 * means it was cut short), or a negative moert_status on error (-MOERT_INVALID_ARGUMENT
 * for a NULL runtime, or a NULL buf with len > 0). May be called from any thread.
 * docs/telemetry.md lists the metrics. */
MOERT_API int64_t moert_runtime_metrics(const moert_runtime* runtime, char* buf, size_t len);

/** Log levels of moert_set_log_callback(). */
typedef enum moert_log_level {
  MOERT_LOG_DEBUG = 0,
  MOERT_LOG_INFO = 1,
  MOERT_LOG_WARNING = 2,
  MOERT_LOG_ERROR = 3,
} moert_log_level;

/** Receives one log message (UTF-8, no trailing newline, valid during the call only) with
 * its moert_log_level, from any of the library's threads. */
typedef void (*moert_log_callback)(int level, const char* message, void* user_data);

/** Routes the library's log, process-wide, to `callback` (an Android app passes its
 * messages to logcat); NULL restores the default, which writes to stderr. Messages below
 * `min_level` (a moert_log_level) are dropped. MOERT_INVALID_ARGUMENT for a level out of
 * range. May be called from any thread; a message being delivered finishes on the old
 * callback. */
MOERT_API moert_status moert_set_log_callback(moert_log_callback callback, void* user_data,
                                              int min_level);

/** Trace spans (docs/tracing.md), process-wide: nonzero turns recording on, 0 off (the
 * default; off costs a relaxed load and a branch per span). Any thread. */
MOERT_API void moert_trace_enable(int enabled);
/** Drops every span recorded so far. */
MOERT_API void moert_trace_clear(void);
/** Writes every span recorded (each thread keeps its newest 32768) to `path` as Chrome
 * trace-event JSON, which ui.perfetto.dev opens; tracing may stay on. MOERT_INVALID_ARGUMENT
 * for a NULL or empty path; MOERT_INTERNAL when the file cannot be written, the reason
 * (naming the path) going to the log (moert_set_log_callback). Any thread. */
MOERT_API moert_status moert_trace_write(const char* path);

/* ---- App integration (Android, JNI): the ABI check, loading from an fd, model facts ---- */

/** The ABI these headers describe: raised whenever a public struct's layout or a
 * function's signature changes, so an app built against one header set can tell a
 * libmoert.so of another apart (MOERT_VERSION_* name the release). */
#define MOERT_ABI_VERSION 1

/** The MOERT_ABI_VERSION the linked library was built with. */
MOERT_API int32_t moert_abi_version(void);

/** Checks that the linked library has the ABI of the headers the caller was compiled
 * with: pass MOERT_ABI_VERSION (or use MOERT_CHECK_ABI()). MOERT_FAILED_PRECONDITION,
 * with moert_last_error(NULL) naming both versions, when they differ; call it before
 * anything else. */
MOERT_API moert_status moert_check_abi(int32_t header_abi_version);

/** moert_check_abi() with the including code's MOERT_ABI_VERSION. */
#define MOERT_CHECK_ABI() moert_check_abi(MOERT_ABI_VERSION)

/** As moert_runtime_load_model_cancellable, for the `length` bytes at `offset` of the
 * open file `fd` (`length` 0: to the end of the file): an Android asset stored
 * uncompressed in the APK, from AAsset_openFileDescriptor64() or Java's
 * AssetFileDescriptor (getParcelFileDescriptor().getFd(), getStartOffset(),
 * getLength()). Any offset, page-aligned or not. The fd stays the caller's (moert
 * opens the file again by the name it has under /proc/self/fd, so it must be a regular
 * file with a path). MOERT_INVALID_ARGUMENT for a negative fd, offset or length, an fd
 * that is not an open regular file, or a range past the end of the file. */
MOERT_API moert_status moert_runtime_load_model_fd(moert_runtime* runtime, int fd, int64_t offset,
                                                   int64_t length,
                                                   moert_cancellable_progress_callback progress,
                                                   void* user_data);

/** What moert_model_info() tells about the loaded model. The strings stay valid until
 * the next moert_model_info(), load or moert_runtime_destroy() on the runtime. */
typedef struct moert_model_details {
  const char* architecture;        /**< general.architecture, e.g. "qwen2moe" */
  const char* name;                /**< general.name ("" when absent) */
  int64_t parameters;              /**< weights in the file's tensors, every expert counted */
  int32_t layers;                  /**< transformer blocks */
  int32_t embedding_length;        /**< n_embd */
  int32_t experts;                 /**< routed experts per MoE layer (0: a dense model) */
  int32_t experts_used;            /**< experts each token takes (k) */
  int32_t vocab_size;              /**< tokens of the vocabulary */
  int32_t training_context_length; /**< the model's training context */
  int32_t context_length;          /**< KV positions each session gets */
  const char* chat_template;       /**< the template sessions use by default ("chatml", ...) */
  const char* backend;             /**< "CPU" or "OpenCL" */
  const char* device;              /**< the OpenCL device's name and type ("" on the CPU) */
  int64_t file_offset;             /**< where the model starts in its file (fd loads) */
  double load_ms;                  /**< how long the load took */
} moert_model_details;

/** Fills `info` with the loaded model's facts. MOERT_FAILED_PRECONDITION when no model
 * is loaded; MOERT_INVALID_ARGUMENT for a NULL argument. */
MOERT_API moert_status moert_model_info(moert_runtime* runtime, moert_model_details* info);

/* --- Repro bundles (docs/repro.md) ------------------------------------------------- */

/** Repro bundles for the models loaded from now on: with `on_error` non-zero a request
 * that fails (not one cancelled) writes one, with `on_degrade` one that ran degraded;
 * both into `dir` (NULL or "": CACHE_DIR/repro). `max_bytes` caps a bundle's file (0:
 * 5 MB); past it the KV cache, then the trace, are left out. Off by default.
 * MOERT_INVALID_ARGUMENT for a negative max_bytes. */
MOERT_API moert_status moert_runtime_set_repro(moert_runtime* runtime, int on_error,
                                               int on_degrade, const char* dir,
                                               int64_t max_bytes);

/** Writes a repro bundle of the session now to `path` (NULL or "": a new file under the
 * repro directory). When `written` is not NULL, the file's path goes there as snprintf
 * writes it (at most `written_len` bytes with the NUL). MOERT_FAILED_PRECONDITION when
 * no path is given and no repro directory is known; the error names the path when it
 * cannot be written. moert-replay re-runs the file. */
MOERT_API moert_status moert_session_write_repro(moert_session* session, const char* path,
                                                 char* written, size_t written_len);

/* --- Expert hot updates (docs/updates.md) ------------------------------------------ */

/** Sets the Ed25519 public key delta packages must be signed with: 64 hex digits, the
 * text of `moert-delta keygen`'s NAME.pub (a trailing newline is allowed); NULL or ""
 * clears it (every package is then refused). MOERT_INVALID_ARGUMENT for anything else.
 * Applies to the next moert_runtime_apply_update. */
MOERT_API moert_status moert_runtime_set_update_key(moert_runtime* runtime, const char* public_key_hex);

/** Applies the delta package at `package_path` (`moert-delta make`) to the loaded model
 * while it keeps answering: checks the signature and that the model file is the
 * package's base, writes the new model file crash-safely over the old one and puts the
 * new weights in between steps: the changed experts alone where only experts changed
 * (CPU), else the new file loaded whole (a step in flight finishes on the old weights;
 * each session's next step runs on the new ones). May be called from any thread, also while
 * sessions generate. On a refusal the model and its file stay as they were and
 * moert_last_error() names the reason: MOERT_FAILED_PRECONDITION (no model, no key, a
 * package of another base or one already applied, another update running),
 * MOERT_PERMISSION_DENIED (a bad signature), MOERT_DATA_LOSS (a truncated package, a
 * delta that decodes to the wrong checksum), MOERT_RESOURCE_EXHAUSTED (a full disk). */
MOERT_API moert_status moert_runtime_apply_update(moert_runtime* runtime, const char* package_path);

#ifdef __cplusplus
}
#endif

#endif /* MOERT_MOERT_H_ */
