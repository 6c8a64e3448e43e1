// The smallest C++ program over moert's C++ API: load a model (and, given one, a
// MiniCPM-V projector and an image), ask one question, stream the answer, print tok/s.
//
//   moert-example-chat MODEL.gguf [MMPROJ.gguf IMAGE.jpg] "What is in the picture?"
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "moert/runtime.h"

int main(int argc, char** argv) {
  if (argc != 3 && argc != 5) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [MMPROJ.gguf IMAGE] QUESTION\n", argv[0]);
    return 2;
  }
  const auto fail = [](const moert::Status& status) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    return 1;
  };
  std::unique_ptr<moert::MoERuntime> runtime;
  moert::Status status = moert::MoERuntime::Create({}, &runtime);
  if (status.ok()) status = runtime->LoadModel(argv[1]);
  if (status.ok() && argc == 5) status = runtime->LoadMmproj(argv[2]);
  if (!status.ok()) return fail(status);
  std::unique_ptr<moert::Session> session;
  status = runtime->CreateSession(&session);
  if (status.ok() && argc == 5) status = session->AddImage(moert::Image::FromFile(argv[3]));
  if (!status.ok()) return fail(status);

  moert::GenerateRequest request;
  request.messages = {{"user", argv[argc - 1]}};
  request.max_tokens = 256;
  status = session->Generate(request, [](std::string_view piece, int32_t) {
    std::cout << piece << std::flush;
    return true;
  });
  std::cout << "\n";
  if (!status.ok()) return fail(status);
  const moert::GenerationStats stats = session->Stats();
  std::fprintf(stderr, "prefill %d tokens at %.1f tok/s, decode %d tokens at %.1f tok/s\n",
               stats.prefill_tokens, stats.prefill_tokens_per_second, stats.generated_tokens,
               stats.decode_tokens_per_second);
  return 0;
}
