# Sources of src/format (paths relative to src/).
list(APPEND MOERT_SOURCES
  format/ggml_types.cc
  format/gguf_reader.cc
  format/gguf_writer.cc
  format/dequant.cc
  format/arch.cc
  format/model_spec.cc
  format/quantize.cc
)
