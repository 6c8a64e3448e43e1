// Tests of the vocabulary loader and the tokenizers: hand-built vocabularies for the
// merge rules, special tokens, decoding and errors; llama.cpp's own test vectors
// (shared/vocab) and the tiny model's reference token ids (shared/models) for
// exactness against llama.cpp.
#include "tokenizer/tokenizer.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tokenizer/vocab.h"

namespace moert::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kSharedDir[] = MOERT_SHARED_DIR;
constexpr char kSpace[] = "\xe2\x96\x81";  // U+2581, SentencePiece's space

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

std::vector<TokenId> ParseIds(const std::string& line) {
  std::vector<TokenId> ids;
  std::istringstream in(line);
  for (TokenId id; in >> id;) ids.push_back(id);
  return ids;
}

std::string Join(const std::vector<TokenId>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? " " : "") + std::to_string(ids[i]);
  return out;
}

// Loads a shared GGUF file's tokenizer once per test binary (the big vocabularies
// take a while under emulation).
const Tokenizer& SharedTokenizer(const std::string& relative_path) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<Tokenizer>& slot = cache[relative_path];
  if (slot == nullptr) {
    const std::string path = std::string(kSharedDir) + "/" + relative_path;
    auto file = format::GgufFile::Open(path);
    EXPECT_TRUE(file.ok()) << file.status();
    if (!file.ok()) std::abort();
    auto tokenizer = Tokenizer::FromGguf(**file);
    EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
    if (!tokenizer.ok()) std::abort();
    slot = std::make_unique<Tokenizer>(*std::move(tokenizer));
  }
  return *slot;
}

const Tokenizer& ModelTokenizer() {
  return SharedTokenizer("models/tiny-moe-shakespeare-q8_0.gguf");
}

// A small SentencePiece vocabulary: <unk> <s> </s>, the 256 byte tokens, then
// `pieces` (text, score) as normal tokens and `user_defined` texts.
struct SpmVocab {
  static constexpr TokenId kFirstPiece = 3 + 256;
  VocabSource source;
  explicit SpmVocab(std::vector<std::pair<std::string, float>> pieces,
                    std::vector<std::string> user_defined = {}) {
    source.model = "llama";
    auto add = [&](std::string text, float score, TokenType type) {
      source.tokens.push_back(std::move(text));
      source.scores.push_back(score);
      source.token_types.push_back(static_cast<int32_t>(type));
    };
    add("<unk>", 0, TokenType::kUnknown);
    add("<s>", 0, TokenType::kControl);
    add("</s>", 0, TokenType::kControl);
    for (int b = 0; b < 256; ++b) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
      add(hex, 0, TokenType::kByte);
    }
    for (auto& [text, score] : pieces) add(text, score, TokenType::kNormal);
    for (auto& text : user_defined) add(text, 0, TokenType::kUserDefined);
  }
  Tokenizer Build() const {
    auto vocab = Vocab::FromSource(source);
    EXPECT_TRUE(vocab.ok()) << vocab.status();
    return Tokenizer(*std::move(vocab));
  }
};

TokenId ByteId(uint8_t b) { return 3 + b; }

std::string Sp(const std::string& text) {  // "a b" -> "▁a▁b"
  std::string out;
  for (char c : text) out += c == ' ' ? std::string(kSpace) : std::string(1, c);
  return out;
}

// --- SentencePiece ------------------------------------------------------------------

TEST(SpmTest, MergesHighestScoreFirst) {
  SpmVocab v({{"a", -1}, {"b", -1}, {"c", -1}, {"ab", -2}, {"bc", -1}});
  v.source.add_space_prefix = false;
  const Tokenizer tok = v.Build();
  const TokenId a = SpmVocab::kFirstPiece, bc = a + 4;
  // "bc" scores higher than "ab", so it is merged first and "ab" never forms.
  EXPECT_THAT(tok.Encode("abc", false), ElementsAre(a, bc));
}

