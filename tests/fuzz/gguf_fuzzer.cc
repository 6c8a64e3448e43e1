// libFuzzer target for the GGUF reader: parses the input, then calls every accessor
// on every key and reads every tensor's data, and checks the invariants that the
// rest of moert relies on (views inside the buffer, ranges aligned and in bounds).
// Build and run with scripts/run-fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string_view>

#include "format/gguf.h"

namespace {

using moert::format::GgufFile;
using moert::format::GgufKeyValue;
using moert::format::GgufTensorInfo;

// Not assert(): the fuzz build may define NDEBUG, and these must always hold.
void Check(bool condition) {
  if (!condition) std::abort();
}

// Reads every byte so that ASan sees any view that points outside the input.
volatile uint8_t g_sink;
void Touch(std::span<const uint8_t> bytes) {
  uint8_t x = 0;
  for (uint8_t b : bytes) x = static_cast<uint8_t>(x ^ b);
  g_sink = x;
}
void Touch(std::string_view s) {
  Touch(std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}

bool Inside(std::span<const uint8_t> outer, const void* p, size_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  if (n == 0) return true;
  return b >= outer.data() && n <= outer.size() &&
         static_cast<size_t>(b - outer.data()) <= outer.size() - n;
}

void CheckKey(const GgufFile& f, const GgufKeyValue& kv) {
  Check(Inside(f.bytes(), kv.key.data(), kv.key.size()));
  Check(f.FindKey(kv.key) == &kv);
  Touch(kv.key);
  Touch(kv.value.str);
  Check(Inside(f.bytes(), kv.value.str.data(), kv.value.str.size()));
  Touch(kv.value.array_bytes);
  Check(Inside(f.bytes(), kv.value.array_bytes.data(), kv.value.array_bytes.size()));
  // Every accessor on every key: each either returns a value or a Status.
  (void)f.GetUint(kv.key);
  (void)f.GetInt(kv.key);
  (void)f.GetFloat(kv.key);
  (void)f.GetBool(kv.key);
  if (auto s = f.GetString(kv.key); s.ok()) Touch(*s);
  if (auto a = f.GetStringArray(kv.key); a.ok()) {
    Check(a->size() == kv.value.array_size);
    for (std::string_view s : *a) {
      Check(Inside(f.bytes(), s.data(), s.size()));
      Touch(s);
    }
  }
  if (auto a = f.GetFloatArray(kv.key); a.ok()) Check(a->size() == kv.value.array_size);
  if (auto a = f.GetIntArray(kv.key); a.ok()) Check(a->size() == kv.value.array_size);
}

void CheckTensor(const GgufFile& f, const GgufTensorInfo& t) {
  Check(Inside(f.bytes(), t.name.data(), t.name.size()));
  Check(f.FindTensor(t.name) == &t);
  Check(t.offset % f.alignment() == 0);
  Check(t.file_offset == f.data_offset() + t.offset);
  std::span<const uint8_t> data = f.TensorData(t);
  Check(data.size() == t.n_bytes);
  Check(Inside(f.bytes(), data.data(), data.size()));
  Touch(data);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = GgufFile::FromBuffer(std::span(data, size), "fuzz.gguf");
  if (!file.ok()) {
    Check(!file.status().message().empty());
    return 0;
  }
  const GgufFile& f = **file;
  Check(f.version() == 2 || f.version() == 3);
  Check(f.alignment() != 0 && (f.alignment() & (f.alignment() - 1)) == 0);
  Check(f.data_offset() % f.alignment() == 0);
  for (const GgufKeyValue& kv : f.metadata()) CheckKey(f, kv);
  for (const GgufTensorInfo& t : f.tensors()) CheckTensor(f, t);
  (void)f.GetUint("no such key");
  return 0;
}
