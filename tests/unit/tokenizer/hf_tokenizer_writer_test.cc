#include "common/tokenizer/hf_tokenizer_writer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "common/tokenizer/hf_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/tokenizer/tokenizer_corpus.h"

namespace tandem {
namespace {

using ::tandem::testing::IsOkAndHolds;
using ::tandem::testing::ModelFile;
using ::tandem::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

// Llama 2's vocabulary written as tokenizer.json from tokenizer.model and
// from tokenizer.bin, next to the SentencePiece reference.
class Llama2HfTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"tokenizer.model", "tokenizer.bin", "ggml-vocab-llama-spm.gguf.inp",
                             "ggml-vocab-llama-spm.gguf.out"}) {
      TANDEM_MODEL_FILE_OR_SKIP(path, name);
    }
    ASSERT_OK_AND_ASSIGN(sp_, LoadTokenizer(ModelFile("tokenizer.model")));
    ASSERT_OK_AND_ASSIGN(hf_, Convert(*sp_));
    tests_ = ::tandem::testing::ReadVocabTests(ModelFile("ggml-vocab-llama-spm.gguf.inp"),
                                               ModelFile("ggml-vocab-llama-spm.gguf.out"));
    ASSERT_GT(tests_.size(), 30u);
  }

  static absl::StatusOr<std::unique_ptr<Tokenizer>> Convert(const Tokenizer& source) {
    const std::string dir = ::tandem::testing::TempDir();
    absl::StatusOr<SpmVocabulary> vocab = SpmVocabularyOf(source);
    if (!vocab.ok()) return vocab.status();
    if (absl::Status s = WriteHfTokenizer(*vocab, dir); !s.ok()) return s;
    return LoadTokenizer(dir);
  }

  std::unique_ptr<Tokenizer> sp_;
  std::unique_ptr<Tokenizer> hf_;
  std::vector<::tandem::testing::VocabTest> tests_;
};

TEST_F(Llama2HfTest, WrittenFolderLoadsAsHfTokenizer) {
  ASSERT_NE(dynamic_cast<HfTokenizer*>(hf_.get()), nullptr);
  EXPECT_FALSE(dynamic_cast<HfTokenizer*>(hf_.get())->byte_level());
  EXPECT_EQ(hf_->vocab_size(), 32000);
  EXPECT_EQ(hf_->bos_id(), 1);
  EXPECT_EQ(hf_->eos_id(), 2);
  EXPECT_THAT(hf_->Encode("Hello", true), IsOkAndHolds(ElementsAre(1, 15043)));
}

TEST_F(Llama2HfTest, MatchesVocabVectors) {
  for (const auto& t : tests_) {
    EXPECT_THAT(hf_->Encode(t.input, false), IsOkAndHolds(ElementsAreArray(t.ids)))
        << "input '" << absl::CHexEscape(t.input) << "'";
  }
}

TEST_F(Llama2HfTest, FromTokenizerBinMatchesVocabVectors) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> bin, LoadTokenizer(ModelFile("tokenizer.bin")));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> hf, Convert(*bin));
  for (const auto& t : tests_) {
    EXPECT_THAT(hf->Encode(t.input, false), IsOkAndHolds(ElementsAreArray(t.ids)))
        << "input '" << absl::CHexEscape(t.input) << "'";
  }
}

TEST_F(Llama2HfTest, MatchesSentencePieceOnCorpusAndDecodesAlike) {
  const std::vector<std::string> corpus = ::tandem::testing::TokenizerCorpus(5000);
  int mismatches = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> expected, sp_->Encode(corpus[i], true));
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ids, hf_->Encode(corpus[i], true));
    if (ids != expected && ++mismatches <= 10) {
      ADD_FAILURE() << "input " << i << " '" << absl::CHexEscape(corpus[i]) << "': got "
                    << ::testing::PrintToString(ids) << ", SentencePiece "
                    << ::testing::PrintToString(expected);
    }
    int32_t prev = -1;
    for (const int32_t id : expected) {
      EXPECT_EQ(hf_->Decode(prev, id).value(), sp_->Decode(prev, id).value()) << "id " << id;
      prev = id;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_F(Llama2HfTest, SpecialTokensOnlyWhenAllowed) {
  const std::string chat = "<s>[INST] Hi </s>";
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> expected,
                       sp_->Encode(chat, EncodeOptions{.parse_special = true}));
  EXPECT_EQ(expected.front(), 1);
  EXPECT_EQ(expected.back(), 2);
  EXPECT_THAT(hf_->Encode(chat, EncodeOptions{.parse_special = true}),
              IsOkAndHolds(ElementsAreArray(expected)));
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> plain, hf_->Encode(chat, false));
  EXPECT_THAT(sp_->Encode(chat, false), IsOkAndHolds(ElementsAreArray(plain)));
  for (const int32_t id : plain) EXPECT_GT(id, 2);
}

TEST_F(Llama2HfTest, WritesMergesAndConfigAsTransformersDoes) {
  const std::string dir = ::tandem::testing::TempDir();
  ASSERT_OK_AND_ASSIGN(SpmVocabulary vocab, SpmVocabularyOf(*sp_));
  ASSERT_OK(WriteHfTokenizer(vocab, dir));
  const nlohmann::json json =
      nlohmann::json::parse(::tandem::testing::ReadFileOrEmpty(dir + "/tokenizer.json"));
  // The first merges of Meta's Llama-2 tokenizer.json.
  EXPECT_EQ(json["model"]["merges"][0], "▁ t");
  EXPECT_EQ(json["model"]["merges"][1], "e r");
  EXPECT_EQ(json["model"]["merges"][2], "i n");
  EXPECT_EQ(json["model"]["vocab"]["<0x0A>"], 13);
  const nlohmann::json config =
      nlohmann::json::parse(::tandem::testing::ReadFileOrEmpty(dir + "/tokenizer_config.json"));
  EXPECT_EQ(config["bos_token"], "<s>");
  EXPECT_EQ(config["eos_token"], "</s>");
  EXPECT_EQ(config["add_bos_token"], true);
}

TEST(HfTokenizerWriterTest, RejectsOtherTokenizersAndEmptyVocab) {
  EXPECT_THAT(HfTokenizerJson(SpmVocabulary{}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(WriteHfTokenizer(SpmVocabulary{}, ::tandem::testing::TempDir()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tandem
