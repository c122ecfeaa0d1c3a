#include "common/tokenizer/hf_tokenizer.h"

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/tokenizer/llama3_reference.h"
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
using ::testing::Not;

constexpr int32_t kBeginOfText = 128000;
constexpr int32_t kEndOfText = 128001;
constexpr int32_t kEotId = 128009;

// The concatenated Decode of `ids`, as a client would see the stream.
std::string DecodeAll(const Tokenizer& tok, const std::vector<int32_t>& ids, int32_t prev) {
  IncrementalDetokenizer detok(tok, prev);
  std::string text;
  for (const int32_t id : ids) {
    absl::StatusOr<std::string> piece = detok.Push(id);
    EXPECT_TRUE(piece.ok()) << piece.status();
    if (piece.ok()) text += *piece;
  }
  return text + detok.Flush();
}

class Llama3Test : public ::testing::Test {
 protected:
  void SetUp() override {
    TANDEM_LLAMA3_REFERENCE_OR_SKIP(ref);
    ref_ = ref;
    ASSERT_OK_AND_ASSIGN(tok_, LoadTokenizer(ref->tokenizer_dir()));
  }

  const ::tandem::testing::Llama3Reference* ref_ = nullptr;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(Llama3Test, LoadsFolderAndFile) {
  ASSERT_NE(dynamic_cast<HfTokenizer*>(tok_.get()), nullptr);
  EXPECT_TRUE(dynamic_cast<HfTokenizer*>(tok_.get())->byte_level());
  EXPECT_EQ(tok_->vocab_size(), 128256);
  EXPECT_EQ(tok_->bos_id(), kBeginOfText);
  EXPECT_EQ(tok_->eos_id(), kEndOfText);
  EXPECT_THAT(tok_->eos_ids(), ElementsAre(kEndOfText));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> file,
                       LoadTokenizer(ref_->tokenizer_dir() + "/tokenizer.json"));
  EXPECT_EQ(file->bos_id(), kBeginOfText);
}

TEST_F(Llama3Test, MatchesHuggingFaceOnVocabVectors) {
  TANDEM_MODEL_FILE_OR_SKIP(inp, "ggml-vocab-llama-bpe.gguf.inp");
  TANDEM_MODEL_FILE_OR_SKIP(out, "ggml-vocab-llama-bpe.gguf.out");
  const std::vector<::tandem::testing::VocabTest> tests =
      ::tandem::testing::ReadVocabTests(inp, out);
  ASSERT_GT(tests.size(), 30u);
  for (const auto& t : tests) {
    EXPECT_THAT(tok_->Encode(t.input, /*add_bos=*/false), IsOkAndHolds(ElementsAreArray(t.ids)))
        << "input '" << absl::CHexEscape(t.input) << "'";
    EXPECT_EQ(DecodeAll(*tok_, t.ids, -1), t.input);
  }
}

TEST_F(Llama3Test, MatchesReferenceEncoderOnCorpus) {
  const std::vector<std::string> corpus = ::tandem::testing::TokenizerCorpus(6000);
  ASSERT_OK_AND_ASSIGN(const auto expected, ref_->Encode(corpus, /*special=*/false));
  int mismatches = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ids, tok_->Encode(corpus[i], false));
    if (ids != expected[i] && ++mismatches <= 10) {
      ADD_FAILURE() << "input " << i << " '" << absl::CHexEscape(corpus[i]) << "': got "
                    << ::testing::PrintToString(ids) << ", reference "
                    << ::testing::PrintToString(expected[i]);
    }
    for (const int32_t id : ids) ASSERT_LT(id, kBeginOfText) << "special id from plain text";
    EXPECT_EQ(DecodeAll(*tok_, ids, -1), corpus[i]);
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_F(Llama3Test, MatchesReferenceEncoderWithSpecialTokens) {
  const std::vector<std::string> corpus = ::tandem::testing::TokenizerCorpus(1500);
  ASSERT_OK_AND_ASSIGN(const auto expected, ref_->Encode(corpus, /*special=*/true));
  for (size_t i = 0; i < corpus.size(); ++i) {
    EXPECT_THAT(tok_->Encode(corpus[i], EncodeOptions{.parse_special = true}),
                IsOkAndHolds(ElementsAreArray(expected[i])))
        << "input " << i << " '" << absl::CHexEscape(corpus[i]) << "'";
  }
}

