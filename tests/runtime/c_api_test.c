/* The C API end to end, compiled as C and linked against the shared library only,
 * so it proves the exported symbols suffice: options, create, load with progress,
 * a session, greedy generation of llama.cpp's reference continuation (checked id by
 * id in the callback), cancel through the callback, error paths (NULL arguments, a
 * bad file, bad requests) with their status codes and messages, stats, destroy.
 * Usage: c_api_test SHARED_DIR (the folder with models/ and vocab/). */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moert/moert.h"

static int g_failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                            \
    }                                                                          \
  } while (0)

#define CHECK_STATUS(expr, expected)                                                 \
  do {                                                                               \
    moert_status check_status_ = (expr);                                             \
    if (check_status_ != (expected)) {                                               \
      fprintf(stderr, "%s:%d: %s gave %s, expected %s\n", __FILE__, __LINE__, #expr, \
              moert_status_string(check_status_), moert_status_string(expected));    \
      ++g_failures;                                                                  \
    }                                                                                \
  } while (0)

/* REFERENCE.md: greedy 32-token continuation of "ROMEO:". */
static const int32_t kGreedyIds[32] = {13,  2010, 270,  1999, 275,  2014, 277,  309, 261,  271, 584,
                                       260, 1992, 1999, 302,  1999, 13,   2012, 260, 1992, 275, 369,
                                       822, 261,  292,  393,  2014, 1995, 1999, 13,  2010, 270};
static const char kGreedyText[] =
    "\nAnd, I'll be a breathen, and,\nThen I have been a pain'd,\nAnd";

typedef struct {
  int calls;
  float first;
  float last;
  int monotonic;
} progress_state;

static void on_progress(float progress, void* user_data) {
  progress_state* state = (progress_state*)user_data;
  if (state->calls == 0) state->first = progress;
  if (state->calls > 0 && progress < state->last) state->monotonic = 0;
  state->last = progress;
  ++state->calls;
}

typedef struct {
  int32_t ids[64];
  int n_ids;
  int mismatches;
  char text[1024];
  size_t text_len;
  int cancel_after; /* 0: never */
} token_state;

static int on_token(const char* piece, int32_t token, void* user_data) {
  token_state* state = (token_state*)user_data;
  size_t len = strlen(piece);
  if (state->text_len + len < sizeof(state->text)) {
    memcpy(state->text + state->text_len, piece, len + 1);
    state->text_len += len;
  }
  if (token >= 0) {
    if (state->n_ids < 32 && kGreedyIds[state->n_ids] != token) ++state->mismatches;
    if (state->n_ids < 64) state->ids[state->n_ids] = token;
    ++state->n_ids;
    if (state->cancel_after > 0 && state->n_ids >= state->cancel_after) return 1;
  }
  return 0;
}

typedef struct {
  int calls;
  int min_level_seen;
  char last[256];
} log_state;

static void on_log(int level, const char* message, void* user_data) {
  log_state* state = (log_state*)user_data;
  ++state->calls;
  if (level < state->min_level_seen) state->min_level_seen = level;
  strncpy(state->last, message, sizeof(state->last) - 1);
  state->last[sizeof(state->last) - 1] = '\0';
}

static void reset_tokens(token_state* state, int cancel_after) {
  memset(state, 0, sizeof(*state));
  state->cancel_after = cancel_after;
}

/* ---- App integration: the ABI check, a model inside a bigger file by fd, model facts ---- */

static int cancel_at_half(float progress, void* user_data) {
  int* calls = (int*)user_data;
  ++*calls;
  return progress >= 0.5f;
}

/* Greedy "ROMEO:" (32 tokens) on a fresh session of `runtime` into `ids`; returns how
 * many tokens came, -1 on an error. */
static int greedy_ids(moert_runtime* runtime, int32_t* ids, char* text, size_t text_size) {
  moert_session* session = NULL;
  moert_generate_params params;
  token_state tokens;
  int n;
  if (moert_session_create(runtime, &session) != MOERT_OK) return -1;
  moert_generate_params_default(&params);
  params.prompt = "ROMEO:";
  params.max_tokens = 32;
  params.sampler.temperature = 0.0f;
  reset_tokens(&tokens, 0);
  n = moert_session_generate(session, &params, on_token, &tokens) == MOERT_OK ? tokens.n_ids : -1;
  if (n > 0) memcpy(ids, tokens.ids, sizeof(int32_t) * (size_t)(n < 32 ? n : 32));
  snprintf(text, text_size, "%s", tokens.text);
  moert_session_destroy(session);
  return n;
}

/* 1 when greedy "ROMEO:" on `runtime` is the f32 model's reference continuation. */
static int greedy_is_reference(moert_runtime* runtime) {
  int32_t ids[32];
  char text[1024];
  return greedy_ids(runtime, ids, text, sizeof(text)) == 32 &&
         memcmp(ids, kGreedyIds, sizeof(ids)) == 0 && strcmp(text, kGreedyText) == 0;
}

/* Writes `prefix` bytes, the model, `suffix` bytes to a new file (as an APK holds an
 * uncompressed asset); returns the model's size, or 0. */
static long embed_model(const char* model_path, const char* apk_path, long prefix, long suffix) {
  FILE* in = fopen(model_path, "rb");
  FILE* out = fopen(apk_path, "wb");
  long size = 0;
  long i;
  char buf[65536];
  size_t n;
  if (in == NULL || out == NULL) {
    if (in != NULL) fclose(in);
    if (out != NULL) fclose(out);
    return 0;
  }
  for (i = 0; i < prefix; ++i) fputc((int)(i * 7 + 3) & 0xFF, out);
  while ((n = fread(buf, 1, sizeof(buf), in)) > 0) {
    fwrite(buf, 1, n, out);
    size += (long)n;
  }
  for (i = 0; i < suffix; ++i) fputc('Z', out);
  fclose(in);
  if (fclose(out) != 0) return 0;
  return size;
}

