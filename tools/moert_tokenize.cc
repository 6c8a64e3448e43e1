// moert-tokenize: prints the token ids of a text for a GGUF file's vocabulary, on
// one line separated by spaces (llama-tokenize --ids without the brackets and commas).
// Scripts compare its output with llama.cpp's, so the defaults follow llama-tokenize:
// BOS when the vocabulary adds it, escapes (\n, \t, ...) processed, special tokens
// written in the text recognised.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "cli_escapes.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

constexpr char kUsage[] =
    "usage: moert-tokenize -m FILE (-p TEXT | -f TEXT_FILE) [options]\n"
    "\n"
    "Prints the token ids of TEXT for the vocabulary of the GGUF FILE on one line,\n"
    "separated by spaces. FILE may hold only a vocabulary (no tensors).\n"
    "\n"
    "  -m, --model FILE        GGUF file to take the vocabulary from\n"
    "  -p, --prompt TEXT       text to tokenize\n"
    "  -f, --file TEXT_FILE    read the text from a file instead\n"
    "  --no-bos                do not add BOS (added when the vocabulary asks for it)\n"
    "  --no-escape             take \\n, \\t, \\\\, \\xHH ... literally\n"
    "  --no-parse-special      do not recognise control tokens written in the text\n"
    "  -h, --help              show this help\n";

int Fail(const std::string& message) {
  std::fprintf(stderr, "moert-tokenize: error: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path;
  std::string prompt;
  std::string text_path;
  bool have_prompt = false;
  bool no_bos = false;
  bool escape = true;
  bool parse_special = true;

  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "-m" || arg == "--model") {
      if (!value(&model_path)) return Fail("-m needs a FILE (see --help)");
    } else if (arg == "-p" || arg == "--prompt") {
      if (!value(&prompt)) return Fail("-p needs a TEXT (see --help)");
      have_prompt = true;
    } else if (arg == "-f" || arg == "--file") {
      if (!value(&text_path)) return Fail("-f needs a TEXT_FILE (see --help)");
    } else if (arg == "--no-bos") {
      no_bos = true;
    } else if (arg == "--no-escape") {
      escape = false;
    } else if (arg == "--no-parse-special") {
      parse_special = false;
    } else {
      return Fail("unknown argument '" + std::string(arg) + "' (see --help)");
    }
  }
  if (model_path.empty()) return Fail("no model: give -m FILE (see --help)");
  if (have_prompt == !text_path.empty()) {
    return Fail("give exactly one of -p TEXT and -f TEXT_FILE (see --help)");
  }

  std::string text = prompt;
  if (!text_path.empty()) {
    std::ifstream in(text_path, std::ios::binary);
    if (!in) return Fail("cannot read '" + text_path + "'");
    std::ostringstream contents;
    contents << in.rdbuf();
    text = contents.str();
  }
  if (escape) text = moert::tools::ProcessEscapes(text);

  auto file = moert::format::GgufFile::Open(model_path);
  if (!file.ok()) return Fail(std::string(file.status().message()));
  auto tokenizer = moert::tokenizer::Tokenizer::FromGguf(**file);
  if (!tokenizer.ok()) return Fail(std::string(tokenizer.status().message()));

  const bool add_bos = tokenizer->vocab().add_bos() && !no_bos;
  // As llama-tokenize: add_special is add_bos, so --no-bos also drops an added EOS.
  const std::vector<moert::tokenizer::TokenId> ids =
      tokenizer->Encode(text, add_bos, parse_special);
  std::string line;
  line.reserve(ids.size() * 6);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) line += ' ';
    line += std::to_string(ids[i]);
  }
  line += '\n';
  if (std::fwrite(line.data(), 1, line.size(), stdout) != line.size() || std::fflush(stdout) != 0) {
    return Fail("cannot write the output");
  }
  return 0;
}
