# Sources of src/core (paths relative to src/).
list(APPEND MOERT_SOURCES
  core/cache_dir.cc
  core/file_identity.cc
  core/guarded_copy.cc
  core/mapped_file.cc
  core/thread_pool.cc
)
