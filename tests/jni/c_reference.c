/* The C API's greedy continuation of "ROMEO:" (32 tokens) on a model: its token ids to
 * IDS_FILE, its text to TEXT_FILE, for MoertJniTest to compare the Java API against.
 * Usage: jni_c_reference MODEL IDS_FILE TEXT_FILE */
#include <stdio.h>
#include <string.h>

#include "moert/moert.h"

typedef struct {
  FILE* ids;
  FILE* text;
} outputs;

static int on_token(const char* piece, int32_t token, void* user_data) {
  outputs* out = (outputs*)user_data;
  fwrite(piece, 1, strlen(piece), out->text);
  if (token >= 0) fprintf(out->ids, "%d\n", token);
  return 0;
}

int main(int argc, char** argv) {
  moert_runtime_options options;
  moert_runtime* runtime = NULL;
  moert_session* session = NULL;
  moert_generate_params params;
  outputs out;
  moert_status status;
  if (argc != 4) {
    fprintf(stderr, "usage: jni_c_reference MODEL IDS_FILE TEXT_FILE\n");
    return 2;
  }
  moert_runtime_options_default(&options);
  options.threads = 1;
  if (moert_runtime_create(&options, &runtime) != MOERT_OK ||
      moert_runtime_load_model(runtime, argv[1], NULL, NULL) != MOERT_OK ||
      moert_session_create(runtime, &session) != MOERT_OK) {
    fprintf(stderr, "jni_c_reference: %s\n", moert_last_error(runtime));
    return 1;
  }
  out.ids = fopen(argv[2], "w");
  out.text = fopen(argv[3], "wb");
  if (out.ids == NULL || out.text == NULL) return 1;
  moert_generate_params_default(&params);
  params.prompt = "ROMEO:";
  params.max_tokens = 32;
  params.sampler.temperature = 0.0f;
  status = moert_session_generate(session, &params, on_token, &out);
  if (fclose(out.ids) != 0 || fclose(out.text) != 0 || status != MOERT_OK) {
    fprintf(stderr, "jni_c_reference: %s\n", moert_session_last_error(session));
    return 1;
  }
  moert_session_destroy(session);
  moert_runtime_destroy(runtime);
  return 0;
}
