// The machine's read bandwidth, the yardstick of the kernel benchmarks (bench-utils.h):
// StreamRead of 2 MiB segments one after the other, cycling through the working set
// (more bytes than the last-level cache) as the kernel benchmarks cycle through weight
// matrices, with 1 and 2 threads, with the widest loads this CPU has (avx2 on x86,
// neon on aarch64) and with plain 64-bit integer sums. Each kernel benchmark binary
// measures the same figure once at startup (printed in the report's context as
// moert_read_bw_threads:N) and divides by it for bw_fraction; here the fractions are
// this run against that startup figure, so they show how much it moves between runs
// on a busy machine.
// A second series reads the first S MiB of the buffer over and over, 1 thread, S
// doubling up to the working set: where GB/s drops is where the last-level cache ends
// (check it against moert_llc_bytes in the context).
// Run: <build>/bin/moert-bench-bandwidth
#include <string>

#include "bench/bench-utils.h"
#include "core/strings.h"

namespace {

using moert::StrCat;
namespace bench = moert::bench;

// The buffer every benchmark here reads, allocated and filled on first use.
const uint8_t* Buffer() {
  static const uint8_t* buffer = [] {
    const size_t bytes = bench::WorkingSetBytes();
    uint8_t* p = bench::AllocateAligned(bytes).release();  // kept for the process
    bench::FillRandom(p, bytes, 1);
    return p;
  }();
  return buffer;
}

// Each iteration reads `bytes` bytes: the next segment of the first `span` bytes of
// the buffer.
void RunRead(benchmark::State& state, size_t bytes, size_t span, int threads, bool force_u64) {
  const uint8_t* buffer = Buffer();
  pthreadpool_t pool = bench::ThreadPool(threads);
  size_t offset = 0;
  bench::LoopTimer timer;
  for (auto _ : state) {
    benchmark::DoNotOptimize(bench::StreamRead(buffer + offset, bytes, pool, force_u64));
    offset += bytes;
    if (offset + bytes > span) offset = 0;
    timer.Lap();
  }
  bench::SetWeightCounters(state, bytes, threads, timer);
}

void Register() {
  const size_t working_set = bench::WorkingSetBytes() / 4096 * 4096;
  for (bool force_u64 : {false, true}) {
    const char* loads = force_u64 ? "u64" : bench::StreamReadIsa();
    for (int threads : bench::kThreadCounts) {
      const std::string name = StrCat("read_bandwidth/", loads, "/threads:", threads);
      bench::Configure(benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& state) {
        RunRead(state, bench::kBandwidthSegment, working_set, threads, force_u64);
      }));
    }
  }
  for (size_t mib = 1; mib << 20 <= working_set; mib *= 2) {
    const std::string name =
        StrCat("read_bandwidth_by_size/", bench::StreamReadIsa(), "/size_mib:", mib, "/threads:1");
    bench::Configure(benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& state) {
      RunRead(state, mib << 20, mib << 20, 1, false);
    }));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Register();
  return bench::Main(argc, argv);
}