TEST(SpmTest, EqualScoresMergeLeftmostFirst) {
  SpmVocab v({{"a", -1}, {"b", -1}, {"c", -1}, {"ab", -1}, {"bc", -1}});
  v.source.add_space_prefix = false;
  const Tokenizer tok = v.Build();
  const TokenId c = SpmVocab::kFirstPiece + 2, ab = c + 1;
  EXPECT_THAT(tok.Encode("abc", false), ElementsAre(ab, c));
}

TEST(SpmTest, SpacePrefixAndBos) {
  SpmVocab v({{kSpace, -1}, {"h", -1}, {"i", -1}, {Sp(" h"), -1}, {Sp(" hi"), -1}});
  const Tokenizer tok = v.Build();
  const TokenId hi = SpmVocab::kFirstPiece + 4;
  EXPECT_TRUE(tok.vocab().add_bos());
  EXPECT_TRUE(tok.vocab().add_space_prefix());
  EXPECT_THAT(tok.Encode("hi"), ElementsAre(1, hi));
  EXPECT_THAT(tok.Encode("hi hi", false), ElementsAre(hi, hi));
  EXPECT_THAT(tok.Encode("", true), ElementsAre(1));
  EXPECT_THAT(tok.Encode("", false), ElementsAre());
}

TEST(SpmTest, ByteFallbackForUnknownCharacters) {
  SpmVocab v({{kSpace, -1}, {"a", -1}});
  const Tokenizer tok = v.Build();
  const TokenId space = SpmVocab::kFirstPiece, a = space + 1;
  // "é" is C3 A9 and no token: byte tokens; "€" E2 82 AC likewise.
  EXPECT_THAT(
      tok.Encode("a\xc3\xa9\xe2\x82\xac", false),
      ElementsAre(space, a, ByteId(0xC3), ByteId(0xA9), ByteId(0xE2), ByteId(0x82), ByteId(0xAC)));
}

TEST(SpmTest, ControlTokensOnlyWithParseSpecialUserDefinedAlways) {
  SpmVocab v({{kSpace, -1}, {"<", -1}, {">", -1}, {"s", -1}, {"x", -1}, {Sp(" x"), -1}}, {"<tag>"});
  const Tokenizer tok = v.Build();
  const TokenId space = SpmVocab::kFirstPiece, lt = space + 1, gt = space + 2, s = space + 3,
                x = space + 4, sp_x = space + 5, tag = space + 6;
  // Without parse_special, "<s>" is plain text.
  EXPECT_THAT(tok.Encode("x<s>x", false, false), ElementsAre(sp_x, lt, s, gt, x));
  // With it, <s> is BOS, and the text after it gets the space prefix again.
  EXPECT_THAT(tok.Encode("x<s>x", false, true), ElementsAre(sp_x, 1, sp_x));
  // A user-defined token is matched either way.
  EXPECT_THAT(tok.Encode("x<tag>x", false, false), ElementsAre(sp_x, tag, sp_x));
}

TEST(SpmTest, LongerSpecialTokenWins) {
  SpmVocab v({{kSpace, -1}, {"a", -1}}, {"<a>", "<a><a>"});
  const Tokenizer tok = v.Build();
  const TokenId one = SpmVocab::kFirstPiece + 2, two = one + 1;
  EXPECT_THAT(tok.Encode("<a><a><a>", false), ElementsAre(two, one));
}

TEST(SpmTest, DecodeAndPieces) {
  SpmVocab v({{kSpace, -1}, {"h", -1}, {"i", -1}, {Sp(" h"), -1}, {Sp(" hi"), -1}});
  const Tokenizer tok = v.Build();
  const TokenId hi = SpmVocab::kFirstPiece + 4;
  EXPECT_EQ(tok.TokenToPiece(hi), " hi");
  EXPECT_EQ(tok.TokenToPiece(1), "");
  EXPECT_EQ(tok.TokenToPiece(1, /*special=*/true), "<s>");
  EXPECT_EQ(tok.TokenToPiece(ByteId('A')), "A");
  EXPECT_EQ(tok.TokenToPiece(-1), "");
  EXPECT_EQ(tok.TokenToPiece(100000), "");
  // The space SentencePiece added in front is dropped...
  EXPECT_EQ(tok.Decode(std::vector<TokenId>{hi, hi}), "hi hi");
  // ...except after a leading BOS, as llama.cpp's detokenize does.
  EXPECT_EQ(tok.Decode(std::vector<TokenId>{1, hi}), " hi");
  EXPECT_EQ(tok.Decode(std::vector<TokenId>{1, hi}, /*special=*/true), "<s> hi");
  // Byte tokens put raw bytes back together.
  EXPECT_EQ(tok.Decode(tok.Encode("hi \xc3\xa9!", false)), "hi \xc3\xa9!");
}

