# Sources of src/runtime (paths relative to src/).
list(APPEND MOERT_SOURCES
  runtime/version.cc
)
