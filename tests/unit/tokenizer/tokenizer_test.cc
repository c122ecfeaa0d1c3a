#include "common/tokenizer/tokenizer.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "common/model/synthetic.h"
#include "common/tokenizer/llama2c_tokenizer.h"
#include "common/tokenizer/sentencepiece_tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/tokenizer/tokenizer_corpus.h"

namespace tandem {
namespace {

using ::tandem::testing::IsOkAndHolds;
using ::tandem::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> Split(const std::string& s, char separator) {
  std::vector<std::string> parts;
  size_t pos = 0;
  for (size_t next; (next = s.find(separator, pos)) != std::string::npos; pos = next + 1) {
    parts.push_back(s.substr(pos, next - pos));
  }
  parts.push_back(s.substr(pos));
  return parts;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A tokenizer.bin image: max_token_length, then {score, length, bytes}.
std::string MakeBin(int32_t max_token_length,
                    const std::vector<std::pair<float, std::string>>& tokens) {
  std::string out(reinterpret_cast<const char*>(&max_token_length), sizeof(int32_t));
  for (const auto& [score, piece] : tokens) {
    const int32_t len = static_cast<int32_t>(piece.size());
    out.append(reinterpret_cast<const char*>(&score), sizeof(float));
    out.append(reinterpret_cast<const char*>(&len), sizeof(int32_t));
    out.append(piece);
  }
  return out;
}

// <unk>, <s>, </s> and the 256 byte tokens every Llama vocabulary starts with.
std::vector<std::pair<float, std::string>> LlamaSpecialTokens() {
  std::vector<std::pair<float, std::string>> tokens = {
      {0.0f, "<unk>"}, {0.0f, "\n<s>\n"}, {0.0f, "\n</s>\n"}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    tokens.emplace_back(0.0f, name);
  }
  return tokens;
}

// Seeded word soup with punctuation, digits, newlines and runs of spaces.
std::string EnglishText(size_t min_chars) {
  const std::vector<std::string> words = Split(
      "the a little girl named Lily went to park and saw big red ball She was very happy played "
      "with her friend Tom under tree sky blue don't it's they'll we've 1984 3.14 42 e-mail "
      "U.S.A. tokenizer SentencePiece llama2.c isn't (quietly) \"yes\" HTTP JSON naïve café "
      "über résumé",
      ' ');
  static const char* const kSeparators[] = {" ",  " ",  " ",  " ",    ", ",  ". ", "! ", "? ",
                                            "; ", "  ", "\n", "\n\n", " - ", ": ", "\t"};
  std::mt19937 rng(20240611);
  std::string text;
  while (text.size() < min_chars) {
    text += words[rng() % words.size()];
    text += kSeparators[rng() % std::size(kSeparators)];
  }
  return text;
}

class LlamaVocabTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"tokenizer.model", "tokenizer.bin", "ggml-vocab-llama-spm.gguf.inp",
                             "ggml-vocab-llama-spm.gguf.out"}) {
      TANDEM_MODEL_FILE_OR_SKIP(path, name);
    }
    ASSERT_OK_AND_ASSIGN(sp_, LoadTokenizer(::tandem::testing::ModelFile("tokenizer.model")));
    ASSERT_OK_AND_ASSIGN(bin_, LoadTokenizer(::tandem::testing::ModelFile("tokenizer.bin")));
    tests_ = ::tandem::testing::ReadVocabTests(
        ::tandem::testing::ModelFile("ggml-vocab-llama-spm.gguf.inp"),
        ::tandem::testing::ModelFile("ggml-vocab-llama-spm.gguf.out"));
    ASSERT_GT(tests_.size(), 30u)
        << "the .inp and .out files are unreadable or disagree on the count";
  }

  std::unique_ptr<Tokenizer> sp_;
  std::unique_ptr<Tokenizer> bin_;
  std::vector<::tandem::testing::VocabTest> tests_;
};

