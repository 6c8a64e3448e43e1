# Sources of src/model (paths relative to src/).
list(APPEND MOERT_SOURCES
  model/model.cc
  model/weights.cc
  model/embedding.cc
  model/weight_lock.cc
  model/decoder.cc
  model/expert_update.cc
  model/kv_cache.cc
  model/graph.cc
  model/perplexity.cc
  model/sampler.cc
  model/chat_template.cc
  model/stop.cc
)
