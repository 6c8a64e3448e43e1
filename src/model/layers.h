// The names the model's code (and its tests) use for the weights and the CPU ops it
// is built from: backend/matrix.h, backend/cpu/f32_ops.h and the MoE block's weights
// (pipeline/moe_scheduler.h). The forward pass itself is the layer graph
// (model/graph.h) over backend::Backend.
#ifndef MOERT_MODEL_LAYERS_H_
#define MOERT_MODEL_LAYERS_H_

#include "backend/cpu/f32_ops.h"
#include "backend/matrix.h"
#include "pipeline/moe_scheduler.h"

namespace moert::model {

using backend::FfnWeights;
using backend::Matrix;
using backend::MatrixView;
using backend::cpu::AddBias;
using backend::cpu::ApplyRope;
using backend::cpu::Attention;
using backend::cpu::AttentionShape;
using backend::cpu::Dot;
using backend::cpu::MatMul;
using backend::cpu::MatMulJob;
using backend::cpu::MatMuls;
using backend::cpu::RmsNorm;
using backend::cpu::RopeParams;
using backend::cpu::RouteToken;
using backend::cpu::Sigmoid;
using backend::cpu::Silu;
using backend::cpu::SwiGluFfn;
using backend::cpu::ThreadPool;
using pipeline::MoeWeights;

}  // namespace moert::model

#endif  // MOERT_MODEL_LAYERS_H_
