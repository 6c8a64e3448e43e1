// The decode roofline of moert-bench: how fast decoding could go if every weight byte a
// token reads came at the machine's measured read bandwidth, and the weight bytes that
// figure is made of.
//   weight_bytes_per_token = dense + average_k * routed experts / n_expert
//   roofline_tps           = read bandwidth / weight_bytes_per_token
//   roofline_fraction      = decode tok/s / roofline_tps
// "dense" is every tensor a decode step reads whole (attention, norms, router gates,
// shared experts, the output projection) plus one row of the token embedding (all of
// it when the output projection is the embedding, tied); the dense fallback FFN is not
// read. The bytes are the file's tensors as stored (their GGUF types).
#ifndef MOERT_BENCH_DECODE_ROOFLINE_H_
#define MOERT_BENCH_DECODE_ROOFLINE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "format/gguf.h"

namespace moert::bench {

struct DecodeWeights {
  uint64_t dense_bytes = 0;   // read by every token
  uint64_t expert_bytes = 0;  // every routed expert of every MoE layer
  uint32_t n_expert = 0;      // experts per MoE layer; 0: a dense model

  // What one decoded token reads when it takes `average_k` experts per MoE layer.
  double PerToken(double average_k) const;
};

// The decode weights of `file`'s model.
DecodeWeights CountDecodeWeights(const format::GgufFile& file, uint32_t n_expert);

// The sustained read bandwidth in bytes/s with `threads` threads, as the kernel
// benchmarks measure it (bench-utils.h: ReadBandwidth, a working set of 256 MiB or more,
// MOERT_BENCH_WORKING_SET_BYTES to change it). It runs in a child process so that its
// buffer stays out of the caller's peak RSS; call it before the caller starts threads.
// Internal when the child cannot be started or reports nothing.
absl::StatusOr<double> MeasureReadBandwidth(int threads);

}  // namespace moert::bench

#endif  // MOERT_BENCH_DECODE_ROOFLINE_H_
