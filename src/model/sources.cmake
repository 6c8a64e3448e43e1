# Sources of src/model (paths relative to src/).
list(APPEND MOERT_SOURCES
  model/model.cc
  model/layers.cc
  model/weights.cc
  model/decoder.cc
  model/arch_llama.cc
  model/arch_qwen2.cc
  model/arch_qwen2moe.cc
  model/arch_qwen3.cc
  model/arch_qwen3moe.cc
  model/arch_olmoe.cc
  model/perplexity.cc
  model/sampler.cc
  model/chat_template.cc
  model/stop.cc
)
# The model's forward on the OpenCL backend (MOERT_HAVE_OPENCL, cmake/MoertOpenCL.cmake).
if(MOERT_HAVE_OPENCL)
  list(APPEND MOERT_SOURCES model/opencl_decoder.cc)
endif()
