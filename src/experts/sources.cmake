# Sources of src/experts (paths relative to src/).
list(APPEND MOERT_SOURCES
  experts/checksum.cc
  experts/delta_apply.cc
  experts/delta_codec.cc
  experts/delta_make.cc
  experts/delta_package.cc
  experts/expert_cache.cc
  experts/expert_directory.cc
  experts/hot_set.cc
  experts/io_mode.cc
  experts/loader.cc
  experts/read_engine.cc
)
# The io_uring engine, where liburing is found (cmake/MoertDependencies.cmake).
if(MOERT_HAVE_IO_URING)
  list(APPEND MOERT_SOURCES experts/read_engine_uring.cc)
endif()