TEST(StreamDecoderTest, HoldsBackSplitCharacters) {
  SpmVocab v({{kSpace, -1}, {"a", -1}});
  const Tokenizer tok = v.Build();
  const TokenId a = SpmVocab::kFirstPiece + 1;
  StreamDecoder stream(tok);
  EXPECT_EQ(stream.Push(a), "a");
  // "€" = E2 82 AC arrives one byte token at a time.
  EXPECT_EQ(stream.Push(ByteId(0xE2)), "");
  EXPECT_EQ(stream.Push(ByteId(0x82)), "");
  EXPECT_EQ(stream.Push(ByteId(0xAC)), "\xe2\x82\xac");
  // "é" = C3 A9 split, with ASCII after it.
  EXPECT_EQ(stream.Push(ByteId(0xC3)), "");
  EXPECT_EQ(stream.Push(ByteId(0xA9)), "\xc3\xa9");
  EXPECT_EQ(stream.Push(a), "a");
  EXPECT_EQ(stream.Flush(), "");
  // A character cut off at the end comes out of Flush as raw bytes.
  EXPECT_EQ(stream.Push(ByteId(0xF0)), "");
  EXPECT_EQ(stream.Push(ByteId(0x9F)), "");
  EXPECT_EQ(stream.Flush(), "\xf0\x9f");
  EXPECT_EQ(stream.Flush(), "");
  // A stray continuation byte can never complete and is not held back.
  EXPECT_EQ(stream.Push(ByteId(0x80)), "\x80");
  // Control tokens are empty unless asked for.
  EXPECT_EQ(stream.Push(2), "");
  StreamDecoder special(tok, /*special=*/true);
  EXPECT_EQ(special.Push(2), "</s>");
}

TEST(StreamDecoderTest, MatchesPiecesOfTheModel) {
  const Tokenizer& tok = ModelTokenizer();
  const std::string text = "KING HENRY: caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\xa6\x99!";
  const std::vector<TokenId> ids = tok.Encode(text, false);
  StreamDecoder stream(tok);
  std::string streamed;
  for (TokenId id : ids) {
    const std::string part = stream.Push(id);
    streamed += part;
    // Every chunk is whole characters: it never ends in a lead or continuation byte
    // that a later token completes.
    if (!part.empty()) {
      EXPECT_NE(static_cast<uint8_t>(part.back()) & 0xC0, 0xC0) << Join(ids);
    }
  }
  streamed += stream.Flush();
  EXPECT_EQ(streamed, " " + text);  // the streamed first token keeps its space
}

// --- byte-level BPE ------------------------------------------------------------------

VocabSource BpeSource(std::string pre, std::vector<std::string> tokens,
                      std::vector<std::string> merges) {
  VocabSource source;
  source.model = "gpt2";
  source.pre = std::move(pre);
  source.tokens = std::move(tokens);
  source.merges = std::move(merges);
  return source;
}

TEST(BpeTest, MergesLowestRankFirst) {
  // ids: a=0 b=1 c=2 ab=3 bc=4 abc=5
  const std::vector<std::string> tokens = {"a", "b", "c", "ab", "bc", "abc"};
  auto v1 = Vocab::FromSource(BpeSource("gpt-2", tokens, {"b c", "a b", "a bc"}));
  ASSERT_TRUE(v1.ok()) << v1.status();
  EXPECT_THAT(Tokenizer(*std::move(v1)).Encode("abc", false), ElementsAre(5));
  auto v2 = Vocab::FromSource(BpeSource("gpt-2", tokens, {"a b", "b c", "a bc"}));
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_THAT(Tokenizer(*std::move(v2)).Encode("abc", false), ElementsAre(3, 2));
}

