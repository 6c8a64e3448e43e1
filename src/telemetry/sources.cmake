# Sources of src/telemetry (paths relative to src/).
list(APPEND MOERT_SOURCES
  telemetry/metrics.cc
  telemetry/platform.cc
  telemetry/trace.cc
  telemetry/runtime_metrics.cc
  telemetry/repro_bundle.cc
  telemetry/crash_repro.cc
)
