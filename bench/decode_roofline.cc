// The decode roofline of moert-bench (see decode_roofline.h).
#include "bench/decode_roofline.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "bench/bench-utils.h"
#include "core/strings.h"
#include "format/arch.h"

namespace moert::bench {
namespace {

using format::TensorKind;

enum class Read { kWhole, kExpert, kEmbeddingRow, kNone };

// The layer of a "blk.N." tensor; -1 for a model-wide one.
int LayerOf(std::string_view name) {
  constexpr std::string_view kPrefix = "blk.";
  if (!name.starts_with(kPrefix)) return -1;
  int layer = 0;
  size_t i = kPrefix.size();
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && layer < (1 << 20); ++i) {
    layer = layer * 10 + (name[i] - '0');
  }
  return i > kPrefix.size() && i < name.size() && name[i] == '.' ? layer : -1;
}

Read HowRead(std::string_view name) {
  const int layer = LayerOf(name);
  const auto is = [&](TensorKind kind) {
    return name == format::TensorWeightName(kind, layer) ||
           name == format::TensorBiasName(kind, layer);
  };
  if (layer < 0) return is(TensorKind::kTokenEmbd) ? Read::kEmbeddingRow : Read::kWhole;
  for (TensorKind kind : {TensorKind::kFfnGateExps, TensorKind::kFfnUpExps, TensorKind::kFfnDownExps}) {
    if (is(kind)) return Read::kExpert;
  }
  for (TensorKind kind : {TensorKind::kFfnGateDenseFallback, TensorKind::kFfnUpDenseFallback,
                          TensorKind::kFfnDownDenseFallback}) {
    if (is(kind)) return Read::kNone;
  }
  return Read::kWhole;
}

}  // namespace

double DecodeWeights::PerToken(double average_k) const {
  const double experts =
      n_expert == 0 ? 0.0 : average_k * static_cast<double>(expert_bytes) / n_expert;
  return static_cast<double>(dense_bytes) + experts;
}

DecodeWeights CountDecodeWeights(const format::GgufFile& file, uint32_t n_expert) {
  DecodeWeights w;
  w.n_expert = n_expert;
  const bool tied = file.FindTensor(format::TensorWeightName(TensorKind::kOutput)) == nullptr;
  for (const format::GgufTensorInfo& t : file.tensors()) {
    switch (HowRead(t.name)) {
      case Read::kWhole:
        w.dense_bytes += t.n_bytes;
        break;
      case Read::kExpert:
        w.expert_bytes += t.n_bytes;
        break;
      case Read::kEmbeddingRow:
        // The rows are dims[1] (ggml order); the output projection reads them all.
        w.dense_bytes += tied || t.dims.size() < 2 || t.dims[1] == 0 ? t.n_bytes
                                                                      : t.n_bytes / t.dims[1];
        break;
      case Read::kNone:
        break;
    }
  }
  return w;
}

absl::StatusOr<double> MeasureReadBandwidth(int threads) {
  int fds[2];
  if (pipe(fds) != 0) {
    return absl::InternalError(StrCat("read bandwidth: pipe: ", std::strerror(errno)));
  }
  const pid_t pid = fork();
  if (pid < 0) {
    const int error = errno;
    close(fds[0]);
    close(fds[1]);
    return absl::InternalError(StrCat("read bandwidth: fork: ", std::strerror(error)));
  }
  if (pid == 0) {
    close(fds[0]);
    const double bw = ReadBandwidth(threads).sustained;
    const bool sent = write(fds[1], &bw, sizeof(bw)) == static_cast<ssize_t>(sizeof(bw));
    _exit(sent ? 0 : 1);  // no atexit handlers, no stdio buffers of the parent's flushed
  }
  close(fds[1]);
  double bw = 0;
  size_t got = 0;
  while (got < sizeof(bw)) {
    const ssize_t n = read(fds[0], reinterpret_cast<char*>(&bw) + got, sizeof(bw) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (got != sizeof(bw) || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || !(bw > 0)) {
    return absl::InternalError("read bandwidth: the measuring process reported nothing");
  }
  return bw;
}

}  // namespace moert::bench
