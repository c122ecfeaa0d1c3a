// HfTokenizer on small hand-written tokenizer.json files: BOS/EOS rules from
// the config files, added tokens, merge forms, and the errors for broken
// files.
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/hf_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::IsOkAndHolds;
using ::tandem::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

constexpr int32_t kHe = 256, kLl = 257, kHell = 258, kHello = 259, kConfigEndOfText = 260,
                  kTool = 261;

std::string ByteChar(uint8_t b) {
  std::string s;
  AppendUtf8(ByteToCodePoint(b), &s);
  return s;
}

// A byte-level vocabulary: the 256 bytes, then he, ll, hell, hello (merges as
// ["a", "b"] pairs), with <|endoftext|> special and <tool> not.
Json TinyByteLevel() {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(static_cast<uint8_t>(b))] = b;
  vocab["he"] = kHe;
  vocab["ll"] = kLl;
  vocab["hell"] = kHell;
  vocab["hello"] = kHello;
  const auto added = [](int32_t id, const char* content, bool special) {
    return Json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", special}};
  };
  return Json{
      {"version", "1.0"},
      {"added_tokens",
       {added(kConfigEndOfText, "<|endoftext|>", true), added(kTool, "<tool>", false)}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", Json::array({Json::array({"h", "e"}), Json::array({"l", "l"}),
                                Json::array({"he", "ll"}), Json::array({"hell", "o"})})}}}};
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> Load(const Json& tokenizer,
                                                  const Json& config = nullptr,
                                                  const Json& generation = nullptr) {
  HfTokenizer::Files files;
  files.tokenizer_path = "/models/tiny/tokenizer.json";
  files.tokenizer_json = tokenizer.dump();
  if (!config.is_null()) {
    files.config_path = "/models/tiny/tokenizer_config.json";
    files.config_json = config.dump();
  }
  if (!generation.is_null()) {
    files.generation_config_path = "/models/tiny/generation_config.json";
    files.generation_config_json = generation.dump();
  }
  return HfTokenizer::FromFiles(files);
}

TEST(HfTokenizerTest, MergesByRankFromPairForm) {
  ASSERT_OK_AND_ASSIGN(auto tok, Load(TinyByteLevel()));
  EXPECT_THAT(tok->Encode("hello", false), IsOkAndHolds(ElementsAre(kHello)));
  EXPECT_THAT(tok->Encode("hellx", false), IsOkAndHolds(ElementsAre(kHell, 'x')));
  EXPECT_THAT(tok->Encode("helo hello", false),
              IsOkAndHolds(ElementsAre(kHe, 'l', 'o', ' ', kHello)));
  EXPECT_THAT(tok->Decode(-1, kHello), IsOkAndHolds("hello"));
  EXPECT_THAT(tok->Decode(-1, ' '), IsOkAndHolds(" "));
}

TEST(HfTokenizerTest, MergesAsStringsGiveTheSameIds) {
  Json json = TinyByteLevel();
  json["model"]["merges"] = Json::array({"h e", "l l", "he ll", "hell o"});
  ASSERT_OK_AND_ASSIGN(auto tok, Load(json));
  EXPECT_THAT(tok->Encode("hello hell", false), IsOkAndHolds(ElementsAre(kHello, ' ', kHell)));
}

TEST(HfTokenizerTest, QwenStyleHasNoBos) {
  ASSERT_OK_AND_ASSIGN(
      auto tok, Load(TinyByteLevel(), {{"bos_token", nullptr}, {"eos_token", "<|endoftext|>"}}));
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_EQ(tok->eos_id(), kConfigEndOfText);
  EXPECT_THAT(tok->Encode("hello", true), IsOkAndHolds(ElementsAre(kHello)));
}

TEST(HfTokenizerTest, SpecialTokensOnlyWhenAllowedButPlainAddedTokensAlways) {
  ASSERT_OK_AND_ASSIGN(auto tok, Load(TinyByteLevel()));
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> plain, tok->Encode("<|endoftext|>", false));
  EXPECT_GT(plain.size(), 1u);
  EXPECT_THAT(tok->Encode("hello<|endoftext|>", EncodeOptions{.parse_special = true}),
              IsOkAndHolds(ElementsAre(kHello, kConfigEndOfText)));
  EXPECT_THAT(tok->Encode("<tool>hello", false), IsOkAndHolds(ElementsAre(kTool, kHello)));
  EXPECT_THAT(tok->Decode(-1, kConfigEndOfText), IsOkAndHolds(""));
  EXPECT_THAT(tok->Decode(-1, kTool), IsOkAndHolds("<tool>"));
  // Without a config the well-known end token is the EOS.
  EXPECT_EQ(tok->eos_id(), kConfigEndOfText);
}

TEST(HfTokenizerTest, BosTokenAsObjectAndAddBosToken) {
  ASSERT_OK_AND_ASSIGN(
      auto tok, Load(TinyByteLevel(),
                     {{"bos_token", {{"content", "<|endoftext|>"}}}, {"add_bos_token", true}}));
  EXPECT_EQ(tok->bos_id(), kConfigEndOfText);
  EXPECT_THAT(tok->Encode("he", true), IsOkAndHolds(ElementsAre(kConfigEndOfText, kHe)));
  EXPECT_THAT(tok->Encode("he", false), IsOkAndHolds(ElementsAre(kHe)));
}