static void check_app_integration(const char* model_path, const char* q8_path) {
  const long prefix = 3 * 4096 + 1234; /* not page-aligned, nor 4 KiB-aligned */
  const moert_io_mode modes[3] = {MOERT_IO_DIRECT, MOERT_IO_BUFFERED, MOERT_IO_MMAP};
  char apk_path[4096];
  char q8_apk_path[4096];
  const char* tmp = getenv("TMPDIR");
  moert_runtime* runtime = NULL;
  moert_model_details info;
  long model_size;
  int fd;
  int calls = 0;
  int m;

  /* The ABI check. */
  CHECK(moert_abi_version() == MOERT_ABI_VERSION);
  CHECK_STATUS(MOERT_CHECK_ABI(), MOERT_OK);
  CHECK_STATUS(moert_check_abi(MOERT_ABI_VERSION + 1), MOERT_FAILED_PRECONDITION);
  CHECK(strstr(moert_last_error(NULL), "ABI version") != NULL);

  snprintf(apk_path, sizeof(apk_path), "%s/moert-c-api-apk-%ld.bin",
           tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp", (long)getpid());
  snprintf(q8_apk_path, sizeof(q8_apk_path), "%s/moert-c-api-apk-q8-%ld.bin",
           tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp", (long)getpid());
  model_size = embed_model(model_path, apk_path, prefix, 777);
  CHECK(model_size > 0);
  fd = open(apk_path, O_RDONLY);
  CHECK(fd >= 0);
  if (model_size <= 0 || fd < 0) return;

  CHECK_STATUS(moert_runtime_create(NULL, &runtime), MOERT_OK);
  if (runtime == NULL) return;
  CHECK_STATUS(moert_model_info(NULL, &info), MOERT_INVALID_ARGUMENT);
  CHECK_STATUS(moert_model_info(runtime, NULL), MOERT_INVALID_ARGUMENT);
  CHECK_STATUS(moert_model_info(runtime, &info), MOERT_FAILED_PRECONDITION);
  CHECK(strstr(moert_last_error(runtime), "no model") != NULL);

  /* Bad arguments: a clear error, and the runtime stays usable. */
  CHECK_STATUS(moert_runtime_load_model_fd(NULL, fd, prefix, model_size, NULL, NULL),
               MOERT_INVALID_ARGUMENT);
  CHECK_STATUS(moert_runtime_load_model_fd(runtime, -1, 0, 0, NULL, NULL), MOERT_INVALID_ARGUMENT);
  CHECK(strstr(moert_last_error(runtime), "negative") != NULL);
  CHECK_STATUS(moert_runtime_load_model_fd(runtime, fd, prefix, model_size + 778, NULL, NULL),
               MOERT_INVALID_ARGUMENT);
  CHECK(strstr(moert_last_error(runtime), "offset") != NULL);
  CHECK(strstr(moert_last_error(runtime), apk_path) != NULL);
  /* The wrong offset: not a GGUF there. */
  CHECK(moert_runtime_load_model_fd(runtime, fd, prefix - 1, model_size, NULL, NULL) != MOERT_OK);
  CHECK(strstr(moert_last_error(runtime), apk_path) != NULL);
  /* A cancelled load. */
  CHECK_STATUS(moert_runtime_load_model_fd(runtime, fd, prefix, model_size, cancel_at_half, &calls),
               MOERT_CANCELLED);
  CHECK(calls >= 1);
  CHECK_STATUS(moert_model_info(runtime, &info), MOERT_FAILED_PRECONDITION);

  /* Resident, then from an expert pool in each I/O mode (the loader's reads add the
   * offset): the reference continuation, as when loaded by path. */
  CHECK_STATUS(moert_runtime_load_model_fd(runtime, fd, prefix, model_size, NULL, NULL), MOERT_OK);
  CHECK(greedy_is_reference(runtime));
  CHECK_STATUS(moert_model_info(runtime, &info), MOERT_OK);
  CHECK(strcmp(moert_last_error(runtime), "") == 0);
  CHECK(info.file_offset == prefix);
  CHECK(info.architecture != NULL && info.architecture[0] != '\0');
  CHECK(strcmp(info.backend, "CPU") == 0 && info.device != NULL);
  CHECK(info.experts > 1 && info.experts_used >= 1 && info.experts_used <= info.experts);
  CHECK(info.layers > 0 && info.embedding_length > 0 && info.vocab_size > 0);
  CHECK(info.context_length == 256 && info.training_context_length >= info.context_length);
  /* An f32 model: four bytes per parameter, and the rest is header and vocabulary. */
  CHECK(info.parameters * 4 <= model_size && info.parameters * 4 > model_size * 9 / 10);
  CHECK(info.load_ms > 0.0 && info.chat_template != NULL && info.name != NULL);
  /* An expert pool needs a quantized model: the q8_0 one, embedded the same way, gives in
   * each I/O mode what it gives when loaded by path. */
  if (model_size > 0) {
    int32_t by_path[32];
    int32_t by_fd[32];
    char path_text[1024];
    char fd_text[1024];
    int n_path;
    const long q8_size = embed_model(q8_path, q8_apk_path, prefix + 5, 4096);
    const int q8_fd = open(q8_apk_path, O_RDONLY);
    CHECK(q8_size > 0 && q8_fd >= 0);
    CHECK_STATUS(moert_runtime_set_expert_pool_fraction(runtime, 0.3), MOERT_OK);
    CHECK_STATUS(moert_runtime_set_hot_set(runtime, 0), MOERT_OK);
    /* The residency penalty off: with prefetch on, which experts are resident when a layer
     * routes depends on when the reads finish, and the penalty would let that timing pick
     * the tokens. */
    CHECK_STATUS(moert_runtime_set_router_alpha(runtime, 0.0f), MOERT_OK);
    CHECK_STATUS(moert_runtime_load_model(runtime, q8_path, NULL, NULL), MOERT_OK);
    n_path = greedy_ids(runtime, by_path, path_text, sizeof(path_text));
    CHECK(n_path == 32);
    for (m = 0; m < 3 && q8_fd >= 0; ++m) {
      CHECK_STATUS(moert_runtime_set_io_mode(runtime, modes[m]), MOERT_OK);
      CHECK_STATUS(moert_runtime_load_model_fd(runtime, q8_fd, prefix + 5, q8_size, NULL, NULL),
                   MOERT_OK);
      CHECK(greedy_ids(runtime, by_fd, fd_text, sizeof(fd_text)) == n_path);
      CHECK(memcmp(by_fd, by_path, sizeof(by_path)) == 0 && strcmp(fd_text, path_text) == 0);
    }
    if (q8_fd >= 0) close(q8_fd);
    remove(q8_apk_path);
    CHECK_STATUS(moert_runtime_set_expert_pool_fraction(runtime, 0.0), MOERT_OK);
    CHECK_STATUS(moert_runtime_load_model_fd(runtime, fd, prefix, model_size, NULL, NULL), MOERT_OK);
  }

  /* An fd whose file has no name any more: refused with the reason. */
  CHECK(unlink(apk_path) == 0);
  CHECK_STATUS(moert_runtime_load_model_fd(runtime, fd, prefix, model_size, NULL, NULL),
               MOERT_INVALID_ARGUMENT);
  CHECK(strstr(moert_last_error(runtime), "names no file") != NULL);
  CHECK(greedy_is_reference(runtime)); /* the model loaded before stays */
  close(fd);
  moert_runtime_destroy(runtime);
}


/* --- Repro bundles: moert_runtime_set_repro, moert_session_write_repro. ------------ */

/* A file's first 8 bytes are a repro bundle's magic. */
static int is_repro_bundle(const char* path) {
  char magic[8] = {0};
  FILE* f = fopen(path, "rb");
  size_t n = 0;
  if (f == NULL) return 0;
  n = fread(magic, 1, sizeof(magic), f);
  fclose(f);
  return n == sizeof(magic) && memcmp(magic, "MOERTRPB", 8) == 0;
}

static void check_repro(const char* model_path) {
  moert_runtime* runtime = NULL;
  moert_session* session = NULL;
  moert_generate_params params;
  char dir[256];
  char path[512];
  char written[512];
  snprintf(dir, sizeof(dir), "/tmp/moert-c-api-repro-%ld", (long)getpid());
  snprintf(path, sizeof(path), "%s/asked.moert-repro", dir);
  CHECK_STATUS(moert_runtime_create(NULL, &runtime), MOERT_OK);
  if (runtime == NULL) return;
  CHECK_STATUS(moert_runtime_set_repro(NULL, 1, 1, dir, 0), MOERT_INVALID_ARGUMENT);
  CHECK_STATUS(moert_runtime_set_repro(runtime, 1, 1, dir, -1), MOERT_INVALID_ARGUMENT);
  CHECK(strstr(moert_last_error(runtime), "repro_max_bytes") != NULL);
  CHECK_STATUS(moert_runtime_set_repro(runtime, 0, 0, dir, 0), MOERT_OK);
  CHECK_STATUS(moert_runtime_load_model(runtime, model_path, NULL, NULL), MOERT_OK);
  CHECK_STATUS(moert_session_create(runtime, &session), MOERT_OK);
  if (session != NULL) {
    moert_generate_params_default(&params);
    params.prompt = "ROMEO:";
    params.max_tokens = 4;
    params.sampler.temperature = 0.0f;
    CHECK_STATUS(moert_session_generate(session, &params, NULL, NULL), MOERT_OK);
    CHECK_STATUS(moert_session_write_repro(NULL, path, NULL, 0), MOERT_INVALID_ARGUMENT);
    /* To a path of the caller's, and to a new file under the repro directory. */
    CHECK_STATUS(moert_session_write_repro(session, path, written, sizeof(written)), MOERT_OK);
    CHECK(strcmp(written, path) == 0);
    CHECK(is_repro_bundle(path));
    CHECK_STATUS(moert_session_write_repro(session, NULL, written, sizeof(written)), MOERT_OK);
    CHECK(strncmp(written, dir, strlen(dir)) == 0 && strstr(written, "-request.moert-repro") != NULL);
    CHECK(is_repro_bundle(written));
    remove(written);
    /* A short buffer gets the path's start, NUL-terminated. */
    CHECK_STATUS(moert_session_write_repro(session, path, written, 5), MOERT_OK);
    CHECK(strlen(written) == 4 && strncmp(written, path, 4) == 0);
    CHECK(moert_session_write_repro(session, "/proc/no/such/dir/x.moert-repro", NULL, 0) !=
          MOERT_OK);
    CHECK(strstr(moert_session_last_error(session), "/proc/no/such/dir") != NULL);
    remove(path);
    moert_session_destroy(session);
  }
  rmdir(dir);
  moert_runtime_destroy(runtime);
}

/* --- Expert hot updates: moert_runtime_set_update_key, moert_runtime_apply_update
 * (their round trip is tests/runtime/update_test.cc). ---------------------------- */
static void check_update(const char* model_path) {
  moert_runtime* runtime = NULL;
  CHECK_STATUS(moert_runtime_create(NULL, &runtime), MOERT_OK);
  if (runtime == NULL) return;
  CHECK_STATUS(moert_runtime_set_update_key(NULL, NULL), MOERT_INVALID_ARGUMENT);
  CHECK_STATUS(moert_runtime_apply_update(NULL, "x.moert-delta"), MOERT_INVALID_ARGUMENT);
  CHECK_STATUS(moert_runtime_apply_update(runtime, "x.moert-delta"), MOERT_FAILED_PRECONDITION);
  CHECK(strstr(moert_last_error(runtime), "no model") != NULL);
  CHECK_STATUS(moert_runtime_set_update_key(runtime, "not hex"), MOERT_INVALID_ARGUMENT);
  CHECK(strstr(moert_last_error(runtime), "update_public_key") != NULL);
  CHECK_STATUS(moert_runtime_load_model(runtime, model_path, NULL, NULL), MOERT_OK);
  CHECK_STATUS(moert_runtime_apply_update(runtime, NULL), MOERT_INVALID_ARGUMENT);
  /* No key set: every package is refused, naming the option. */
  CHECK_STATUS(moert_runtime_apply_update(runtime, "/no/such/update.moert-delta"),
               MOERT_FAILED_PRECONDITION);
  CHECK(strstr(moert_last_error(runtime), "update_public_key") != NULL);
  /* A key (64 hex digits, a trailing newline allowed), then a missing package: named. */
  CHECK_STATUS(moert_runtime_set_update_key(
                   runtime, "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c\n"),
               MOERT_OK);
  CHECK(moert_runtime_apply_update(runtime, "/no/such/update.moert-delta") != MOERT_OK);
  CHECK(strstr(moert_last_error(runtime), "/no/such/update.moert-delta") != NULL);
  CHECK_STATUS(moert_runtime_set_update_key(runtime, NULL), MOERT_OK); /* cleared */
  CHECK_STATUS(moert_runtime_apply_update(runtime, "/no/such/update.moert-delta"),
               MOERT_FAILED_PRECONDITION);
  CHECK(greedy_is_reference(runtime)); /* the model keeps answering */
  moert_runtime_destroy(runtime);
}

int main(int argc, char** argv) {
  char model_path[4096];
  char vocab_path[4096];
  char missing_path[4096];
  char q8_path[4096];
  moert_runtime_options options;
  moert_runtime* runtime = NULL;
  moert_session* session = NULL;
  moert_generate_params params;
  moert_stats stats;
  progress_state progress;
  token_state tokens;
  int32_t context_length = 0;

  if (argc != 2) {
    fprintf(stderr, "usage: c_api_test SHARED_DIR\n");
    return 2;
  }
  snprintf(model_path, sizeof(model_path), "%s/models/tiny-moe-shakespeare-f32.gguf", argv[1]);
  snprintf(vocab_path, sizeof(vocab_path), "%s/vocab/ggml-vocab-gpt-2.gguf", argv[1]);
  snprintf(missing_path, sizeof(missing_path), "%s/models/no-such-model.gguf", argv[1]);

  CHECK(moert_version() != NULL && strcmp(moert_version(), MOERT_VERSION_STRING) == 0);
  CHECK(strcmp(moert_status_string(MOERT_OK), "MOERT_OK") == 0);
  CHECK(strcmp(moert_status_string(MOERT_OUT_OF_RANGE), "MOERT_OUT_OF_RANGE") == 0);
  CHECK(strcmp(moert_status_string((moert_status)999), "MOERT_UNKNOWN_STATUS") == 0);

  /* Options and create, NULL out-parameter first. */
  moert_runtime_options_default(&options);
  CHECK(options.threads == 0 && options.context_length == 0);
  CHECK_STATUS(moert_runtime_create(&options, NULL), MOERT_INVALID_ARGUMENT);
  CHECK(strstr(moert_last_error(NULL), "runtime") != NULL);
  options.threads = -1;
  CHECK_STATUS(moert_runtime_create(&options, &runtime), MOERT_INVALID_ARGUMENT);
  CHECK(runtime == NULL);
  CHECK(strstr(moert_last_error(NULL), "threads") != NULL);
  options.threads = 1; /* test machines are often busy; results do not depend on it */
  CHECK_STATUS(moert_runtime_create(&options, &runtime), MOERT_OK);
  CHECK(runtime != NULL);
  if (runtime == NULL) return 1;
  CHECK(strcmp(moert_last_error(runtime), "") == 0);

  /* Before a model is loaded. */
  CHECK_STATUS(moert_session_create(runtime, &session), MOERT_FAILED_PRECONDITION);
  CHECK(session == NULL);
  CHECK(strstr(moert_last_error(runtime), "LoadModel") != NULL);
  CHECK_STATUS(moert_runtime_context_length(runtime, &context_length), MOERT_FAILED_PRECONDITION);

  /* Load errors: the status and a message naming the file. */
  CHECK_STATUS(moert_runtime_load_model(NULL, model_path, NULL, NULL), MOERT_INVALID_ARGUMENT);
  CHECK_STATUS(moert_runtime_load_model(runtime, NULL, NULL, NULL), MOERT_INVALID_ARGUMENT);
  CHECK(strstr(moert_last_error(runtime), "path") != NULL);
  CHECK_STATUS(moert_runtime_load_model(runtime, missing_path, NULL, NULL), MOERT_NOT_FOUND);
  CHECK(strstr(moert_last_error(runtime), missing_path) != NULL);
  CHECK_STATUS(moert_runtime_load_model(runtime, vocab_path, NULL, NULL), MOERT_INVALID_ARGUMENT);
  CHECK(strstr(moert_last_error(runtime), "is not an LLM") != NULL);

  /* The log through a callback: the load says so at debug level. */
  {
    log_state log;
    memset(&log, 0, sizeof(log));
    log.min_level_seen = 99;
    CHECK_STATUS(moert_set_log_callback(on_log, &log, MOERT_LOG_ERROR + 1), MOERT_INVALID_ARGUMENT);
    CHECK_STATUS(moert_set_log_callback(on_log, &log, MOERT_LOG_DEBUG), MOERT_OK);
    /* Load with progress. */
    memset(&progress, 0, sizeof(progress));
    progress.monotonic = 1;
    CHECK_STATUS(moert_runtime_load_model(runtime, model_path, on_progress, &progress), MOERT_OK);
    CHECK_STATUS(moert_set_log_callback(NULL, NULL, MOERT_LOG_INFO), MOERT_OK);
    CHECK(log.calls >= 1);
    CHECK(log.min_level_seen == MOERT_LOG_DEBUG);
    CHECK(strstr(log.last, "loaded") != NULL);
  }
  CHECK(strcmp(moert_last_error(runtime), "") == 0);
  CHECK(progress.calls >= 2);
  CHECK(progress.first >= 0.0f && progress.first < 1.0f);
  CHECK(progress.last == 1.0f);
  CHECK(progress.monotonic);
  CHECK_STATUS(moert_runtime_context_length(runtime, &context_length), MOERT_OK);
  CHECK(context_length == 256);

  CHECK_STATUS(moert_session_create(runtime, NULL), MOERT_INVALID_ARGUMENT);
  CHECK_STATUS(moert_session_create(runtime, &session), MOERT_OK);
  CHECK(session != NULL);
  if (session == NULL) return 1;

  /* Greedy generation of the reference continuation. */
  moert_generate_params_default(&params);
  CHECK(params.max_tokens < 0 && params.sampler.top_k == 40 && params.prompt == NULL);
  params.prompt = "ROMEO:";
  params.max_tokens = 32;
  params.sampler.temperature = 0.0f;
  reset_tokens(&tokens, 0);
  CHECK_STATUS(moert_session_generate(session, &params, on_token, &tokens), MOERT_OK);
  CHECK(tokens.n_ids == 32);
  CHECK(tokens.mismatches == 0);
  CHECK(strcmp(tokens.text, kGreedyText) == 0);

  /* Stats of that generation. */
  CHECK_STATUS(moert_session_stats(session, NULL), MOERT_INVALID_ARGUMENT);
  CHECK_STATUS(moert_session_stats(session, &stats), MOERT_OK);
  CHECK(stats.prompt_tokens == 3);
  CHECK(stats.cached_tokens == 0);
  CHECK(stats.prefill_tokens == 3);
  CHECK(stats.generated_tokens == 32);
  CHECK(stats.finish_reason == MOERT_FINISH_MAX_TOKENS);
  /* The guard is on by default and changes nothing for a request that succeeds. */
  CHECK(stats.degraded == 0);
  CHECK(stats.degrade_reason != NULL && stats.degrade_reason[0] == '\0');
  CHECK(stats.prefill_tokens_per_second > 0 && stats.decode_tokens_per_second > 0);
  CHECK(stats.time_to_first_token_ms > 0);
  CHECK(stats.peak_rss_bytes > 0);
  CHECK(stats.average_experts_per_token == 2.0); /* the oracle model's top-2 */
  CHECK(stats.router_changed_fraction == 0.0);

  /* The metrics of that generation, snprintf-style. */
  {
    char small[8];
    char* text;
    const int64_t length = moert_runtime_metrics(runtime, NULL, 0);
    CHECK(length > 0);
    CHECK(moert_runtime_metrics(NULL, small, sizeof(small)) == -MOERT_INVALID_ARGUMENT);
    CHECK(moert_runtime_metrics(runtime, NULL, 4) == -MOERT_INVALID_ARGUMENT);
    CHECK(moert_runtime_metrics(runtime, small, sizeof(small)) == length);
    CHECK(strlen(small) == sizeof(small) - 1 && strncmp(small, "# HELP ", 7) == 0);
    text = (char*)malloc((size_t)length + 1);
    CHECK(text != NULL);
    if (text != NULL) {
      CHECK(moert_runtime_metrics(runtime, text, (size_t)length + 1) == length);
      CHECK((int64_t)strlen(text) == length);
      CHECK(strstr(text, "\nmoert_prefill_tokens_total 3\n") != NULL);
      CHECK(strstr(text, "\nmoert_decode_tokens_total 31\n") != NULL); /* the 32nd not run */
      CHECK(strstr(text, "\nmoert_requests_total 1\n") != NULL);
      CHECK(strstr(text, "\nmoert_time_to_first_token_seconds_count 1\n") != NULL);
      CHECK(strstr(text, "\nmoert_router_latency_seconds_count{layer=\"0\"} 32\n") != NULL);
      CHECK(strstr(text, "# TYPE moert_degrade_events_total counter\n") != NULL);
      free(text);
    }
  }

  /* Cancel through the callback's return value, after 5 tokens; traced. */
  CHECK_STATUS(moert_session_reset(session), MOERT_OK);
  reset_tokens(&tokens, 5);
  moert_trace_clear();
  moert_trace_enable(1);
  CHECK_STATUS(moert_session_generate(session, &params, on_token, &tokens), MOERT_CANCELLED);
  moert_trace_enable(0);
  {
    char trace_path[256];
    char missing_dir_path[320];
    char* json;
    FILE* file;
    long size;
    log_state log;
    snprintf(trace_path, sizeof(trace_path), "%s/moert_c_api_trace.json",
             getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp");
    snprintf(missing_dir_path, sizeof(missing_dir_path), "%s.d/no/such/dir/t.json", trace_path);
    CHECK_STATUS(moert_trace_write(NULL), MOERT_INVALID_ARGUMENT);
    CHECK_STATUS(moert_trace_write(""), MOERT_INVALID_ARGUMENT);
    CHECK_STATUS(moert_trace_write(trace_path), MOERT_OK);
    file = fopen(trace_path, "rb");
    CHECK(file != NULL);
    if (file != NULL) {
      fseek(file, 0, SEEK_END);
      size = ftell(file);
      fseek(file, 0, SEEK_SET);
      json = (char*)malloc((size_t)size + 1);
      CHECK(size > 0 && json != NULL);
      if (json != NULL) {
        json[fread(json, 1, (size_t)size, file)] = '\0';
        CHECK(strncmp(json, "{\"traceEvents\":[", 16) == 0);
        /* The generation's spans: a forward pass per token, its layers' attention. */
        CHECK(strstr(json, "\"name\":\"forward\"") != NULL);
        CHECK(strstr(json, "\"name\":\"attention\"") != NULL);
        free(json);
      }
      fclose(file);
      remove(trace_path);
    }
    /* A path that cannot be written: MOERT_INTERNAL, the reason in the log. */
    memset(&log, 0, sizeof(log));
    log.min_level_seen = 99;
    CHECK_STATUS(moert_set_log_callback(on_log, &log, MOERT_LOG_ERROR), MOERT_OK);
    CHECK_STATUS(moert_trace_write(missing_dir_path), MOERT_INTERNAL);
    CHECK_STATUS(moert_set_log_callback(NULL, NULL, MOERT_LOG_INFO), MOERT_OK);
    CHECK(log.calls == 1 && log.min_level_seen == MOERT_LOG_ERROR);
    CHECK(strstr(log.last, missing_dir_path) != NULL);
    moert_trace_clear();
  }
  CHECK(tokens.n_ids == 5);
  CHECK(tokens.mismatches == 0);
  CHECK(strstr(moert_session_last_error(session), "cancelled") != NULL);
  CHECK_STATUS(moert_session_stats(session, &stats), MOERT_OK);
  CHECK(stats.finish_reason == MOERT_FINISH_CANCELLED);
  CHECK(stats.generated_tokens == 5);

  /* Bad requests: a status and a message, and the session keeps working. */
  CHECK_STATUS(moert_session_generate(NULL, &params, NULL, NULL), MOERT_INVALID_ARGUMENT);
  CHECK_STATUS(moert_session_generate(session, NULL, NULL, NULL), MOERT_INVALID_ARGUMENT);
  CHECK(strstr(moert_session_last_error(session), "params") != NULL);
  params.sampler.top_p = 0.0f;
  CHECK_STATUS(moert_session_generate(session, &params, NULL, NULL), MOERT_INVALID_ARGUMENT);
  CHECK(strstr(moert_session_last_error(session), "top_p") != NULL);
  params.sampler.top_p = 0.95f;
  params.chat_template = "no-such-template";
  CHECK_STATUS(moert_session_generate(session, &params, NULL, NULL), MOERT_INVALID_ARGUMENT);
  CHECK(strstr(moert_session_last_error(session), "no-such-template") != NULL);
  params.chat_template = NULL;
  params.n_stop = 1;
  params.stop = NULL;
  CHECK_STATUS(moert_session_generate(session, &params, NULL, NULL), MOERT_INVALID_ARGUMENT);
  params.n_stop = 0;
  CHECK_STATUS(moert_session_add_message(session, "narrator", "Once"), MOERT_INVALID_ARGUMENT);
  CHECK_STATUS(moert_session_add_message(session, NULL, "Once"), MOERT_INVALID_ARGUMENT);

  CHECK_STATUS(moert_session_reset(session), MOERT_OK);
  reset_tokens(&tokens, 0);
  CHECK_STATUS(moert_session_generate(session, &params, on_token, &tokens), MOERT_OK);
  CHECK(strcmp(moert_session_last_error(session), "") == 0);
  CHECK(tokens.n_ids == 32 && tokens.mismatches == 0);

  /* A chat turn with a stop string. */
  {
    moert_message message = {"user", "ROMEO:"};
    const char* stop[1] = {"\n"};
    moert_generate_params chat;
    moert_generate_params_default(&chat);
    chat.messages = &message;
    chat.n_messages = 1;
    chat.max_tokens = 16;
    chat.sampler.temperature = 0.0f;
    chat.stop = stop;
    chat.n_stop = 1;
    CHECK_STATUS(moert_session_reset(session), MOERT_OK);
    reset_tokens(&tokens, 0);
    CHECK_STATUS(moert_session_generate(session, &chat, on_token, &tokens), MOERT_OK);
    CHECK(strchr(tokens.text, '\n') == NULL);
  }

  /* NULL handles everywhere else. */
  CHECK_STATUS(moert_session_create(NULL, &session), MOERT_INVALID_ARGUMENT);
  CHECK_STATUS(moert_session_reset(NULL), MOERT_INVALID_ARGUMENT);
  CHECK_STATUS(moert_session_cancel(NULL), MOERT_INVALID_ARGUMENT);
  CHECK_STATUS(moert_session_stats(NULL, &stats), MOERT_INVALID_ARGUMENT);
  CHECK_STATUS(moert_session_add_message(NULL, "user", "x"), MOERT_INVALID_ARGUMENT);
  CHECK_STATUS(moert_runtime_context_length(NULL, &context_length), MOERT_INVALID_ARGUMENT);
  CHECK(strcmp(moert_session_last_error(NULL), "") == 0);
  moert_runtime_options_default(NULL);
  moert_generate_params_default(NULL);

  /* The session outlives the runtime. */
  moert_runtime_destroy(runtime);
  params.max_tokens = 4;
  CHECK_STATUS(moert_session_reset(session), MOERT_OK);
  reset_tokens(&tokens, 0);
  CHECK_STATUS(moert_session_generate(session, &params, on_token, &tokens), MOERT_OK);
  CHECK(tokens.n_ids == 4 && tokens.mismatches == 0);
  moert_session_destroy(session);
  moert_session_destroy(NULL);
  moert_runtime_destroy(NULL);

  /* An expert pool (the q4_0 model on the integer kernels): the same greedy tokens
   * as with every expert resident, and the memory figures. */
  {
    char q4_path[4096];
    int32_t resident[32];
    int n_resident;
    int i;
    moert_memory_stats memory;
    snprintf(q4_path, sizeof(q4_path), "%s/models/tiny-moe-shakespeare-q4_0.gguf", argv[1]);
    params.max_tokens = 16;
    options.threads = 1;
    options.context_length = 64;
    CHECK_STATUS(moert_runtime_create(&options, &runtime), MOERT_OK);
    CHECK_STATUS(moert_runtime_load_model(runtime, q4_path, NULL, NULL), MOERT_OK);
    CHECK_STATUS(moert_session_create(runtime, &session), MOERT_OK);
    reset_tokens(&tokens, 0);
    CHECK_STATUS(moert_session_generate(session, &params, on_token, &tokens), MOERT_OK);
    n_resident = tokens.n_ids;
    CHECK(n_resident > 0 && n_resident <= 16);
    for (i = 0; i < n_resident; ++i) resident[i] = tokens.ids[i];
    CHECK_STATUS(moert_session_memory_stats(session, &memory), MOERT_OK);
    CHECK(memory.budget_bytes == 0 && memory.expert_pool_bytes == 0);
    moert_session_destroy(session);

    CHECK_STATUS(moert_runtime_set_memory_budget(NULL, 0), MOERT_INVALID_ARGUMENT);
    CHECK_STATUS(moert_runtime_set_memory_budget(runtime, -1), MOERT_INVALID_ARGUMENT);
    CHECK(strstr(moert_last_error(runtime), "memory_budget_bytes") != NULL);
    CHECK_STATUS(moert_runtime_set_expert_pool_bytes(runtime, -1), MOERT_INVALID_ARGUMENT);
    CHECK_STATUS(moert_runtime_set_expert_pool_fraction(runtime, 2.0), MOERT_INVALID_ARGUMENT);
    CHECK(strstr(moert_last_error(runtime), "expert_pool_fraction") != NULL);
    CHECK_STATUS(moert_runtime_set_io_mode(runtime, (moert_io_mode)7), MOERT_INVALID_ARGUMENT);
    CHECK_STATUS(moert_runtime_set_hot_set(runtime, 0), MOERT_OK);
    CHECK_STATUS(moert_runtime_set_loader_deadline(runtime, 0), MOERT_INVALID_ARGUMENT);
    CHECK(strstr(moert_last_error(runtime), "loader_wait_deadline_ms") != NULL);
    CHECK_STATUS(moert_runtime_set_loader_deadline(runtime, 250), MOERT_OK);
    CHECK_STATUS(moert_runtime_set_mlock(NULL, 1), MOERT_INVALID_ARGUMENT);
    CHECK_STATUS(moert_runtime_set_cache_dir(NULL, "/tmp"), MOERT_INVALID_ARGUMENT);
    CHECK_STATUS(moert_runtime_set_cache_dir(runtime, NULL), MOERT_OK);
    CHECK_STATUS(moert_runtime_set_mlock(runtime, 1), MOERT_OK);
    CHECK_STATUS(moert_runtime_set_inference_guard(NULL, 1), MOERT_INVALID_ARGUMENT);
    CHECK_STATUS(moert_runtime_set_inference_guard(runtime, 1), MOERT_OK);
    /* A rules file that cannot be read fails the load, naming it. */
    CHECK_STATUS(moert_runtime_set_degrade_policy(runtime, 1, "/nonexistent/moert.rules"),
                 MOERT_OK);
    CHECK_STATUS(moert_runtime_load_model(runtime, q4_path, NULL, NULL), MOERT_NOT_FOUND);
    CHECK(strstr(moert_last_error(runtime), "/nonexistent/moert.rules") != NULL);
    CHECK_STATUS(moert_runtime_set_degrade_policy(runtime, 0, NULL), MOERT_OK);
    CHECK_STATUS(moert_runtime_set_io_mode(runtime, MOERT_IO_BUFFERED), MOERT_OK);
    CHECK_STATUS(moert_runtime_set_expert_pool_fraction(runtime, 0.25), MOERT_OK);
    CHECK_STATUS(moert_runtime_set_router_alpha(runtime, -1.0f), MOERT_INVALID_ARGUMENT);
    CHECK(strstr(moert_last_error(runtime), "router_alpha") != NULL);
    CHECK_STATUS(moert_runtime_set_dynamic_k(runtime, 1.5f), MOERT_INVALID_ARGUMENT);
    CHECK_STATUS(moert_runtime_set_thermal_limit(runtime, -3.0f), MOERT_INVALID_ARGUMENT);
    CHECK_STATUS(moert_runtime_set_temperature(NULL, 40.0f), MOERT_INVALID_ARGUMENT);
    CHECK_STATUS(moert_runtime_set_prefetch(runtime, 1, 0), MOERT_INVALID_ARGUMENT);
    CHECK(strstr(moert_last_error(runtime), "prefetch_depth") != NULL);
    CHECK_STATUS(moert_runtime_set_prefetch(runtime, 1, 1), MOERT_OK);
    CHECK_STATUS(moert_runtime_set_prefetch(runtime, 0, 1), MOERT_OK);
    CHECK_STATUS(moert_runtime_set_temperature(runtime, 40.0f), MOERT_OK);
    CHECK_STATUS(moert_runtime_set_thermal_limit(runtime, 0.0f), MOERT_OK);
    CHECK_STATUS(moert_runtime_set_dynamic_k(runtime, 0.0f), MOERT_OK);
    /* Budgeted output equals fully resident with the residency penalty off. */
    CHECK_STATUS(moert_runtime_set_router_alpha(runtime, 0.0f), MOERT_OK);
    CHECK(strcmp(moert_last_error(runtime), "") == 0);
    /* A budget too small for the weights outside the pool. */
    CHECK_STATUS(moert_runtime_set_memory_budget(runtime, 1 << 20), MOERT_OK);
    CHECK_STATUS(moert_runtime_load_model(runtime, q4_path, NULL, NULL),
                 MOERT_RESOURCE_EXHAUSTED);
    CHECK(strstr(moert_last_error(runtime), "memory budget") != NULL);
    CHECK_STATUS(moert_runtime_set_memory_budget(runtime, 0), MOERT_OK);
    CHECK_STATUS(moert_runtime_load_model(runtime, q4_path, NULL, NULL), MOERT_OK);
    CHECK_STATUS(moert_session_create(runtime, &session), MOERT_OK);
    reset_tokens(&tokens, 0);
    CHECK_STATUS(moert_session_generate(session, &params, on_token, &tokens), MOERT_OK);
    CHECK(tokens.n_ids == n_resident);
    for (i = 0; i < n_resident && i < tokens.n_ids; ++i) CHECK(tokens.ids[i] == resident[i]);
    CHECK_STATUS(moert_session_memory_stats(NULL, &memory), MOERT_INVALID_ARGUMENT);
    CHECK_STATUS(moert_session_memory_stats(session, NULL), MOERT_INVALID_ARGUMENT);
    CHECK_STATUS(moert_session_memory_stats(session, &memory), MOERT_OK);
    CHECK(memory.expert_pool_bytes > 0);
    CHECK(memory.budget_bytes > memory.expert_pool_bytes);
    CHECK(memory.expert_pool_used_bytes > 0);
    CHECK(memory.expert_pool_used_bytes + memory.expert_pool_free_bytes ==
          memory.expert_pool_bytes);
    CHECK(memory.expert_hit_rate >= 0.0 && memory.expert_hit_rate < 1.0);
    CHECK(memory.expert_bytes_read_per_token > 0.0);
    CHECK(memory.expert_stall_ms_per_token >= 0.0);
    CHECK(memory.peak_rss_bytes > 0);
    CHECK_STATUS(moert_runtime_save_hot_set(runtime), MOERT_OK); /* off: nothing written */
    CHECK_STATUS(moert_runtime_save_hot_set(NULL), MOERT_INVALID_ARGUMENT);

    /* Every session's KV cache is in the budget: 64 positions of 4 KiB here. */
    CHECK(memory.kv_caches == 1);
    CHECK(memory.kv_cache_bytes == 64 * 4096 && memory.kv_reserved_bytes == 64 * 4096);
    {
      moert_session* second = NULL;
      CHECK_STATUS(moert_session_create_with_context(runtime, -1, &second),
                   MOERT_INVALID_ARGUMENT);
      CHECK(second == NULL);
      CHECK(strstr(moert_last_error(runtime), "context_length") != NULL);
      CHECK_STATUS(moert_session_create_with_context(runtime, 32, &second), MOERT_OK);
      if (second != NULL) {
        reset_tokens(&tokens, 0);
        params.max_tokens = 4;
        CHECK_STATUS(moert_session_generate(second, &params, on_token, &tokens), MOERT_OK);
        CHECK_STATUS(moert_session_memory_stats(second, &memory), MOERT_OK);
        CHECK(memory.kv_caches == 2 && memory.kv_cache_bytes == 32 * 4096);
        CHECK(memory.kv_reserved_bytes == (64 + 32) * 4096);
        params.max_tokens = n_resident;
        moert_session_destroy(second);
      }
    }
    /* Trim from any level: the idle session's cache is freed, its output unchanged. */
    CHECK_STATUS(moert_runtime_trim(NULL, 80), MOERT_INVALID_ARGUMENT);
    CHECK_STATUS(moert_runtime_trim(runtime, -1), MOERT_INVALID_ARGUMENT);
    CHECK(strstr(moert_last_error(NULL), "trim level") != NULL);
    CHECK_STATUS(moert_runtime_trim(runtime, 80), MOERT_OK);
    CHECK_STATUS(moert_session_reset(session), MOERT_OK);
    reset_tokens(&tokens, 0);
    CHECK_STATUS(moert_session_generate(session, &params, on_token, &tokens), MOERT_OK);
    CHECK(tokens.n_ids == n_resident);
    for (i = 0; i < n_resident && i < tokens.n_ids; ++i) CHECK(tokens.ids[i] == resident[i]);
    CHECK_STATUS(moert_runtime_trim(runtime, 0), MOERT_OK);
    CHECK_STATUS(moert_runtime_set_session_pool_shrink(runtime, 1, -1), MOERT_INVALID_ARGUMENT);
    CHECK(strstr(moert_last_error(runtime), "expert_pool_floor_bytes") != NULL);
    CHECK_STATUS(moert_runtime_set_session_pool_shrink(runtime, 1, 0), MOERT_OK);
    moert_session_destroy(session);
    moert_runtime_destroy(runtime);
  }

  snprintf(q8_path, sizeof(q8_path), "%s/models/tiny-moe-shakespeare-q8_0.gguf", argv[1]);
  check_app_integration(model_path, q8_path);

  check_repro(model_path);
  check_update(model_path);

  if (g_failures != 0) {
    fprintf(stderr, "c_api_test: %d check(s) failed\n", g_failures);
    return 1;
  }
  printf("c_api_test: all checks passed\n");
  return 0;
}