TEST_F(LlamaVocabTest, LoadsEachFormatByContents) {
  EXPECT_NE(dynamic_cast<SentencePieceTokenizer*>(sp_.get()), nullptr);
  EXPECT_NE(dynamic_cast<Llama2cTokenizer*>(bin_.get()), nullptr);
  for (const Tokenizer* tok : {sp_.get(), bin_.get()}) {
    EXPECT_EQ(tok->vocab_size(), 32000);
    EXPECT_EQ(tok->bos_id(), 1);
    EXPECT_EQ(tok->eos_id(), 2);
  }
}

TEST_F(LlamaVocabTest, SentencePieceMatchesLlamaCppVectors) {
  ASSERT_EQ(tests_.size(), 46u);
  for (const ::tandem::testing::VocabTest& t : tests_) {
    EXPECT_THAT(sp_->Encode(t.input, /*add_bos=*/false), IsOkAndHolds(ElementsAreArray(t.ids)))
        << "input: \"" << absl::CHexEscape(t.input) << "\"";
  }
}

// Both follow SentencePiece's BPE exactly (same scores, same tie-break, same
// handling of characters outside the vocabulary), so there are no known
// differences on these inputs.
TEST_F(LlamaVocabTest, Llama2cMatchesLlamaCppVectorsAndSentencePiece) {
  for (const ::tandem::testing::VocabTest& t : tests_) {
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ids, bin_->Encode(t.input, /*add_bos=*/false));
    EXPECT_THAT(ids, ElementsAreArray(t.ids)) << "input: \"" << absl::CHexEscape(t.input) << "\"";
    EXPECT_THAT(sp_->Encode(t.input, false), IsOkAndHolds(ElementsAreArray(ids)));
  }
}

TEST_F(LlamaVocabTest, Llama2cAgreesWithSentencePieceOnEnglishText) {
  TANDEM_MODEL_FILE_OR_SKIP(story, "stories260K.greedy256.txt");
  const std::string text = ReadFile(story) + "\n" + EnglishText(6000);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> expected, sp_->Encode(text, /*add_bos=*/true));
  EXPECT_THAT(bin_->Encode(text, /*add_bos=*/true), IsOkAndHolds(ElementsAreArray(expected)));
  // Line by line too, so that every line gets its own dummy prefix.
  for (const std::string& line : Split(text, '\n')) {
    ASSERT_OK_AND_ASSIGN(expected, sp_->Encode(line, false));
    EXPECT_THAT(bin_->Encode(line, false), IsOkAndHolds(ElementsAreArray(expected)))
        << "line: \"" << absl::CHexEscape(line) << "\"";
  }
}

// Random strings of fragments that stress what a hand-written BPE may get
// wrong: malformed UTF-8 (SentencePiece turns each bad byte into U+FFFD),
// NUL, characters outside the vocabulary, control and byte token spellings.
TEST_F(LlamaVocabTest, Llama2cAgreesWithSentencePieceOnOddText) {
  static const char* const kFragments[] = {" ",
                                           "  ",
                                           "\n",
                                           "\t",
                                           "\r\n",
                                           "the",
                                           "ing",
                                           "<s>",
                                           "</s>",
                                           "<unk>",
                                           "<0x41>",
                                           "<0x0A>",
                                           "\xFF",
                                           "\x80",
                                           "\xE4\xB8",
                                           "\xC0\xAF",
                                           "\xED\xA0\x80",
                                           "\xF4\x90\x80\x80",
                                           "中文",
                                           "😀",
                                           "\xEF\xBF\xBD",
                                           "é",
                                           "▁",
                                           "▁▁a",
                                           "ẞ",
                                           "ℌ",
                                           "0",
                                           "99"};
  std::mt19937 rng(7);
  for (int round = 0; round < 300; ++round) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) text += kFragments[rng() % std::size(kFragments)];
    text += std::string(1, '\0') + "x";
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> expected, sp_->Encode(text, false));
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ids, bin_->Encode(text, false));
    EXPECT_THAT(ids, ElementsAreArray(expected)) << "text: \"" << absl::CHexEscape(text) << "\"";
  }
}