TEST(HfTokenizerTest, AddBosTokenFalseOverridesTemplate) {
  Json json = TinyByteLevel();
  json["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<|endoftext|>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"special_tokens",
       {{"<|endoftext|>",
         {{"id", "<|endoftext|>"}, {"ids", {kConfigEndOfText}}, {"tokens", {"<|endoftext|>"}}}}}}};
  ASSERT_OK_AND_ASSIGN(auto with_template, Load(json));
  EXPECT_EQ(with_template->bos_id(), kConfigEndOfText);
  EXPECT_THAT(with_template->Encode("he", true), IsOkAndHolds(ElementsAre(kConfigEndOfText, kHe)));
  ASSERT_OK_AND_ASSIGN(auto disabled, Load(json, {{"add_bos_token", false}}));
  EXPECT_THAT(disabled->Encode("he", true), IsOkAndHolds(ElementsAre(kHe)));
}

TEST(HfTokenizerTest, EosIdsFromConfigAndGenerationConfig) {
  ASSERT_OK_AND_ASSIGN(auto tok, Load(TinyByteLevel(), {{"eos_token", "<tool>"}},
                                      {{"eos_token_id", {kConfigEndOfText, kTool}}}));
  EXPECT_EQ(tok->eos_id(), kTool);
  EXPECT_THAT(tok->eos_ids(), ElementsAre(kTool, kConfigEndOfText));
}

TEST(HfTokenizerTest, BadGenerationConfigEosIsRefusedNamingFileAndField) {
  for (const Json& eos : {Json("</s>"), Json(-1), Json(2.5), Json(true), Json::array({2, "x"}),
                          Json::array({Json::array({2})}), Json(1 << 30)}) {
    SCOPED_TRACE(eos.dump());
    EXPECT_THAT(Load(TinyByteLevel(), nullptr, {{"eos_token_id", eos}}),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("generation_config.json"), HasSubstr("eos_token_id"))));
  }
}

TEST(HfTokenizerTest, LoadTokenizerReadsFolderWithConfig) {
  const std::string dir = ::tandem::testing::TempDir();
  std::ofstream(dir + "/tokenizer.json") << TinyByteLevel().dump();
  std::ofstream(dir + "/tokenizer_config.json") << Json{{"eos_token", "<tool>"}}.dump();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tok, LoadTokenizer(dir));
  EXPECT_EQ(tok->eos_id(), kTool);
  ASSERT_OK_AND_ASSIGN(tok, LoadTokenizer(dir + "/tokenizer.json"));
  EXPECT_EQ(tok->eos_id(), kTool);
  EXPECT_THAT(LoadTokenizer(dir + "/missing"), StatusIs(absl::StatusCode::kNotFound));
}

TEST(HfTokenizerTest, BrokenFilesAreInvalidArgumentNamingFileAndField) {
  const auto expect_error = [](const absl::StatusOr<std::unique_ptr<HfTokenizer>>& result,
                               const std::string& what) {
    EXPECT_THAT(result, StatusIs(absl::StatusCode::kInvalidArgument,
                                 AllOf(HasSubstr("/models/tiny/tokenizer.json"), HasSubstr(what))));
  };
  HfTokenizer::Files files;
  files.tokenizer_path = "/models/tiny/tokenizer.json";
  files.tokenizer_json = "{\"model\": [1, ";
  expect_error(HfTokenizer::FromFiles(files), "not valid JSON");

  Json json = TinyByteLevel();
  json.erase("model");
  expect_error(Load(json), "field 'model'");

  json = TinyByteLevel();
  json["model"]["type"] = "Unigram";
  expect_error(Load(json), "field 'model.type': unsupported model type 'Unigram'");

  json = TinyByteLevel();
  json["model"]["merges"].push_back(Json::array({"hello", "zz"}));
  expect_error(Load(json), "field 'model.merges[4]': token 'zz' is not in the vocab");

  json = TinyByteLevel();
  json["model"]["merges"].push_back("he");
  expect_error(Load(json), "field 'model.merges[4]'");

  json = TinyByteLevel();
  Json split = {{"type", "Split"}, {"pattern", {{"Regex", "(\\p{L}+"}}}, {"behavior", "Isolated"}};
  json["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", Json::array({split})}};
  expect_error(Load(json), "field 'pre_tokenizer.pretokenizers[0].pattern': bad regex");

  json = TinyByteLevel();
  json["normalizer"] = {{"type", "Lowercase"}};
  expect_error(Load(json), "field 'normalizer.type': unsupported normalizer 'Lowercase'");

  EXPECT_THAT(Load(TinyByteLevel(), {{"bos_token", "<nope>"}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("tokenizer_config.json"), HasSubstr("'bos_token'"),
                             HasSubstr("<nope>"))));
}

}  // namespace
}  // namespace tandem
