# Sources of src/memory (paths relative to src/).
list(APPEND MOERT_SOURCES
)
