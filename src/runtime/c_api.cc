// The C API (include/moert/moert.h) over moert::MoERuntime and moert::Session.
// Every entry point catches everything: no exception crosses into C.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moert/moert.h"
#include "moert/runtime.h"
#include "telemetry/platform.h"

struct moert_runtime {
  std::unique_ptr<moert::MoERuntime> runtime;
  std::string last_error;
  moert::ModelInfo info;  // what moert_model_details' strings point into
};

struct moert_session {
  std::unique_ptr<moert::Session> session;
  std::string last_error;
  std::atomic<bool> cancel{false};
  // What moert_stats::degrade_reason points to (the last moert_session_stats' copy).
  mutable std::string degrade_reason;
};

namespace {

using moert::StatusCode;

static_assert(MOERT_OK == static_cast<int>(StatusCode::kOk));
static_assert(MOERT_INVALID_ARGUMENT == static_cast<int>(StatusCode::kInvalidArgument));
static_assert(MOERT_NOT_FOUND == static_cast<int>(StatusCode::kNotFound));
static_assert(MOERT_OUT_OF_RANGE == static_cast<int>(StatusCode::kOutOfRange));
static_assert(MOERT_UNIMPLEMENTED == static_cast<int>(StatusCode::kUnimplemented));
static_assert(MOERT_CANCELLED == static_cast<int>(StatusCode::kCancelled));
static_assert(MOERT_INTERNAL == static_cast<int>(StatusCode::kInternal));
static_assert(MOERT_FAILED_PRECONDITION == static_cast<int>(StatusCode::kFailedPrecondition));
static_assert(MOERT_DATA_LOSS == static_cast<int>(StatusCode::kDataLoss));
static_assert(MOERT_RESOURCE_EXHAUSTED == static_cast<int>(StatusCode::kResourceExhausted));
static_assert(MOERT_PERMISSION_DENIED == static_cast<int>(StatusCode::kPermissionDenied));

// The error of calls made without a handle (moert_runtime_create, a NULL handle).
thread_local std::string g_last_error;

// Records `message` in `error_slot`, or in g_last_error when there is no handle.
moert_status Fail(std::string* error_slot, moert_status status, std::string message) {
  (error_slot != nullptr ? *error_slot : g_last_error) = std::move(message);
  return status;
}

moert_status Report(std::string* error_slot, const moert::Status& status) {
  if (status.ok()) {
    (error_slot != nullptr ? *error_slot : g_last_error).clear();
    return MOERT_OK;
  }
  return Fail(error_slot, static_cast<moert_status>(status.code()), status.message());
}

// Runs `body` (returning moert_status), turning any exception into an error.
template <typename Body>
moert_status Guard(std::string* error_slot, const char* function, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    try {
      return Fail(error_slot, MOERT_RESOURCE_EXHAUSTED, std::string(function) + ": out of memory");
    } catch (...) {
      return MOERT_RESOURCE_EXHAUSTED;
    }
  } catch (const std::exception& e) {
    try {
      return Fail(error_slot, MOERT_INTERNAL,
                  std::string(function) + ": unexpected exception: " + e.what());
    } catch (...) {
      return MOERT_INTERNAL;
    }
  } catch (...) {
    try {
      return Fail(error_slot, MOERT_INTERNAL, std::string(function) + ": unexpected exception");
    } catch (...) {
      return MOERT_INTERNAL;
    }
  }
}

moert_status NullArgument(std::string* error_slot, const char* function, const char* argument) {
  return Fail(error_slot, MOERT_INVALID_ARGUMENT,
              std::string(function) + ": " + argument + " is NULL");
}

moert_finish_reason FromFinish(moert::FinishReason reason) {
  switch (reason) {
    case moert::FinishReason::kNone:
      return MOERT_FINISH_NONE;
    case moert::FinishReason::kEndOfGeneration:
      return MOERT_FINISH_END_OF_GENERATION;
    case moert::FinishReason::kStopString:
      return MOERT_FINISH_STOP_STRING;
    case moert::FinishReason::kMaxTokens:
      return MOERT_FINISH_MAX_TOKENS;
    case moert::FinishReason::kCancelled:
      return MOERT_FINISH_CANCELLED;
    case moert::FinishReason::kContextFull:
      return MOERT_FINISH_CONTEXT_FULL;
  }
  return MOERT_FINISH_NONE;
}

