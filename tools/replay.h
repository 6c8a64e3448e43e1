// moert-replay's work (docs/repro.md): re-runs a repro bundle's token ids through a
// model twice, on the fp32 reference path (every weight dequantized) and on the
// bundle's backend (the quantized CPU kernels), token by token in lockstep, with an op
// observer (pipeline/op_observer.h) recording each op's output in each layer: the
// attention block, the router, each chosen expert's gate, up and down projections and
// the FFN block. The first op whose outputs differ past the bound is the answer:
// "layer 12 expert 3 down: max abs diff 0.012".
#ifndef MOERT_TOOLS_REPLAY_H_
#define MOERT_TOOLS_REPLAY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "pipeline/op_observer.h"

namespace moert::tools {

// A fault injected into the backend run (tests): `delta` added to every value of one
// op's output at one layer (and, for an expert op, one expert; -1: whichever comes
// first), at every token.
struct ReplayFault {
  int layer = 0;
  pipeline::ObservedOp op = pipeline::ObservedOp::kAttention;
  int expert = -1;
  float delta = 1.0f;
};

// "LAYER:OP[:EXPERT][=DELTA]", OP one of ObservedOpName's; InvalidArgument naming the
// part at fault otherwise.
absl::StatusOr<ReplayFault> ParseReplayFault(std::string_view text);

struct ReplayOptions {
  std::string bundle;
  std::string model;
  // An op differs when its max abs diff passes tolerance * max(1, max |reference|).
  double tolerance = 0.25;
  int max_tokens = 64;  // the bundle's first tokens replayed
  int threads = 1;
  bool ignore_hash = false;  // replay on a model whose hash is not the bundle's
  std::optional<ReplayFault> fault;
};

struct ReplayDiff {
  int layer = 0;
  pipeline::ObservedOp op = pipeline::ObservedOp::kAttention;
  int expert = -1;
  int64_t token = 0;  // the replayed token's index in the bundle
  double max_abs_diff = 0;
  double bound = 0;
  bool routing_differs = false;  // the two runs chose different experts there
};

struct ReplayReport {
  std::string backend;  // what the bundle ran on, and what replay ran
  std::string note;     // why replay ran something else (OpenCL), empty otherwise
  int tokens = 0;       // tokens replayed
  int64_t ops = 0;      // op outputs compared
  double largest_ratio = 0;  // the largest diff / bound seen (< 1: within the bound)
  std::optional<ReplayDiff> first;  // the first op past the bound; none: no difference
};

absl::StatusOr<ReplayReport> Replay(const ReplayOptions& options);

// "layer 12 expert 3 down: max abs diff 0.012" (no expert for the block ops:
// "layer 2 attention: max abs diff 0.5").
std::string FormatReplayDiff(const ReplayDiff& diff);

}  // namespace moert::tools

#endif  // MOERT_TOOLS_REPLAY_H_
