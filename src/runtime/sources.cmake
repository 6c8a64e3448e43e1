# Sources of src/runtime (paths relative to src/).
list(APPEND MOERT_SOURCES
  runtime/version.cc
  runtime/status.cc
  runtime/update.cc
  runtime/runtime.cc
  runtime/repro.cc
  runtime/session.cc
  runtime/degrade_actions.cc
  runtime/inference_guard.cc
  runtime/vision.cc
  runtime/c_api.cc
)