TEST_F(LlamaVocabTest, DecodeAgreesOnEveryId) {
  for (int32_t id = 0; id < sp_->vocab_size(); ++id) {
    for (int32_t prev : {-1, 1, 29871}) {
      ASSERT_OK_AND_ASSIGN(std::string expected, sp_->Decode(prev, id));
      ASSERT_THAT(bin_->Decode(prev, id), IsOkAndHolds(expected))
          << "id " << id << " after " << prev;
    }
  }
  EXPECT_THAT(sp_->Decode(1, 0), IsOkAndHolds(" \xE2\x81\x87 "));
  EXPECT_THAT(sp_->Decode(0, 1), IsOkAndHolds(""));
  EXPECT_THAT(sp_->Decode(0, 13), IsOkAndHolds("\n"));  // <0x0A>
  EXPECT_THAT(sp_->Decode(0, 15043), IsOkAndHolds(" Hello"));
  EXPECT_THAT(sp_->Decode(1, 15043), IsOkAndHolds("Hello"));
}

TEST_F(LlamaVocabTest, EmptyTextIsNoTokens) {
  for (const Tokenizer* tok : {sp_.get(), bin_.get()}) {
    EXPECT_THAT(tok->Encode("", false), IsOkAndHolds(IsEmpty()));
    EXPECT_THAT(tok->Encode("", true), IsOkAndHolds(ElementsAre(1)));
  }
}

TEST_F(LlamaVocabTest, OutOfRangeIdIsInvalidArgument) {
  for (const Tokenizer* tok : {sp_.get(), bin_.get()}) {
    for (int32_t id : {-1, 32000, INT32_MAX}) {
      EXPECT_THAT(tok->Decode(1, id),
                  StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out of range")));
    }
  }
}

class Tok512Test : public ::testing::Test {
 protected:
  void SetUp() override {
    TANDEM_MODEL_FILE_OR_SKIP(path, "tok512.bin");
    ASSERT_OK_AND_ASSIGN(tok_, LoadTokenizer(path));
  }

  std::string DecodeAll(const std::vector<int32_t>& ids) {
    std::string text;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto piece = tok_->Decode(i == 0 ? -1 : ids[i - 1], ids[i]);
      EXPECT_TRUE(piece.ok()) << piece.status();
      if (piece.ok()) text += *piece;
    }
    return text;
  }

  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(Tok512Test, RoundTripsSentences) {
  EXPECT_EQ(tok_->vocab_size(), 512);
  for (const std::string text :
       {"Once upon a time, there was a little girl named Lily.",
        "She loved to play outside in the sunshine!\nOne day, she saw a big, red ball.",
        " Two leading spaces  and\ttabs\tstay.", "Numbers 12345 and symbols #@~ too.",
        "Ünïcödé and 中文 fall back to bytes."}) {
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ids, tok_->Encode(text, /*add_bos=*/true));
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], tok_->bos_id());
    EXPECT_LT(ids.size(), text.size() + 2);
    EXPECT_EQ(DecodeAll(ids), text);
  }
}

TEST_F(Tok512Test, PieceAfterBosLosesLeadingSpace) {
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ids, tok_->Encode("Once upon a time", false));
  ASSERT_FALSE(ids.empty());
  ASSERT_OK_AND_ASSIGN(std::string plain, tok_->Decode(-1, ids[0]));
  ASSERT_EQ(plain.substr(0, 1), " ");
  EXPECT_THAT(tok_->Decode(tok_->bos_id(), ids[0]), IsOkAndHolds(plain.substr(1)));
  EXPECT_THAT(tok_->Decode(tok_->bos_id(), tok_->eos_id()), IsOkAndHolds(""));
}

