// The expert loader's read bandwidth from flash (GB/s of bytes asked of the file
// system), O_DIRECT, by read engine (pread threads, io_uring), queue depth and chunk
// size, over a model file of OLMoE-1B-7B-shaped experts (2048 x 1024, moert-packed
// W8: 6.4 MiB an expert, so the copy into the block is a memcpy and the figure is the
// reads'). Each iteration loads every expert of the file once, in file order, queued
// all at once as a layer's prefetches are. Compare with the disk's own figures at the
// same queue depths (fio; docs/performance.md, "Flash reads").
//
// Run: <build>/bin/moert-bench-loader [--dir=FOLDER] [--mib=N] [--benchmark_...]
//   --dir  where the model file is written (default: the temp folder; it must be on the
//          disk to measure, not tmpfs) and removed at exit
//   --mib  its size (default 384; whole layers of 8 experts, at least one: 51 MiB)
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/packing.h"
#include "core/strings.h"
#include "experts/expert_directory.h"
#include "experts/loader.h"
#include "format/arch.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"

namespace {

using moert::StrCat;
using moert::experts::ExpertDirectory;
using moert::experts::IoEngine;
using moert::experts::IoMode;
using moert::experts::Loader;
using moert::experts::LoaderOptions;
using moert::experts::LoadResult;

constexpr int64_t kEmbd = 2048;
constexpr int64_t kFf = 1024;
constexpr int kExpertsPerLayer = 8;

std::string g_dir;
uint64_t g_mib = 384;

// The model file, written once for all benchmarks.
struct BenchModel {
  std::string path;
  std::unique_ptr<moert::format::GgufFile> file;
  std::unique_ptr<ExpertDirectory> directory;
  std::string error;  // why there is none

  ~BenchModel() {
    directory.reset();
    file.reset();
    if (!path.empty()) std::filesystem::remove(path);
  }
};

// Writes the file and opens it; `m.error` says why not.
void WriteModel(BenchModel& m) {
  const moert::backend::WeightFormat w8 =
      moert::backend::NaturalFormat(moert::format::GgmlType::kQ8_0);
  const uint64_t part_bytes = moert::backend::PackedBytes(w8, kFf, kEmbd);
  const uint64_t expert_bytes = 3 * part_bytes;
  const int n_layer = static_cast<int>(
      std::max<uint64_t>(1, g_mib * 1024 * 1024 / (expert_bytes * kExpertsPerLayer)));
  moert::format::GgufWriter writer;
  writer.SetString("general.architecture", "moert-bench-loader");
  // Each tensor on its own 4 KiB, as moert-pack aligns them; the parts inside are not.
  writer.SetAlignment(4096);
  const moert::format::GgmlType type = moert::backend::PackedTypeOf(w8);
  for (int l = 0; l < n_layer; ++l) {
    const struct {
      moert::format::TensorKind kind;
      int64_t rows, cols;
    } parts[3] = {{moert::format::TensorKind::kFfnGateExps, kFf, kEmbd},
                  {moert::format::TensorKind::kFfnUpExps, kFf, kEmbd},
                  {moert::format::TensorKind::kFfnDownExps, kEmbd, kFf}};
    for (const auto& part : parts) {
      const absl::Status declared = writer.DeclareTensor(
          moert::format::TensorWeightName(part.kind, l), type,
          {uint64_t(part.cols), uint64_t(part.rows), uint64_t(kExpertsPerLayer)});
      if (!declared.ok()) {
        m.error = std::string(declared.message());
        return;
      }
    }
  }
  const std::filesystem::path dir =
      g_dir.empty() ? std::filesystem::temp_directory_path() : std::filesystem::path(g_dir);
  m.path = (dir / StrCat("moert-bench-loader-", getpid(), ".gguf")).string();
  auto stream = writer.OpenStream(m.path);
  if (!stream.ok()) {
    m.error = std::string(stream.status().message());
    return;
  }
  // Weights are never looked at: any bytes do (xorshift, not zeros a disk might
  // compress).
  std::vector<uint64_t> piece(512 * 1024);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  uint64_t left = uint64_t(n_layer) * 3 * kExpertsPerLayer * part_bytes;
  while (left > 0) {
    for (uint64_t& v : piece) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      v = x;
    }
    const auto bytes = std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(piece.data()),
                                                piece.size() * sizeof(uint64_t));
    const uint64_t n = std::min<uint64_t>(bytes.size(), left);
    const absl::Status wrote = (*stream)->Write(bytes.first(n));
    if (!wrote.ok()) {
      m.error = std::string(wrote.message());
      return;
    }
    left -= n;
  }
  absl::Status finished = (*stream)->Finish();
  if (!finished.ok()) {
    m.error = std::string(finished.message());
    return;
  }
  // On the disk, out of the page cache: every read below goes to the device.
  const int fd = ::open(m.path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  auto file = moert::format::GgufFile::Open(m.path);
  if (!file.ok()) {
    m.error = std::string(file.status().message());
    return;
  }
  m.file = std::move(*file);
  auto directory = ExpertDirectory::Build(*m.file, n_layer, kExpertsPerLayer, kEmbd, kFf);
  if (!directory.ok()) {
    m.error = std::string(directory.status().message());
    return;
  }
  m.directory = std::make_unique<ExpertDirectory>(std::move(*directory));
}

BenchModel& Model() {
  static BenchModel model;
  static const bool written = (WriteModel(model), true);
  (void)written;
  return model;
}

