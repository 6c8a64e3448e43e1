// Grouping routed pairs by expert (see expert_groups.h): a counting sort, stable.
#include "backend/expert_groups.h"

#include <cstddef>

namespace moert::backend {

ExpertGroups GroupByExpert(std::span<const int> experts, int n_expert) {
  std::vector<int64_t> start(static_cast<size_t>(n_expert) + 1, 0);
  for (int e : experts) {
    if (e >= 0) ++start[static_cast<size_t>(e) + 1];
  }
  for (size_t e = 0; e < static_cast<size_t>(n_expert); ++e) start[e + 1] += start[e];
  ExpertGroups g;
  g.pair_of_row.resize(static_cast<size_t>(start.back()));
  g.row_of_pair.assign(experts.size(), -1);
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (size_t p = 0; p < experts.size(); ++p) {
    const int e = experts[p];
    if (e < 0) continue;
    const int64_t r = next[static_cast<size_t>(e)]++;
    g.pair_of_row[static_cast<size_t>(r)] = static_cast<int64_t>(p);
    g.row_of_pair[p] = r;
  }
  for (int e = 0; e < n_expert; ++e) {
    if (start[static_cast<size_t>(e) + 1] == start[static_cast<size_t>(e)]) continue;
    g.expert.push_back(e);
    g.first.push_back(start[static_cast<size_t>(e)]);
  }
  g.first.push_back(start.back());
  return g;
}

}  // namespace moert::backend
