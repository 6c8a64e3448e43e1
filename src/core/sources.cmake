# Sources of src/core (paths relative to src/).
list(APPEND MOERT_SOURCES
  core/mapped_file.cc
  core/thread_pool.cc
)