TEST(SyntheticTokenizer, LoadsAndRoundTripsText) {
  ASSERT_OK_AND_ASSIGN(std::string bytes, SyntheticTokenizerBytes(512));
  const std::string path = ::tandem::testing::TempDir() + "/synthetic-tokenizer.bin";
  WriteFile(path, bytes);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(path));
  EXPECT_EQ(tok->vocab_size(), 512);
  const std::string text = "the cat sat on a mat, happily; Zoë!";
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ids, tok->Encode(text, /*add_bos=*/true));
  // Word pieces merge: fewer ids than bytes.
  EXPECT_LT(ids.size(), text.size());
  std::string decoded;
  for (size_t i = 1; i < ids.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(std::string piece, tok->Decode(ids[i - 1], ids[i]));
    decoded += piece;
  }
  EXPECT_EQ(decoded, text);
  EXPECT_THAT(SyntheticTokenizerBytes(259), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Llama2cTokenizer, MergesHighestScoreFirstLeftmostOnTies) {
  auto tokens = LlamaSpecialTokens();
  const int32_t first = static_cast<int32_t>(tokens.size());
  for (const char* piece : {" ", "a", "b", "c"}) tokens.emplace_back(-100.0f, piece);
  tokens.emplace_back(-1.0f, "ab");  // first + 4
  tokens.emplace_back(-2.0f, "bc");  // first + 5
  tokens.emplace_back(-1.0f, "ca");  // first + 6
  const std::string path = ::tandem::testing::TempDir() + "/tiny.bin";
  WriteFile(path, MakeBin(6, tokens));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(path));
  // "abc": ab (-1) beats bc (-2).
  EXPECT_THAT(tok->Encode("abc", false), IsOkAndHolds(ElementsAre(first, first + 4, first + 3)));
  // "cab": ca and ab tie at -1; the left pair wins.
  EXPECT_THAT(tok->Encode("cab", false), IsOkAndHolds(ElementsAre(first, first + 6, first + 2)));
  // "d" is not a piece: byte fallback, id = byte + 3.
  EXPECT_THAT(tok->Encode("d", false), IsOkAndHolds(ElementsAre(first, 'd' + 3)));
}

// Pieces may span a word start only in unusual vocabularies; then the whole
// text is one merge problem rather than one per word.
TEST(Llama2cTokenizer, MergesAcrossSpacesWhenAPieceSpansThem) {
  auto tokens = LlamaSpecialTokens();
  const int32_t first = static_cast<int32_t>(tokens.size());
  for (const char* piece : {" ", "a", "b"}) tokens.emplace_back(-100.0f, piece);
  tokens.emplace_back(-1.0f, "a ");  // first + 3
  tokens.emplace_back(-2.0f, " a");  // first + 4
  const std::string path = ::tandem::testing::TempDir() + "/spanning.bin";
  WriteFile(path, MakeBin(6, tokens));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(path));
  EXPECT_THAT(tok->Encode("a b", false), IsOkAndHolds(ElementsAre(first, first + 3, first + 2)));
}

class BadTokenizerFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = ::tandem::testing::TempDir() + "/" + name;
    WriteFile(path, bytes);
    return path;
  }
  static auto InvalidNaming(const std::string& path, const std::string& what) {
    return StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr(path), HasSubstr(what)));
  }
};

