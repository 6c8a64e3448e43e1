# Sources of src/vision (paths relative to src/).
list(APPEND MOERT_SOURCES
  vision/image.cc
  vision/preprocess.cc
  vision/mmproj.cc
  vision/encoder.cc
  vision/prompt.cc
  vision/image_embedding.cc
)
# Only image.cc includes stb_image (cmake/MoertDependencies.cmake finds it).
if(MOERT_STB_INCLUDE_DIR)
  set_source_files_properties(${CMAKE_CURRENT_SOURCE_DIR}/vision/image.cc PROPERTIES
    INCLUDE_DIRECTORIES "${MOERT_STB_INCLUDE_DIR}")
endif()
