# Sources of src/router (paths relative to src/).
list(APPEND MOERT_SOURCES
  router/device_memory.cc
  router/resource_monitor.cc
  router/router.cc
  router/modality_bias.cc
)