TEST_F(BadTokenizerFileTest, MissingFileIsNotFound) {
  const std::string path = ::tandem::testing::TempDir() + "/absent.bin";
  EXPECT_THAT(LoadTokenizer(path), StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST_F(BadTokenizerFileTest, FolderWithoutTokenizerIsRejected) {
  EXPECT_THAT(LoadTokenizer(::tandem::testing::TempDir()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("neither tokenizer.json nor tokenizer.model")));
}

TEST_F(BadTokenizerFileTest, EmptyFile) {
  const std::string path = Write("empty.bin", "");
  EXPECT_THAT(LoadTokenizer(path), InvalidNaming(path, "is empty"));
}

TEST_F(BadTokenizerFileTest, TooShortForAVocabulary) {
  const std::string short_header = Write("short.bin", std::string("\x07\x00", 2));
  EXPECT_THAT(LoadTokenizer(short_header), InvalidNaming(short_header, "shorter than the 4-byte"));
  const std::string header_only = Write("header.bin", MakeBin(7, {}));
  EXPECT_THAT(LoadTokenizer(header_only), InvalidNaming(header_only, "no tokens"));
  const std::string few = Write("few.bin", MakeBin(7, {{0.0f, "<unk>"}, {0.0f, "<s>"}}));
  EXPECT_THAT(LoadTokenizer(few), InvalidNaming(few, "holds 2 tokens"));
}

TEST_F(BadTokenizerFileTest, NegativeLength) {
  std::string bytes = MakeBin(7, {{0.0f, "<unk>"}, {0.0f, "abc"}});
  const int32_t negative = -3;
  std::memcpy(bytes.data() + 4 + 8 + 5 + 4, &negative, sizeof(negative));
  const std::string path = Write("negative.bin", bytes);
  EXPECT_THAT(LoadTokenizer(path),
              InvalidNaming(path, "token 1 at byte 17 has negative length -3"));
}

TEST_F(BadTokenizerFileTest, LengthAboveMaxTokenLength) {
  const std::string path = Write("long.bin", MakeBin(4, {{0.0f, "<unk>"}}));
  EXPECT_THAT(LoadTokenizer(path), InvalidNaming(path, "above the header's max_token_length 4"));
}

TEST_F(BadTokenizerFileTest, MisplacedByteToken) {
  auto tokens = LlamaSpecialTokens();
  tokens[3 + 0x41].second = "A";
  const std::string path = Write("bytes.bin", MakeBin(7, tokens));
  EXPECT_THAT(LoadTokenizer(path),
              InvalidNaming(path, "token 68 is 'A' where the byte token <0x41>"));
}

TEST_F(BadTokenizerFileTest, TruncatedInsideRecord) {
  TANDEM_MODEL_FILE_OR_SKIP(tok512, "tok512.bin");
  const std::string full = ReadFile(tok512);
  // Walk to record 300 and cut inside its piece, then inside its header.
  size_t offset = 4;
  for (int i = 0; i < 300; ++i) {
    int32_t len;
    std::memcpy(&len, full.data() + offset + 4, sizeof(len));
    offset += 8 + len;
  }
  int32_t len;
  std::memcpy(&len, full.data() + offset + 4, sizeof(len));
  ASSERT_GE(len, 2);
  const std::string in_piece = Write("cut_piece.bin", full.substr(0, offset + 8 + 1));
  EXPECT_THAT(LoadTokenizer(in_piece), InvalidNaming(in_piece, "truncated: token 300"));
  const std::string in_header = Write("cut_header.bin", full.substr(0, offset + 5));
  EXPECT_THAT(LoadTokenizer(in_header), InvalidNaming(in_header, "truncated: token 300"));
}

TEST_F(BadTokenizerFileTest, Garbage) {
  std::mt19937 rng(1);
  std::string bytes(4096, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  bytes[0] = '\x13';  // Not the protobuf tag: read as a tokenizer.bin.
  const std::string bin_path = Write("garbage.bin", bytes);
  EXPECT_THAT(LoadTokenizer(bin_path), InvalidNaming(bin_path, "not a valid llama2.c"));
  bytes[0] = '\x0A';  // The protobuf tag of ModelProto.pieces.
  bytes[1] = '\x55';
  const std::string model_path = Write("garbage.model", bytes);
  EXPECT_THAT(LoadTokenizer(model_path), InvalidNaming(model_path, "not a valid SentencePiece"));
}

TEST_F(BadTokenizerFileTest, TruncatedSentencePieceModel) {
  TANDEM_MODEL_FILE_OR_SKIP(model, "tokenizer.model");
  const std::string full = ReadFile(model);
  const std::string path = Write("half.model", full.substr(0, full.size() / 2));
  EXPECT_THAT(LoadTokenizer(path), InvalidNaming(path, "not a valid SentencePiece"));
}

}  // namespace
}  // namespace tandem
