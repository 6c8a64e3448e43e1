// Work the oracle tests share, done once per test binary: the oracle's mmproj loaded,
// and each test image's slices as the CPU backend's reference path encodes them. The
// encoder tests check those encodings against llama.cpp, the OpenCL test compares the
// device with them and the pruning test reads their entropies, so each slice of each
// image is encoded once on that path (seconds per slice) rather than once per test.
#ifndef MOERT_TESTS_VISION_ORACLE_ENCODINGS_H_
#define MOERT_TESTS_VISION_ORACLE_ENCODINGS_H_

#include <string>
#include <vector>

#include "vision/mmproj.h"

namespace moert::vision::testing {

// The oracle's mmproj (GetOracleFiles().mmproj), loaded on the first call and kept
// until ReleaseOracleMmproj; nullptr (a test failure recorded) when it does not load.
const Mmproj* OracleMmproj();
void ReleaseOracleMmproj();

// One image's slices, encoded by a VisionEncoder over a 2-thread CpuBackend (fp32
// reference matmuls, no XNNPACK).
struct ReferenceEncoding {
  std::vector<std::vector<float>> rows;     // per slice: n_query x resampler_width
  std::vector<std::vector<float>> entropy;  // per slice: n_query cross-attention entropies
};

// Oracle image `name` (kOracleDir + name) decoded, preprocessed with the mmproj's
// normalization and every slice encoded: computed on the first call for `name` (with
// OracleMmproj()) and kept for the test binary. nullptr, a test failure recorded, when
// a step fails.
const ReferenceEncoding* GetReferenceEncoding(const std::string& name);

}  // namespace moert::vision::testing

#endif  // MOERT_TESTS_VISION_ORACLE_ENCODINGS_H_
