// The cost of a trace span (docs/tracing.md): MOERT_TRACE_SCOPE with tracing off (one
// relaxed load and a branch), on (two clock reads and a record into the thread's ring,
// the ring full so that every record overwrites), and the clock read alone, which is
// most of a span when on. Run: <build>/bin/moert-bench-trace
#include <benchmark/benchmark.h>

#include <cstdint>

#include "telemetry/platform.h"
#include "telemetry/trace.h"

namespace {

namespace telemetry = moert::telemetry;

void Span(benchmark::State& state) {
  const bool on = state.range(0) != 0;
  telemetry::ClearTrace();
  if (on) telemetry::EnableTracing();
  int64_t i = 0;
  for (auto _ : state) {
    MOERT_TRACE_SCOPE_ARG("layer", "layer", i);
    benchmark::ClobberMemory();
    ++i;
  }
  telemetry::DisableTracing();
  state.SetLabel(on ? "tracing on" : "tracing off");
}

void ClockRead(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(telemetry::NowNs());
}

BENCHMARK(Span)->ArgName("on")->Arg(0)->Arg(1);
BENCHMARK(ClockRead);

}  // namespace

BENCHMARK_MAIN();
