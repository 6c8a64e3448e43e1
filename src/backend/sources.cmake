# Sources of src/backend (paths relative to src/).
list(APPEND MOERT_SOURCES
  backend/packing.cc
  backend/qmatmul.cc
)
