# Sources of src/tokenizer (paths relative to src/).
list(APPEND MOERT_SOURCES
  tokenizer/unicode.cc
  tokenizer/unicode_data.cc
  tokenizer/regex.cc
  tokenizer/pretokenizer.cc
  tokenizer/vocab.cc
  tokenizer/tokenizer.cc
  tokenizer/spm.cc
  tokenizer/bpe.cc
)
