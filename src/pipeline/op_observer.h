// The op observer: a hook that sees each op's output as the layer graph and the MoE
// scheduler compute it, op by op (moert-replay compares two runs of the same tokens
// with it). It may change the output in place, which is how tests inject a fault into
// one kernel's result. It runs only on a backend that shares the host's memory (the
// CPU); a device backend's ops are not observed.
#ifndef MOERT_PIPELINE_OP_OBSERVER_H_
#define MOERT_PIPELINE_OP_OBSERVER_H_

#include <cstdint>
#include <functional>

namespace moert::pipeline {

// In the order a layer computes them.
enum class ObservedOp {
  kAttention,   // the attention block's output (before the residual add)
  kRouter,      // the router's gate logits, n_expert per row
  kExpertGate,  // one routed expert's gate projection (before SiLU), per token
  kExpertUp,    // its up projection
  kExpertDown,  // its down projection (before the routing weight)
  kFfn,         // the FFN block's output: the weighted experts (+ shared), or the dense FFN
};

// "attention", "router", "gate", "up", "down", "ffn".
const char* ObservedOpName(ObservedOp op);

struct OpEvent {
  int layer = 0;
  ObservedOp op = ObservedOp::kAttention;
  int expert = -1;     // the expert of kExpert*; -1 otherwise
  int64_t token = -1;  // the batch row of kExpert* (one token); -1: all `rows` rows
  int64_t rows = 0;
  int64_t width = 0;
  float* data = nullptr;  // rows * width floats, writable
};

// With `experts`, a MoE block computes each (token, expert) pair's projections one by
// one so each can be observed (slower than the fused op, and not its bits).
struct OpObserver {
  std::function<void(const OpEvent&)> fn;
  bool experts = false;

  explicit operator bool() const { return static_cast<bool>(fn); }
};

}  // namespace moert::pipeline

#endif  // MOERT_PIPELINE_OP_OBSERVER_H_