TEST(BpeTest, Llama3IgnoresMergesForWholeTokens) {
  const std::vector<std::string> tokens = {"a", "b", "c", "ab", "bc", "abc"};
  VocabSource source = BpeSource("llama-bpe", tokens, {"a b"});
  source.bos_id = 0;  // llama3 adds BOS, so it needs one
  auto v = Vocab::FromSource(source);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->ignore_merges());
  EXPECT_TRUE(v->add_bos());
  // "abc" is a token, so the merges (which would stop at "ab" "c") are not used.
  EXPECT_THAT(Tokenizer(*std::move(v)).Encode("abc", false), ElementsAre(5));
}

TEST(BpeTest, ByteLevelRoundTrip) {
  const Tokenizer& gpt2 = SharedTokenizer("vocab/ggml-vocab-gpt-2.gguf");
  EXPECT_THAT(gpt2.Encode("Hello world", false), ElementsAre(15496, 995));
  EXPECT_EQ(gpt2.TokenToPiece(995), " world");
  EXPECT_FALSE(gpt2.vocab().add_bos());
  for (const std::string text :
       {"Hello world", " this is \xf0\x9f\xa6\x99.cpp",
        "\xd0\xbd\xd0\xb5\xd1\x89\xd0\xbe \xe4\xbd\xa0\xe5\xa5\xbd\n\n\t x"}) {
    EXPECT_EQ(gpt2.Decode(gpt2.Encode(text, false)), text);
  }
  // gpt-2 cleans up spaces before punctuation when decoding (clean_spaces).
  EXPECT_EQ(gpt2.Decode(gpt2.Encode("Hello , world !", false)), "Hello, world!");
  // The end-of-text token is matched only with parse_special.
  EXPECT_THAT(gpt2.Encode("<|endoftext|>", false, true), ElementsAre(50256));
  EXPECT_GT(gpt2.Encode("<|endoftext|>", false, false).size(), 1u);
  EXPECT_TRUE(gpt2.vocab().IsEog(50256));
}

// --- llama.cpp's test vectors ---------------------------------------------------------

class OracleTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OracleTest, MatchesLlamaCpp) {
  const std::string base = std::string(kSharedDir) + "/vocab/ggml-vocab-" + GetParam() + ".gguf";
  const Tokenizer& tok = SharedTokenizer("vocab/ggml-vocab-" + GetParam() + ".gguf");

