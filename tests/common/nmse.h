// The normalized mean squared error the backend tests bound a device's results by
// (after ggml's test-backend-ops): sum (a - b)^2 / sum b^2, 0 when both are zero; a NaN
// anywhere makes it NaN, which fails every bound.
#ifndef MOERT_TESTS_COMMON_NMSE_H_
#define MOERT_TESTS_COMMON_NMSE_H_

#include <cmath>
#include <vector>

namespace moert::test_util {

inline double Nmse(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    err += d * d;
    ref += static_cast<double>(b[i]) * b[i];
  }
  if (err == 0) return 0;
  return ref == 0 ? INFINITY : err / ref;
}

}  // namespace moert::test_util

#endif  // MOERT_TESTS_COMMON_NMSE_H_
