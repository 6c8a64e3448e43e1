# Sources of src/telemetry (paths relative to src/).
list(APPEND MOERT_SOURCES
  telemetry/platform.cc
  telemetry/trace.cc
)