// Args: engine (0 pread, 1 io_uring), queue depth, chunk KiB (0: a part in one read).
void BM_ExpertReads(benchmark::State& state) {
  BenchModel& model = Model();
  if (model.directory == nullptr) {
    state.SkipWithError(StrCat("cannot write the model: ", model.error).c_str());
    return;
  }
  const ExpertDirectory& dir = *model.directory;
  LoaderOptions options;
  options.mode = IoMode::kDirect;
  options.io_engine = state.range(0) == 1 ? IoEngine::kUring : IoEngine::kPread;
  options.read_queue_depth = static_cast<unsigned>(state.range(1));
  options.read_chunk_bytes = static_cast<uint64_t>(state.range(2)) * 1024;
  options.queue_capacity = dir.expert_count();
  options.wait_deadline_ms = 600 * 1000;  // a slow disk is measured, not read around
  auto loader = Loader::Create(dir, options);
  if (!loader.ok()) {
    state.SkipWithError(std::string(loader.status().message()).c_str());
    return;
  }
  if ((*loader)->mode() != IoMode::kDirect) {
    state.SkipWithError(StrCat("no O_DIRECT on ", model.path, ": ", (*loader)->fallback_reason(),
                               " (use --dir on the disk)")
                            .c_str());
    return;
  }
  uint64_t block_bytes = 0;
  for (int l = 0; l < dir.n_layer(); ++l) {
    for (int e = 0; e < dir.n_expert(); ++e) {
      block_bytes = std::max<uint64_t>(block_bytes, dir.info(l, e).runtime_bytes);
    }
  }
  // One destination for all: the loads commit one after another on the I/O thread.
  void* block = std::aligned_alloc(64, (block_bytes + 63) / 64 * 64);
  std::vector<Loader::Ticket> tickets;
  uint64_t bytes = 0;
  for (auto _ : state) {
    tickets.clear();
    for (int l = 0; l < dir.n_layer(); ++l) {
      for (int e = 0; e < dir.n_expert(); ++e) {
        tickets.push_back(
            (*loader)->Submit(dir.info(l, e), static_cast<uint8_t*>(block), std::nullopt));
      }
    }
    for (const Loader::Ticket& ticket : tickets) {
      const LoadResult r = (*loader)->Wait(ticket);
      if (!r.status.ok()) {
        state.SkipWithError(std::string(r.status.message()).c_str());
        break;
      }
      bytes += r.bytes_read;
    }
  }
  std::free(block);
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(bytes) * 1e-9, benchmark::Counter::kIsRate);
  state.counters["MiB"] = static_cast<double>(dir.total_runtime_bytes()) / (1024.0 * 1024.0);
  const std::optional<IoEngine> engine = (*loader)->io_engine();
  std::string label =
      StrCat(engine ? IoEngineName(*engine) : "none", " qd", (*loader)->read_queue_depth(),
             " chunk ", state.range(2) == 0 ? "part" : StrCat(state.range(2), "KiB"));
  if (!(*loader)->io_engine_fallback_reason().empty()) {
    label = StrCat(label, " (", (*loader)->io_engine_fallback_reason(), ")");
  }
  state.SetLabel(label);
}
// The loader before chunking (one pread per part), then each engine at depth 1 and 8.
BENCHMARK(BM_ExpertReads)
    ->ArgNames({"uring", "qd", "chunk_kib"})
    ->Args({0, 1, 0})
    ->Args({0, 1, 256})
    ->Args({0, 8, 256})
    ->Args({1, 1, 256})
    ->Args({1, 8, 256})
    ->Args({0, 8, 1024})
    ->Args({1, 8, 1024})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The repack of one OLMoE expert part on the I/O thread after its reads (Q4_0 1024 x 2048
// -> W4 tiles, 1.125 MiB; Commit in experts/loader.cc): its time is added to a miss's.
// As in the loader, neither side is in cache: the staging bytes came from the disk by
// DMA and the pool block is another expert's. Parts rotate through 48 MiB of buffers.
void BM_RepackPart(benchmark::State& state) {
  constexpr int64_t kRows = 1024, kCols = 2048;
  constexpr size_t kParts = 20;
  const size_t src_bytes = static_cast<size_t>(kRows * kCols / 32 * 18);
  const size_t dst_bytes =
      moert::backend::PackedBytes(moert::backend::WeightFormat::kW4, kRows, kCols);
  std::vector<std::vector<uint8_t>> src(kParts), dst(kParts);
  for (size_t p = 0; p < kParts; ++p) {
    src[p].resize(src_bytes);
    for (size_t i = 0; i < src_bytes; ++i)
      src[p][i] = static_cast<uint8_t>((i + p) * 2654435761u >> 13);
    dst[p].assign(dst_bytes, 0);
  }
  size_t p = 0;
  for (auto _ : state) {
    const absl::Status status =
        moert::backend::PackRows(moert::format::GgmlType::kQ4_0, src[p], kRows, kCols,
                                 moert::backend::WeightFormat::kW4, dst[p]);
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(dst[p].data());
    benchmark::ClobberMemory();
    p = (p + 1) % kParts;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(src_bytes));
}
BENCHMARK(BM_RepackPart)->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::strncmp(argv[i], "--dir=", 6) == 0) {
      g_dir = argv[i] + 6;
    } else if (i > 0 && std::strncmp(argv[i], "--mib=", 6) == 0) {
      g_mib = std::strtoull(argv[i] + 6, nullptr, 10);
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