// Changes one field of the runtime's options for the next load.
template <typename Change>
moert_status SetOption(moert_runtime* runtime, const char* function, Change&& change) {
  if (runtime == nullptr) return NullArgument(nullptr, function, "runtime");
  return Guard(&runtime->last_error, function, [&]() -> moert_status {
    moert::RuntimeOptions options = runtime->runtime->options();
    change(options);
    const moert::Status status = runtime->runtime->SetOptions(options);
    if (!status.ok()) {
      return Fail(&runtime->last_error, static_cast<moert_status>(status.code()),
                  std::string(function) + ": " + status.message());
    }
    runtime->last_error.clear();
    return MOERT_OK;
  });
}

}  // namespace

extern "C" {

const char* moert_status_string(moert_status status) {
  switch (status) {
    case MOERT_OK:
      return "MOERT_OK";
    case MOERT_INVALID_ARGUMENT:
      return "MOERT_INVALID_ARGUMENT";
    case MOERT_NOT_FOUND:
      return "MOERT_NOT_FOUND";
    case MOERT_OUT_OF_RANGE:
      return "MOERT_OUT_OF_RANGE";
    case MOERT_UNIMPLEMENTED:
      return "MOERT_UNIMPLEMENTED";
    case MOERT_CANCELLED:
      return "MOERT_CANCELLED";
    case MOERT_INTERNAL:
      return "MOERT_INTERNAL";
    case MOERT_FAILED_PRECONDITION:
      return "MOERT_FAILED_PRECONDITION";
    case MOERT_DATA_LOSS:
      return "MOERT_DATA_LOSS";
    case MOERT_RESOURCE_EXHAUSTED:
      return "MOERT_RESOURCE_EXHAUSTED";
    case MOERT_PERMISSION_DENIED:
      return "MOERT_PERMISSION_DENIED";
  }
  return "MOERT_UNKNOWN_STATUS";
}

void moert_runtime_options_default(moert_runtime_options* options) {
  if (options == nullptr) return;
  const moert::RuntimeOptions defaults;
  options->threads = defaults.threads;
  options->context_length = defaults.context_length;
}

void moert_generate_params_default(moert_generate_params* params) {
  if (params == nullptr) return;
  const moert::GenerateRequest defaults;
  params->prompt = nullptr;
  params->messages = nullptr;
  params->n_messages = 0;
  params->max_tokens = defaults.max_tokens;
  params->sampler.temperature = defaults.temperature;
  params->sampler.top_k = defaults.top_k;
  params->sampler.top_p = defaults.top_p;
  params->sampler.min_p = defaults.min_p;
  params->sampler.repeat_penalty = defaults.repeat_penalty;
  params->sampler.repeat_last_n = defaults.repeat_last_n;
  params->sampler.seed = defaults.seed;
  params->stop = nullptr;
  params->n_stop = 0;
  params->chat_template = nullptr;
  params->context_policy = MOERT_CONTEXT_ERROR;
  params->image_keep_ratio = defaults.image_keep_ratio;
  params->image_min_keep = defaults.image_min_keep;
}

moert_status moert_runtime_create(const moert_runtime_options* options, moert_runtime** runtime) {
  return Guard(&g_last_error, "moert_runtime_create", [&]() -> moert_status {
    if (runtime == nullptr) return NullArgument(&g_last_error, "moert_runtime_create", "runtime");
    *runtime = nullptr;
    moert::RuntimeOptions cpp_options;
    if (options != nullptr) {
      cpp_options.threads = options->threads;
      cpp_options.context_length = options->context_length;
    }
    auto handle = std::make_unique<moert_runtime>();
    const moert::Status status = moert::MoERuntime::Create(cpp_options, &handle->runtime);
    if (!status.ok()) return Report(&g_last_error, status);
    g_last_error.clear();
    *runtime = handle.release();
    return MOERT_OK;
  });
}

void moert_runtime_destroy(moert_runtime* runtime) {
  try {
    delete runtime;
  } catch (...) {
    // A destructor that throws would terminate anyway; nothing to report to.
  }
}

const char* moert_last_error(const moert_runtime* runtime) {
  return runtime != nullptr ? runtime->last_error.c_str() : g_last_error.c_str();
}

moert_status moert_runtime_load_model(moert_runtime* runtime, const char* path,
                                      moert_progress_callback progress, void* user_data) {
  constexpr char kName[] = "moert_runtime_load_model";
  if (runtime == nullptr) return NullArgument(nullptr, kName, "runtime");
  return Guard(&runtime->last_error, kName, [&]() -> moert_status {
    if (path == nullptr) return NullArgument(&runtime->last_error, kName, "path");
    moert::ProgressCallback callback;
    if (progress != nullptr) {
      callback = [progress, user_data](float fraction) { progress(fraction, user_data); };
    }
    return Report(&runtime->last_error, runtime->runtime->LoadModel(path, callback));
  });
}

moert_status moert_runtime_load_model_cancellable(moert_runtime* runtime, const char* path,
                                                  moert_cancellable_progress_callback progress,
                                                  void* user_data) {
  constexpr char kName[] = "moert_runtime_load_model_cancellable";
  if (runtime == nullptr) return NullArgument(nullptr, kName, "runtime");
  return Guard(&runtime->last_error, kName, [&]() -> moert_status {
    if (path == nullptr) return NullArgument(&runtime->last_error, kName, "path");
    moert::ProgressCallback callback;
    if (progress != nullptr) {
      callback = [progress, user_data](float fraction) { return progress(fraction, user_data) == 0; };
    }
    return Report(&runtime->last_error, runtime->runtime->LoadModel(path, callback));
  });
}

moert_status moert_runtime_context_length(const moert_runtime* runtime, int32_t* context_length) {
  constexpr char kName[] = "moert_runtime_context_length";
  if (runtime == nullptr) return NullArgument(nullptr, kName, "runtime");
  if (context_length == nullptr) return NullArgument(nullptr, kName, "context_length");
  try {
    if (!runtime->runtime->model_loaded()) return MOERT_FAILED_PRECONDITION;
    *context_length = runtime->runtime->model_info().context_length;
    return MOERT_OK;
  } catch (...) {
    return MOERT_INTERNAL;
  }
}

moert_status moert_session_create(moert_runtime* runtime, moert_session** session) {
  return moert_session_create_with_context(runtime, 0, session);
}

moert_status moert_session_create_with_context(moert_runtime* runtime, int32_t context_length,
                                               moert_session** session) {
  constexpr char kName[] = "moert_session_create";
  if (runtime == nullptr) return NullArgument(nullptr, kName, "runtime");
  return Guard(&runtime->last_error, kName, [&]() -> moert_status {
    if (session == nullptr) return NullArgument(&runtime->last_error, kName, "session");
    *session = nullptr;
    auto handle = std::make_unique<moert_session>();
    moert::SessionOptions options;
    options.context_length = context_length;
    const moert::Status status = runtime->runtime->CreateSession(options, &handle->session);
    if (!status.ok()) return Report(&runtime->last_error, status);
    runtime->last_error.clear();
    *session = handle.release();
    return MOERT_OK;
  });
}

void moert_session_destroy(moert_session* session) {
  try {
    delete session;
  } catch (...) {
    // As moert_runtime_destroy.
  }
}

const char* moert_session_last_error(const moert_session* session) {
  return session != nullptr ? session->last_error.c_str() : "";
}

moert_status moert_session_add_message(moert_session* session, const char* role,
                                       const char* content) {
  constexpr char kName[] = "moert_session_add_message";
  if (session == nullptr) return NullArgument(nullptr, kName, "session");
  return Guard(&session->last_error, kName, [&]() -> moert_status {
    if (role == nullptr) return NullArgument(&session->last_error, kName, "role");
    if (content == nullptr) return NullArgument(&session->last_error, kName, "content");
    return Report(&session->last_error, session->session->AddMessage(role, content));
  });
}

moert_status moert_runtime_load_mmproj(moert_runtime* runtime, const char* path) {
  constexpr char kName[] = "moert_runtime_load_mmproj";
  if (runtime == nullptr) return NullArgument(nullptr, kName, "runtime");
  return Guard(&runtime->last_error, kName, [&]() -> moert_status {
    if (path == nullptr) return NullArgument(&runtime->last_error, kName, "path");
    return Report(&runtime->last_error, runtime->runtime->LoadMmproj(path));
  });
}

moert_status moert_session_add_image(moert_session* session, const char* path) {
  constexpr char kName[] = "moert_session_add_image";
  if (session == nullptr) return NullArgument(nullptr, kName, "session");
  return Guard(&session->last_error, kName, [&]() -> moert_status {
    if (path == nullptr) return NullArgument(&session->last_error, kName, "path");
    return Report(&session->last_error, session->session->AddImage(moert::Image::FromFile(path)));
  });
}

moert_status moert_session_add_image_bytes(moert_session* session, const uint8_t* data,
                                           size_t size) {
  constexpr char kName[] = "moert_session_add_image_bytes";
  if (session == nullptr) return NullArgument(nullptr, kName, "session");
  return Guard(&session->last_error, kName, [&]() -> moert_status {
    if (data == nullptr) return NullArgument(&session->last_error, kName, "data");
    if (size == 0) {
      return Fail(&session->last_error, MOERT_INVALID_ARGUMENT,
                  std::string(kName) + ": size is 0 (no image bytes)");
    }
    return Report(&session->last_error, session->session->AddImage(moert::Image::FromEncoded(
                                            std::vector<uint8_t>(data, data + size))));
  });
}

moert_status moert_session_add_image_rgb8(moert_session* session, const uint8_t* pixels,
                                          int32_t width, int32_t height, size_t stride_bytes) {
  constexpr char kName[] = "moert_session_add_image_rgb8";
  if (session == nullptr) return NullArgument(nullptr, kName, "session");
  return Guard(&session->last_error, kName, [&]() -> moert_status {
    if (pixels == nullptr) return NullArgument(&session->last_error, kName, "pixels");
    return Report(&session->last_error,
                  session->session->AddImage(
                      moert::Image::FromRgb8(pixels, width, height, stride_bytes)));
  });
}

moert_status moert_session_generate(moert_session* session, const moert_generate_params* params,
                                    moert_token_callback callback, void* user_data) {
  constexpr char kName[] = "moert_session_generate";
  if (session == nullptr) return NullArgument(nullptr, kName, "session");
  return Guard(&session->last_error, kName, [&]() -> moert_status {
    std::string* error = &session->last_error;
    if (params == nullptr) return NullArgument(error, kName, "params");
    moert::GenerateRequest request;
    if (params->prompt != nullptr) request.prompt = params->prompt;
    if (params->n_messages > 0) {
      if (params->messages == nullptr) return NullArgument(error, kName, "params->messages");
      for (size_t i = 0; i < params->n_messages; ++i) {
        const moert_message& m = params->messages[i];
        if (m.role == nullptr || m.content == nullptr) {
          return Fail(error, MOERT_INVALID_ARGUMENT,
                      std::string(kName) + ": params->messages[" + std::to_string(i) +
                          "] has a NULL role or content");
        }
        request.messages.push_back({m.role, m.content});
      }
    }
    if (params->n_stop > 0) {
      if (params->stop == nullptr) return NullArgument(error, kName, "params->stop");
      for (size_t i = 0; i < params->n_stop; ++i) {
        if (params->stop[i] == nullptr) {
          return Fail(error, MOERT_INVALID_ARGUMENT,
                      std::string(kName) + ": params->stop[" + std::to_string(i) + "] is NULL");
        }
        request.stop.emplace_back(params->stop[i]);
      }
    }
    if (params->context_policy != MOERT_CONTEXT_ERROR &&
        params->context_policy != MOERT_CONTEXT_SLIDE) {
      return Fail(error, MOERT_INVALID_ARGUMENT,
                  std::string(kName) + ": unknown context_policy " +
                      std::to_string(static_cast<int>(params->context_policy)));
    }
    request.max_tokens = params->max_tokens;
    request.temperature = params->sampler.temperature;
    request.top_k = params->sampler.top_k;
    request.top_p = params->sampler.top_p;
    request.min_p = params->sampler.min_p;
    request.repeat_penalty = params->sampler.repeat_penalty;
    request.repeat_last_n = params->sampler.repeat_last_n;
    request.seed = params->sampler.seed;
    if (params->chat_template != nullptr) request.chat_template = params->chat_template;
    request.image_keep_ratio = params->image_keep_ratio;
    request.image_min_keep = params->image_min_keep;
    request.context_policy = params->context_policy == MOERT_CONTEXT_SLIDE
                                 ? moert::ContextPolicy::kSlide
                                 : moert::ContextPolicy::kError;
    session->cancel.store(false);
    request.cancel = &session->cancel;

    moert::TokenCallback on_token;
    if (callback != nullptr) {
      on_token = [callback, user_data](std::string_view piece, int32_t token) {
        const std::string text(piece);  // NUL-terminated
        return callback(text.c_str(), token, user_data) == 0;
      };
    }
    return Report(error, session->session->Generate(request, on_token));
  });
}

moert_status moert_session_cancel(moert_session* session) {
  if (session == nullptr) return NullArgument(nullptr, "moert_session_cancel", "session");
  session->cancel.store(true);
  return MOERT_OK;
}

moert_status moert_session_reset(moert_session* session) {
  constexpr char kName[] = "moert_session_reset";
  if (session == nullptr) return NullArgument(nullptr, kName, "session");
  return Guard(&session->last_error, kName, [&]() -> moert_status {
    session->session->Reset();
    session->last_error.clear();
    return MOERT_OK;
  });
}

moert_status moert_session_stats(const moert_session* session, moert_stats* stats) {
  constexpr char kName[] = "moert_session_stats";
  if (session == nullptr) return NullArgument(nullptr, kName, "session");
  if (stats == nullptr) return NullArgument(nullptr, kName, "stats");
  try {
    const moert::GenerationStats s = session->session->Stats();
    stats->prompt_tokens = s.prompt_tokens;
    stats->cached_tokens = s.cached_tokens;
    stats->prefill_tokens = s.prefill_tokens;
    stats->generated_tokens = s.generated_tokens;
    stats->context_slides = s.context_slides;
    stats->prefill_ms = s.prefill_ms;
    stats->decode_ms = s.decode_ms;
    stats->time_to_first_token_ms = s.time_to_first_token_ms;
    stats->prefill_tokens_per_second = s.prefill_tokens_per_second;
    stats->decode_tokens_per_second = s.decode_tokens_per_second;
    stats->peak_rss_bytes = s.peak_rss_bytes;
    stats->finish_reason = FromFinish(s.finish_reason);
    stats->average_experts_per_token = s.average_experts_per_token;
    stats->router_changed_fraction = s.router_changed_fraction;
    stats->images = s.images;
    stats->image_tokens = s.image_tokens;
    stats->image_encode_ms = s.image_encode_ms;
    stats->degraded = s.degraded ? 1 : 0;
    session->degrade_reason = s.degrade_reason;
    stats->degrade_reason = session->degrade_reason.c_str();
    stats->prefetch_precision = s.prefetch_precision;
    stats->prefetch_recall = s.prefetch_recall;
    stats->image_slices = s.image_slices;
    stats->image_share = s.image_share;
    return MOERT_OK;
  } catch (...) {
    return MOERT_INTERNAL;
  }
}

moert_status moert_runtime_set_router_alpha(moert_runtime* runtime, float alpha) {
  return SetOption(runtime, "moert_runtime_set_router_alpha",
                   [&](moert::RuntimeOptions& o) { o.router_alpha = alpha; });
}

moert_status moert_runtime_set_dynamic_k(moert_runtime* runtime, float p) {
  return SetOption(runtime, "moert_runtime_set_dynamic_k",
                   [&](moert::RuntimeOptions& o) { o.dynamic_k = p; });
}

moert_status moert_runtime_set_thermal_limit(moert_runtime* runtime, float celsius) {
  return SetOption(runtime, "moert_runtime_set_thermal_limit",
                   [&](moert::RuntimeOptions& o) { o.thermal_limit_c = celsius; });
}

moert_status moert_runtime_set_prefetch(moert_runtime* runtime, int enabled, int depth) {
  return SetOption(runtime, "moert_runtime_set_prefetch", [&](moert::RuntimeOptions& o) {
    o.prefetch = enabled != 0;
    o.prefetch_depth = depth;
  });
}

moert_status moert_runtime_set_temperature(moert_runtime* runtime, float celsius) {
  constexpr char kName[] = "moert_runtime_set_temperature";
  if (runtime == nullptr) return NullArgument(nullptr, kName, "runtime");
  // Any thread: it leaves the handle's last error alone (another thread may be in a
  // call that sets it).
  try {
    runtime->runtime->SetTemperature(celsius);
    return MOERT_OK;
  } catch (...) {
    return MOERT_INTERNAL;
  }
}

moert_status moert_runtime_set_session_pool_shrink(moert_runtime* runtime, int enabled,
                                                   int64_t floor_bytes) {
  return SetOption(runtime, "moert_runtime_set_session_pool_shrink", [&](moert::RuntimeOptions& o) {
    o.shrink_pool_for_sessions = enabled != 0;
    o.expert_pool_floor_bytes = floor_bytes;
  });
}

moert_status moert_runtime_trim(moert_runtime* runtime, int32_t level) {
  constexpr char kName[] = "moert_runtime_trim";
  if (runtime == nullptr) return NullArgument(nullptr, kName, "runtime");
  try {
    const moert::Status status = runtime->runtime->TrimMemory(level);
    // Any thread: an error goes to the calling thread's slot, never the handle's.
    return status.ok() ? MOERT_OK : Report(nullptr, status);
  } catch (...) {
    return MOERT_INTERNAL;
  }
}

moert_status moert_runtime_set_memory_budget(moert_runtime* runtime, int64_t bytes) {
  return SetOption(runtime, "moert_runtime_set_memory_budget",
                   [&](moert::RuntimeOptions& o) { o.memory_budget_bytes = bytes; });
}

moert_status moert_runtime_set_expert_pool_bytes(moert_runtime* runtime, int64_t bytes) {
  return SetOption(runtime, "moert_runtime_set_expert_pool_bytes",
                   [&](moert::RuntimeOptions& o) { o.expert_pool_bytes = bytes; });
}

moert_status moert_runtime_set_expert_pool_fraction(moert_runtime* runtime, double fraction) {
  return SetOption(runtime, "moert_runtime_set_expert_pool_fraction",
                   [&](moert::RuntimeOptions& o) { o.expert_pool_fraction = fraction; });
}

moert_status moert_runtime_set_io_mode(moert_runtime* runtime, moert_io_mode mode) {
  // A C caller may pass any int. Read it as an int: loading a value outside the C
  // enum's range through the enum type is undefined in C++ (UBSan flags it).
  int value = 0;
  static_assert(sizeof(value) == sizeof(mode), "moert_io_mode is an int");
  std::memcpy(&value, &mode, sizeof(value));
  return SetOption(runtime, "moert_runtime_set_io_mode", [&](moert::RuntimeOptions& o) {
    // An unknown value stays unknown, and SetOptions rejects it.
    o.io_mode = value == MOERT_IO_DIRECT     ? moert::IoMode::kDirect
                : value == MOERT_IO_BUFFERED ? moert::IoMode::kBuffered
                : value == MOERT_IO_MMAP     ? moert::IoMode::kMmap
                                             : static_cast<moert::IoMode>(value);
  });
}

moert_status moert_runtime_set_backend(moert_runtime* runtime, moert_backend backend) {
  int value = 0;  // read as an int, as moert_runtime_set_io_mode
  static_assert(sizeof(value) == sizeof(backend), "moert_backend is an int");
  std::memcpy(&value, &backend, sizeof(value));
  return SetOption(runtime, "moert_runtime_set_backend", [&](moert::RuntimeOptions& o) {
    o.backend = static_cast<moert::Backend>(value);  // SetOptions rejects an unknown one
  });
}

moert_status moert_runtime_set_hot_set(moert_runtime* runtime, int enabled) {
  return SetOption(runtime, "moert_runtime_set_hot_set",
                   [&](moert::RuntimeOptions& o) { o.hot_set = enabled != 0; });
}

moert_status moert_runtime_set_cache_dir(moert_runtime* runtime, const char* dir) {
  return SetOption(runtime, "moert_runtime_set_cache_dir", [&](moert::RuntimeOptions& o) {
    o.cache_dir = dir != nullptr ? dir : "";
  });
}

moert_status moert_runtime_set_mlock(moert_runtime* runtime, int enabled) {
  return SetOption(runtime, "moert_runtime_set_mlock",
                   [&](moert::RuntimeOptions& o) { o.lock_weights = enabled != 0; });
}

moert_status moert_runtime_set_inference_guard(moert_runtime* runtime, int enabled) {
  return SetOption(runtime, "moert_runtime_set_inference_guard",
                   [&](moert::RuntimeOptions& o) { o.inference_guard = enabled != 0; });
}

moert_status moert_runtime_set_degrade_policy(moert_runtime* runtime, int enabled,
                                              const char* rules_path) {
  return SetOption(runtime, "moert_runtime_set_degrade_policy", [&](moert::RuntimeOptions& o) {
    o.degrade_policy = enabled != 0;
    o.degrade_rules_path = rules_path != nullptr ? rules_path : "";
  });
}

moert_status moert_runtime_set_loader_deadline(moert_runtime* runtime, int32_t ms) {
  return SetOption(runtime, "moert_runtime_set_loader_deadline",
                   [&](moert::RuntimeOptions& o) { o.loader_wait_deadline_ms = ms; });
}

moert_status moert_runtime_save_hot_set(moert_runtime* runtime) {
  constexpr char kName[] = "moert_runtime_save_hot_set";
  if (runtime == nullptr) return NullArgument(nullptr, kName, "runtime");
  return Guard(&runtime->last_error, kName, [&]() -> moert_status {
    return Report(&runtime->last_error, runtime->runtime->SaveHotSet());
  });
}

moert_status moert_session_memory_stats(const moert_session* session, moert_memory_stats* stats) {
  constexpr char kName[] = "moert_session_memory_stats";
  if (session == nullptr) return NullArgument(nullptr, kName, "session");
  if (stats == nullptr) return NullArgument(nullptr, kName, "stats");
  try {
    const moert::GenerationStats s = session->session->Stats();
    stats->budget_bytes = s.budget_bytes;
    stats->expert_pool_bytes = s.expert_pool_bytes;
    stats->expert_pool_used_bytes = s.expert_pool_used_bytes;
    stats->expert_pool_free_bytes = s.expert_pool_free_bytes;
    stats->expert_pool_fragmentation = s.expert_pool_fragmentation;
    stats->expert_hit_rate = s.expert_hit_rate;
    stats->expert_bytes_read_per_token = s.expert_bytes_read_per_token;
    stats->expert_stall_ms_per_token = s.expert_stall_ms_per_token;
    stats->peak_rss_bytes = s.peak_rss_bytes;
    stats->kv_cache_bytes = s.kv_cache_bytes;
    stats->kv_reserved_bytes = s.kv_reserved_bytes;
    stats->kv_caches = s.kv_caches;
    return MOERT_OK;
  } catch (...) {
    return MOERT_INTERNAL;
  }
}

int64_t moert_runtime_metrics(const moert_runtime* runtime, char* buf, size_t len) {
  if (runtime == nullptr || (buf == nullptr && len > 0)) return -MOERT_INVALID_ARGUMENT;
  try {
    const std::string text = runtime->runtime->Metrics();
    if (len > 0) {
      const size_t n = std::min(text.size(), len - 1);
      std::memcpy(buf, text.data(), n);
      buf[n] = '\0';
    }
    return static_cast<int64_t>(text.size());
  } catch (...) {
    return -MOERT_INTERNAL;
  }
}

moert_status moert_set_log_callback(moert_log_callback callback, void* user_data, int min_level) {
  if (min_level < MOERT_LOG_DEBUG || min_level > MOERT_LOG_ERROR) return MOERT_INVALID_ARGUMENT;
  try {
    namespace telemetry = moert::telemetry;
    telemetry::SetMinLogLevel(static_cast<telemetry::LogLevel>(min_level));
    if (callback == nullptr) {
      telemetry::SetLogSink(nullptr);
    } else {
      telemetry::SetLogSink([callback, user_data](telemetry::LogLevel level,
                                                  std::string_view message) {
        const std::string text(message);  // NUL-terminated for C
        callback(static_cast<int>(level), text.c_str(), user_data);
      });
    }
    return MOERT_OK;
  } catch (...) {
    return MOERT_INTERNAL;
  }
}

void moert_trace_enable(int enabled) { moert::SetTracing(enabled != 0); }

void moert_trace_clear(void) { moert::ClearTrace(); }

moert_status moert_trace_write(const char* path) {
  if (path == nullptr || path[0] == '\0') return MOERT_INVALID_ARGUMENT;
  try {
    const moert::Status status = moert::WriteTrace(path);
    if (!status.ok()) {
      moert::telemetry::Log(moert::telemetry::LogLevel::kError,
                            "moert_trace_write: " + status.message());
    }
    return static_cast<moert_status>(status.code());
  } catch (...) {
    return MOERT_INTERNAL;
  }
}

// ---- App integration (Android, JNI): the ABI check, loading from an fd, model facts ----

int32_t moert_abi_version(void) { return MOERT_ABI_VERSION; }

moert_status moert_check_abi(int32_t header_abi_version) {
  if (header_abi_version == MOERT_ABI_VERSION) {
    g_last_error.clear();
    return MOERT_OK;
  }
  try {
    return Fail(nullptr, MOERT_FAILED_PRECONDITION,
                "moert_check_abi: the headers have ABI version " +
                    std::to_string(header_abi_version) + " but libmoert " MOERT_VERSION_STRING
                    " has ABI version " + std::to_string(MOERT_ABI_VERSION) +
                    ": rebuild against the library's headers");
  } catch (...) {
    return MOERT_FAILED_PRECONDITION;
  }
}

moert_status moert_runtime_load_model_fd(moert_runtime* runtime, int fd, int64_t offset,
                                         int64_t length,
                                         moert_cancellable_progress_callback progress,
                                         void* user_data) {
  constexpr char kName[] = "moert_runtime_load_model_fd";
  if (runtime == nullptr) return NullArgument(nullptr, kName, "runtime");
  return Guard(&runtime->last_error, kName, [&]() -> moert_status {
    moert::ProgressCallback callback;
    if (progress != nullptr) {
      callback = [progress, user_data](float fraction) { return progress(fraction, user_data) == 0; };
    }
    return Report(&runtime->last_error,
                  runtime->runtime->LoadModelFromFd(fd, offset, length, callback));
  });
}

moert_status moert_model_info(moert_runtime* runtime, moert_model_details* info) {
  constexpr char kName[] = "moert_model_info";
  if (runtime == nullptr) return NullArgument(nullptr, kName, "runtime");
  return Guard(&runtime->last_error, kName, [&]() -> moert_status {
    if (info == nullptr) return NullArgument(&runtime->last_error, kName, "info");
    if (!runtime->runtime->model_loaded()) {
      return Fail(&runtime->last_error, MOERT_FAILED_PRECONDITION,
                  std::string(kName) + ": no model is loaded");
    }
    runtime->info = runtime->runtime->model_info();
    const moert::ModelInfo& m = runtime->info;
    info->architecture = m.architecture.c_str();
    info->name = m.name.c_str();
    info->parameters = m.parameters;
    info->layers = m.layers;
    info->embedding_length = m.embedding_length;
    info->experts = m.experts;
    info->experts_used = m.experts_used;
    info->vocab_size = m.vocab_size;
    info->training_context_length = m.training_context_length;
    info->context_length = m.context_length;
    info->chat_template = m.chat_template.c_str();
    info->backend = m.backend.c_str();
    info->device = m.device.c_str();
    info->file_offset = m.file_offset;
    info->load_ms = m.load_ms;
    runtime->last_error.clear();
    return MOERT_OK;
  });
}

// --- Repro bundles (docs/repro.md) ---------------------------------------------------

moert_status moert_runtime_set_repro(moert_runtime* runtime, int on_error, int on_degrade,
                                     const char* dir, int64_t max_bytes) {
  return SetOption(runtime, "moert_runtime_set_repro", [&](moert::RuntimeOptions& o) {
    o.repro_on_error = on_error != 0;
    o.repro_on_degrade = on_degrade != 0;
    o.repro_dir = dir != nullptr ? dir : "";
    o.repro_max_bytes = max_bytes;
  });
}

moert_status moert_session_write_repro(moert_session* session, const char* path, char* written,
                                       size_t written_len) {
  constexpr char kName[] = "moert_session_write_repro";
  if (session == nullptr) return NullArgument(nullptr, kName, "session");
  return Guard(&session->last_error, kName, [&]() -> moert_status {
    std::string target;
    const moert::Status status = session->session->WriteRepro(path != nullptr ? path : "", &target);
    if (!status.ok()) return Report(&session->last_error, status);
    if (written != nullptr && written_len > 0) {
      const size_t n = std::min(target.size(), written_len - 1);
      std::memcpy(written, target.data(), n);
      written[n] = '\0';
    }
    session->last_error.clear();
    return MOERT_OK;
  });
}

// --- Expert hot updates.

moert_status moert_runtime_set_update_key(moert_runtime* runtime, const char* public_key_hex) {
  constexpr char kName[] = "moert_runtime_set_update_key";
  if (runtime == nullptr) return NullArgument(nullptr, kName, "runtime");
  return Guard(&runtime->last_error, kName, [&]() -> moert_status {
    moert::RuntimeOptions options = runtime->runtime->options();
    options.update_public_key = public_key_hex != nullptr ? public_key_hex : "";
    return Report(&runtime->last_error, runtime->runtime->SetOptions(options));
  });
}

moert_status moert_runtime_apply_update(moert_runtime* runtime, const char* package_path) {
  constexpr char kName[] = "moert_runtime_apply_update";
  if (runtime == nullptr) return NullArgument(nullptr, kName, "runtime");
  if (package_path == nullptr) return NullArgument(&runtime->last_error, kName, "package_path");
  return Guard(&runtime->last_error, kName, [&]() -> moert_status {
    return Report(&runtime->last_error, runtime->runtime->ApplyUpdate(package_path));
  });
}

}  // extern "C"
