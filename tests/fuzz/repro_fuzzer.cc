// libFuzzer target for the repro bundle reader (telemetry/repro_bundle.h): decodes the
// input; a bundle it accepts must encode again and decode to the same sections. Build
// and run with scripts/run-fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "telemetry/repro_bundle.h"

namespace {

// Not assert(): the fuzz build may define NDEBUG, and these must always hold.
void Check(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using moert::telemetry::DecodeReproBundle;
  const auto bundle =
      DecodeReproBundle(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!bundle.ok()) return 0;
  // No cap: whatever the reader accepted the writer can write back.
  const auto bytes = moert::telemetry::EncodeReproBundle(*bundle, UINT64_MAX);
  if (!bytes.ok()) return 0;  // e.g. a section the writer refuses (shapes it checks)
  const auto again = DecodeReproBundle(*bytes);
  Check(again.ok());
  Check(again->tokens == bundle->tokens && again->model == bundle->model &&
        again->options == bundle->options && again->kv.keys.size() == bundle->kv.keys.size() &&
        again->router_logits.logits.size() == bundle->router_logits.logits.size());
  return 0;
}
