# Sources of src/pipeline (paths relative to src/).
list(APPEND MOERT_SOURCES
  pipeline/prefetcher.cc
  pipeline/moe_scheduler.cc
  pipeline/degrade_policy.cc
)
