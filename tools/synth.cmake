# The synthetic-model generator (synth.h) as a static library, shared by moert-synth
# and moert-bench --synthetic. Included from tools/ and from bench/, which can be
# built without each other (MOERT_BUILD_TOOLS, MOERT_BUILD_BENCH); the first defines it.
if(NOT TARGET moert_synth_lib)
  add_library(moert_synth_lib STATIC ${CMAKE_CURRENT_LIST_DIR}/synth.cc)
  target_include_directories(moert_synth_lib PUBLIC ${CMAKE_CURRENT_LIST_DIR})
  target_link_libraries(moert_synth_lib PUBLIC moert_internal)
  moert_set_warnings(moert_synth_lib)
endif()