  // As llama.cpp's test-tokenizer-0: cases are separated by "\n__ggml_vocab_test__\n".
  const std::string raw = ReadFile(base + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  for (size_t pos = 0; pos < raw.size();) {
    const size_t next = raw.find(sep, pos);
    if (next == std::string::npos) {
      inputs.push_back(raw.substr(pos));
      break;
    }
    inputs.push_back(raw.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<std::string> outputs;
  std::istringstream out_lines(ReadFile(base + ".out"));
  for (std::string line; std::getline(out_lines, line);) outputs.push_back(line);
  ASSERT_EQ(inputs.size(), outputs.size());
  ASSERT_GT(inputs.size(), 40u);

  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::vector<TokenId> expected = ParseIds(outputs[i]);
    const std::vector<TokenId> got = tok.Encode(inputs[i], /*add_special=*/false,
                                                /*parse_special=*/false);
    EXPECT_EQ(Join(got), Join(expected)) << "case " << i << ": '" << inputs[i] << "'";
    // Decoding gives the text back where the vocabulary does not clean up spaces.
    if (!tok.vocab().clean_spaces()) {
      EXPECT_EQ(tok.Decode(got), inputs[i]) << "case " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, OracleTest,
                         ::testing::Values("llama-spm", "gpt-2", "deepseek-llm", "falcon"),
                         [](const auto& test_info) {
                           std::string name = test_info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

// --- the tiny model's reference (shared/models/REFERENCE.md) --------------------------

TEST(ModelTokenizerTest, Vocabulary) {
  const Vocab& vocab = ModelTokenizer().vocab();
  EXPECT_EQ(vocab.type(), VocabType::kSpm);
  EXPECT_EQ(vocab.size(), 2048);
  EXPECT_EQ(vocab.bos(), 1);
  EXPECT_EQ(vocab.eos(), 2);
  EXPECT_EQ(vocab.unk(), 0);
  EXPECT_TRUE(vocab.add_bos());
  EXPECT_FALSE(vocab.add_eos());
  EXPECT_TRUE(vocab.add_space_prefix());
  EXPECT_TRUE(vocab.IsEog(2));
  EXPECT_FALSE(vocab.IsEog(1));
}

TEST(ModelTokenizerTest, SampleWithBos) {
  const std::string sample =
      "First Citizen:\nBefore we proceed any further, hear me speak.\n  KING HENRY VI, 1234 -- "
      "what's this?";
  EXPECT_EQ(Join(ModelTokenizer().Encode(sample)),
            "1 650 996 2007 13 2026 1985 565 341 586 1749 806 1918 711 1999 693 326 626 2009 13 "
            "1984 499 745 964 1999 1984 52 53 2045 55 1984 535 454 2014 1990 373 2028");
}

TEST(ModelTokenizerTest, Prompts) {
  const Tokenizer& tok = ModelTokenizer();
  EXPECT_EQ(Join(tok.Encode("ROMEO:")), "1 826 2007");
  EXPECT_EQ(Join(tok.Encode("First Citizen:\nBefore we proceed")),
            "1 650 996 2007 13 2026 1985 565 341 586 1749");
  EXPECT_EQ(Join(tok.Encode("KING HENRY")), "1 499 745");
  // prompts.txt holds the same prompts with "\n" written as backslash-n.
  std::istringstream prompts(ReadFile(std::string(kSharedDir) + "/models/prompts.txt"));
  std::string line;
  ASSERT_TRUE(std::getline(prompts, line));
  EXPECT_EQ(Join(tok.Encode(line)), "1 826 2007");
}

TEST(ModelTokenizerTest, ValidationTextCount) {
  const Tokenizer& tok = ModelTokenizer();
  const std::string text = ReadFile(std::string(kSharedDir) + "/models/valid.txt");
  ASSERT_GT(text.size(), 100000u);
  const std::vector<TokenId> ids = tok.Encode(text);
  EXPECT_EQ(ids.size(), 46251u);
  EXPECT_EQ(ids.front(), 1);
  // Without the BOS, the first token's added space is dropped again.
  EXPECT_EQ(tok.Decode(std::span<const TokenId>(ids).subspan(1)), text);
}

// --- loading and validation ----------------------------------------------------------

TEST(VocabTest, DefaultsPerModelType) {
  SpmVocab spm({{"a", -1}});
  auto v = Vocab::FromSource(spm.source);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->bos(), 1);
  EXPECT_EQ(v->eos(), 2);
  EXPECT_EQ(v->unk(), 0);
  EXPECT_EQ(v->eot(), kNoToken);
  EXPECT_TRUE(v->add_bos());
  EXPECT_FALSE(v->add_eos());
  EXPECT_TRUE(v->add_space_prefix());
  EXPECT_FALSE(v->clean_spaces());

  spm.source.add_space_prefix = false;
  spm.source.add_bos = false;
  spm.source.add_eos = true;
  spm.source.eos_id = 5;
  v = Vocab::FromSource(spm.source);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE(v->add_space_prefix());
  EXPECT_FALSE(v->add_bos());
  EXPECT_TRUE(v->add_eos());
  EXPECT_EQ(v->eos(), 5);

  // gpt2: BOS = EOS = 11 by default, dropped when the vocabulary is smaller.
  auto bpe = Vocab::FromSource(BpeSource("gpt-2", {"a", "b", "ab"}, {"a b"}));
  ASSERT_TRUE(bpe.ok()) << bpe.status();
  EXPECT_EQ(bpe->bos(), kNoToken);
  EXPECT_EQ(bpe->eos(), kNoToken);
  EXPECT_EQ(bpe->unk(), kNoToken);
  EXPECT_FALSE(bpe->add_bos());
  EXPECT_FALSE(bpe->add_space_prefix());
  EXPECT_TRUE(bpe->clean_spaces());
  EXPECT_EQ(bpe->MergeRank(0, 1), 0);
  EXPECT_EQ(bpe->MergeRank(1, 0), -1);
}

TEST(VocabTest, DetectsEndOfTurnByText) {
  auto v = Vocab::FromSource(BpeSource("gpt-2", {"a", "b", "ab", "<|im_end|>"}, {"a b"}));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->eot(), 3);
  EXPECT_TRUE(v->IsEog(3));
  EXPECT_TRUE(v->IsControl(3));  // promoted from normal, as llama.cpp does
}

absl::Status SourceError(const VocabSource& source) { return Vocab::FromSource(source).status(); }

TEST(VocabTest, RejectsUnsupportedModels) {
  VocabSource source = SpmVocab({{"a", -1}}).source;
  source.model = "bert";
  const absl::Status status = SourceError(source);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("'bert'"));

  auto bpe = BpeSource("no-such-pre", {"a", "b", "ab"}, {"a b"});
  EXPECT_EQ(SourceError(bpe).code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(SourceError(bpe).message(), HasSubstr("no-such-pre"));
}

TEST(VocabTest, RejectsInconsistentArrays) {
  VocabSource source = SpmVocab({{"a", -1}}).source;
  source.scores.pop_back();
  EXPECT_THAT(SourceError(source).message(), HasSubstr("tokenizer.ggml.scores has 259"));

  source = SpmVocab({{"a", -1}}).source;
  source.token_types.push_back(1);
  EXPECT_THAT(SourceError(source).message(), HasSubstr("tokenizer.ggml.token_type has 261"));

  source = SpmVocab({{"a", -1}}).source;
  source.tokens.clear();
  source.scores.clear();
  source.token_types.clear();
  EXPECT_THAT(SourceError(source).message(), HasSubstr("tokenizer.ggml.tokens is empty"));

  source = SpmVocab({{"a", -1}, {"a", -2}}).source;
  EXPECT_THAT(SourceError(source).message(),
              HasSubstr("tokenizer.ggml.tokens[260] 'a' duplicates tokenizer.ggml.tokens[259]"));

  source = SpmVocab({{"a", -1}}).source;
  source.token_types[259] = static_cast<int32_t>(TokenType::kByte);
  EXPECT_THAT(SourceError(source).message(), HasSubstr("tokenizer.ggml.token_type[259]"));
}

TEST(VocabTest, RejectsIdsOutOfRange) {
  VocabSource source = SpmVocab({{"a", -1}}).source;
  source.bos_id = 260;
  EXPECT_EQ(SourceError(source).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(SourceError(source).message(),
              HasSubstr("tokenizer.ggml.bos_token_id = 260 is out of range (260 tokens)"));
  source.bos_id = -1;
  EXPECT_THAT(SourceError(source).message(), HasSubstr("tokenizer.ggml.bos_token_id"));

  source = SpmVocab({{"a", -1}}).source;
  source.pad_id = 1000;
  EXPECT_THAT(SourceError(source).message(), HasSubstr("tokenizer.ggml.padding_token_id"));

  // add_bos_token without any BOS.
  auto bpe = BpeSource("gpt-2", {"a", "b", "ab"}, {"a b"});
  bpe.add_bos = true;
  EXPECT_THAT(SourceError(bpe).message(), HasSubstr("tokenizer.ggml.add_bos_token is true"));
}

TEST(VocabTest, RejectsBadMerges) {
  auto bpe = BpeSource("gpt-2", {"a", "b", "ab"}, {"a b", "a c"});
  EXPECT_THAT(SourceError(bpe).message(),
              HasSubstr("tokenizer.ggml.merges[1] 'a c' names 'c', which is not in"));
  bpe = BpeSource("gpt-2", {"a", "b", "ab"}, {"ab"});
  EXPECT_THAT(SourceError(bpe).message(), HasSubstr("tokenizer.ggml.merges[0] 'ab'"));
  bpe = BpeSource("gpt-2", {"a", "b", "ab"}, {});
  EXPECT_THAT(SourceError(bpe).message(), HasSubstr("tokenizer.ggml.merges"));
}

// Builds a GGUF in memory and loads its vocabulary.
class GgufVocabTest : public ::testing::Test {
 protected:
  absl::StatusOr<Vocab> Load() {
    bytes_ = writer_.Serialize();
    auto file = format::GgufFile::FromBuffer(bytes_, "test.gguf");
    if (!file.ok()) return file.status();
    return Vocab::FromGguf(**file);
  }
  void WriteSpm() {
    writer_.SetString("tokenizer.ggml.model", "llama");
    writer_.SetStringArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"});
    writer_.SetFloat32Array("tokenizer.ggml.scores", {0, 0, 0, -1});
    writer_.SetInt32Array("tokenizer.ggml.token_type", {2, 3, 3, 1});
  }
  format::GgufWriter writer_;
  std::vector<uint8_t> bytes_;
};

TEST_F(GgufVocabTest, ReadsKeys) {
  WriteSpm();
  writer_.SetUint32("tokenizer.ggml.bos_token_id", 2);
  writer_.SetUint32("tokenizer.ggml.eos_token_id", 1);
  writer_.SetBool("tokenizer.ggml.add_bos_token", false);
  writer_.SetBool("tokenizer.ggml.add_space_prefix", false);
  auto vocab = Load();
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  EXPECT_EQ(vocab->size(), 4);
  EXPECT_EQ(vocab->bos(), 2);
  EXPECT_EQ(vocab->eos(), 1);
  EXPECT_FALSE(vocab->add_bos());
  EXPECT_FALSE(vocab->add_space_prefix());
  EXPECT_EQ(vocab->score(3), -1);
  EXPECT_TRUE(vocab->IsUnknown(0));
  EXPECT_TRUE(vocab->IsControl(1));
  EXPECT_THAT(Tokenizer(*std::move(vocab)).Encode("aa"), ElementsAre(3, 3));
}

TEST_F(GgufVocabTest, MissingModel) {
  writer_.SetStringArray("tokenizer.ggml.tokens", {"a"});
  const absl::Status status = Load().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("tokenizer.ggml.model"));
  EXPECT_THAT(status.message(), HasSubstr("test.gguf"));
}

TEST_F(GgufVocabTest, MissingTokens) {
  writer_.SetString("tokenizer.ggml.model", "llama");
  const absl::Status status = Load().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("tokenizer.ggml.tokens"));
}

TEST_F(GgufVocabTest, WrongTypes) {
  writer_.SetString("tokenizer.ggml.model", "llama");
  writer_.SetString("tokenizer.ggml.tokens", "a");
  EXPECT_THAT(Load().status().message(), HasSubstr("tokenizer.ggml.tokens"));

  writer_ = format::GgufWriter();
  WriteSpm();
  writer_.SetString("tokenizer.ggml.bos_token_id", "1");
  EXPECT_THAT(Load().status().message(), HasSubstr("tokenizer.ggml.bos_token_id"));
}

TEST_F(GgufVocabTest, MismatchedArrays) {
  writer_.SetString("tokenizer.ggml.model", "llama");
  writer_.SetStringArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"});
  writer_.SetFloat32Array("tokenizer.ggml.scores", {0, 0, 0});
  const absl::Status status = Load().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("tokenizer.ggml.scores has 3 entries"));
}

TEST_F(GgufVocabTest, UnknownModel) {
  writer_.SetString("tokenizer.ggml.model", "t5");
  writer_.SetStringArray("tokenizer.ggml.tokens", {"a"});
  const absl::Status status = Load().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("'t5'"));
}

}  // namespace
}  // namespace moert::tokenizer