// Regression guard: a regex engine stack limit on one long match must not cut
// the text short.
TEST_F(Llama3Test, LongRunsOfOneCharacterClass) {
  const std::vector<std::string> texts = {std::string(100000, ' ') + "x", std::string(100000, 'a'),
                                          std::string(60000, '7'), std::string(50000, '\n') + "y",
                                          std::string(30000, '!') + "\n\n"};
  ASSERT_OK_AND_ASSIGN(const auto expected, ref_->Encode(texts, /*special=*/false));
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_THAT(tok_->Encode(texts[i], false), IsOkAndHolds(ElementsAreArray(expected[i])))
        << "text " << i;
  }
}

TEST_F(Llama3Test, SpecialTokensOnlyWhenAllowed) {
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> plain, tok_->Encode("<|eot_id|>", false));
  EXPECT_THAT(plain, Not(ElementsAre(kEotId)));
  EXPECT_GT(plain.size(), 1u);
  EXPECT_THAT(tok_->Encode("<|eot_id|>", EncodeOptions{.parse_special = true}),
              IsOkAndHolds(ElementsAre(kEotId)));
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> chat,
                       tok_->Encode("<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
                                    EncodeOptions{.add_bos = true, .parse_special = true}));
  EXPECT_THAT(chat, ElementsAre(kBeginOfText, 128006, 882, 128007, 271, 13347, kEotId));
  EXPECT_THAT(tok_->Decode(-1, kEotId), IsOkAndHolds(""));
  EXPECT_THAT(tok_->Decode(-1, kBeginOfText), IsOkAndHolds(""));
}

TEST_F(Llama3Test, BosFromTemplateAndNoLeadingSpaceRule) {
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ids, tok_->Encode(" Hello", true));
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[0], kBeginOfText);
  // Byte-level text has no dummy prefix: a typed leading space stays.
  EXPECT_EQ(DecodeAll(*tok_, {ids.begin() + 1, ids.end()}, kBeginOfText), " Hello");
  EXPECT_THAT(tok_->Encode("", true), IsOkAndHolds(ElementsAre(kBeginOfText)));
  EXPECT_THAT(tok_->Encode("", false), IsOkAndHolds(IsEmpty()));
}

TEST_F(Llama3Test, StreamsWholeCharactersOfMultiTokenEmoji) {
  const std::string text = "👨‍👩‍👧‍👦 家族 🇯🇵";
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ids, tok_->Encode(text, false));
  IncrementalDetokenizer detok(*tok_, -1);
  std::string streamed;
  for (const int32_t id : ids) {
    ASSERT_OK_AND_ASSIGN(std::string part, detok.Push(id));
    streamed += part;
    EXPECT_TRUE(text.starts_with(streamed));
  }
  EXPECT_EQ(streamed + detok.Flush(), text);
}

TEST_F(Llama3Test, MalformedUtf8IsReadAsReplacementCharacter) {
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> bad, tok_->Encode("a\xFF"
                                                              "b",
                                                              false));
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> replaced, tok_->Encode("a\xEF\xBF\xBD"
                                                                   "b",
                                                                   false));
  EXPECT_EQ(bad, replaced);
}

// Not a test of correctness: prints Encode's speed on English prose (run
// with --gtest_also_run_disabled_tests).
TEST_F(Llama3Test, DISABLED_EncodeThroughput) {
  const std::string text = ::tandem::testing::EnglishProse(4 << 20);
  std::vector<int32_t> ids;
  const auto start = std::chrono::steady_clock::now();
  constexpr int kRounds = 3;
  for (int i = 0; i < kRounds; ++i) ids = *tok_->Encode(text, false);
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kRounds;
  std::printf("Llama 3 Encode: %zu bytes -> %zu tokens in %.3f s: %.2f M tokens/s, %.1f MB/s\n",
              text.size(), ids.size(), s, ids.size() / s / 1e6, text.size() / s / 1e6);
}

}  // namespace
}  // namespace tandem
