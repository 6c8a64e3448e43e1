# Sources of src/memory (paths relative to src/).
list(APPEND MOERT_SOURCES
  memory/budget.cc
  memory/buddy_allocator.cc
  memory/co_placement.cc
  memory/defragmenter.cc
  memory/tiered_pool.cc
)
