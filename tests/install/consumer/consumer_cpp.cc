// Consumer of an installed moert through the C++ API: creates a runtime and checks
// that loading a missing model fails with a message naming the file.
#include <moert/runtime.h>
#include <moert/version.h>

#include <cstdio>
#include <memory>

int main() {
  std::unique_ptr<moert::MoERuntime> runtime;
  moert::Status status = moert::MoERuntime::Create(moert::RuntimeOptions{}, &runtime);
  if (!status.ok()) {
    std::fprintf(stderr, "Create failed: %s\n", status.ToString().c_str());
    return 1;
  }
  status = runtime->LoadModel("/nonexistent/model.gguf");
  if (status.ok() || status.message().find("/nonexistent/model.gguf") == std::string::npos) {
    std::fprintf(stderr, "LoadModel of a missing file: %s\n", status.ToString().c_str());
    return 1;
  }
  std::printf("moert %s\n", moert_version());
  return 0;
}
