// The (token, slot) pairs of a routed batch grouped by expert: which rows of a gathered
// input each expert runs over, and where each pair's output lands. Written once for
// every place that runs experts over their tokens (the CPU's fused op, the MoE
// scheduler's split batches and fp32 experts, the OpenCL backend).
#ifndef MOERT_BACKEND_EXPERT_GROUPS_H_
#define MOERT_BACKEND_EXPERT_GROUPS_H_

#include <cstdint>
#include <span>
#include <vector>

namespace moert::backend {

// Pair p = t * k + s is token t's slot s. Rows are the pairs sorted by expert (stable:
// within an expert, in pair order); empty slots (expert -1) get no row.
struct ExpertGroups {
  std::vector<int> expert;            // group g's expert, ascending
  std::vector<int64_t> first;         // group g is rows [first[g], first[g + 1])
  std::vector<int64_t> pair_of_row;   // row -> pair
  std::vector<int64_t> row_of_pair;   // pair -> row; -1 for an empty slot

  size_t groups() const { return expert.size(); }
  int64_t rows() const { return static_cast<int64_t>(pair_of_row.size()); }
  int64_t size(size_t g) const { return first[g + 1] - first[g]; }
};

// `experts`: the expert of every pair (-1: empty), each below n_expert.
ExpertGroups GroupByExpert(std::span<const int> experts, int n_expert);

}  // namespace moert::backend

#endif  // MOERT_BACKEND_EXPERT_GROUPS_H_
