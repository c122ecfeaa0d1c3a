// stories260K as a Hugging Face folder: converted from the llama2.c files
// (weights to safetensors, tok512 to tokenizer.json) and served from the
// folder alone must give the reference text byte for byte in f32.
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/engine/generate.h"
#include "common/model/hub_model.h"
#include "common/model/model_weights.h"
#include "common/tokenizer/hf_tokenizer_writer.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Writes stories260K as a hub folder of `dtype` and returns its path.
std::string ConvertStories(const std::string& name, DType dtype, bool permute_qk = true) {
  const std::string model = ::tandem::testing::ModelFile("stories260K.bin");
  const std::string tok = ::tandem::testing::ModelFile("tok512.bin");
  const std::string dir = ::tandem::testing::TempDir() + "/" + name;
  auto weights = LoadModel(model);
  EXPECT_OK(weights.status());
  auto tokenizer = LoadTokenizer(tok);
  EXPECT_OK(tokenizer.status());
  if (!weights.ok() || !tokenizer.ok()) return dir;
  HubWriteOptions options;
  options.dtype = dtype;
  options.permute_qk = permute_qk;
  options.bos_id = (*tokenizer)->bos_id();
  options.eos_ids = {(*tokenizer)->eos_id()};
  EXPECT_OK(WriteHubModel(**weights, dir, options));
  auto vocab = SpmVocabularyOf(**tokenizer);
  EXPECT_OK(vocab.status());
  if (vocab.ok()) {
    EXPECT_OK(WriteHfTokenizer(*vocab, dir));
  }
  return dir;
}

// Greedy text from BOS of the model in `weights`, with the folder's
// tokenizer, streamed through the incremental detokenizer.
std::string GreedyText(const ModelWeights& weights, const Tokenizer& tokenizer, int tokens,
                       std::optional<DType> kv_dtype = std::nullopt) {
  auto backend = CpuBackend::Create();
  EXPECT_OK(backend.status());
  EngineOptions options;
  options.max_batch_tokens = weights.config.seq_len;
  options.kv_dtype = kv_dtype;
  auto engine = Engine::Create(weights, std::move(backend).value(), options);
  EXPECT_OK(engine.status());
  if (!engine.ok()) return "";
  GenerateRequest request;
  request.prompt = {tokenizer.bos_id()};
  request.max_new_tokens = tokens;
  request.eos_ids = tokenizer.eos_ids();
  IncrementalDetokenizer detok(tokenizer, request.prompt.back());
  std::string text;
  auto result = Generate(**engine, request, [&](int32_t id) {
    auto piece = detok.Push(id);
    EXPECT_OK(piece.status());
    text += piece.value_or("");
    return true;
  });
  EXPECT_OK(result.status());
  return text + detok.Flush();
}

class HubFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"stories260K.bin", "tok512.bin", "stories260K.greedy256.txt"}) {
      if (::tandem::testing::ModelFile(name).empty()) {
        if (::tandem::testing::ModelsRequired()) FAIL() << "fixture " << name << " missing";
        GTEST_SKIP() << "fixture " << name << " not found; set TANDEM_MODELS";
      }
    }
    expected_ = ReadFile(::tandem::testing::ModelFile("stories260K.greedy256.txt"));
  }
  std::string expected_;
};

TEST_F(HubFolderTest, F32FolderGivesTheReferenceTextByteForByte) {
  const std::string dir = ConvertStories("stories260K-f32", DType::kF32);
  ASSERT_OK_AND_ASSIGN(auto weights, LoadModel(dir));
  EXPECT_EQ(weights->config.rope_layout, RopeLayout::kHalfSplit);
  EXPECT_EQ(weights->dtype(), DType::kF32);
  ASSERT_OK_AND_ASSIGN(auto tokenizer, LoadTokenizer(dir));
  EXPECT_EQ(GreedyText(*weights, *tokenizer, 256), expected_);
}

TEST_F(HubFolderTest, Bf16FolderStaysBf16AndTellsTheSameStory) {
  const std::string dir = ConvertStories("stories260K-bf16", DType::kBF16);
  ASSERT_OK_AND_ASSIGN(auto weights, LoadModel(dir));
  EXPECT_EQ(weights->dtype(), DType::kBF16);
  EXPECT_EQ(weights->layers[0].wq.dtype, DType::kBF16);
  ASSERT_OK_AND_ASSIGN(auto tokenizer, LoadTokenizer(dir));
  // Rounding the weights to 8 significant bits moves the logits a little;
  // greedy decoding of this model keeps the reference's opening sentence.
  const std::string text = GreedyText(*weights, *tokenizer, 256);
  const size_t first_sentence = expected_.find('.') + 1;
  ASSERT_GT(first_sentence, 10u);
  EXPECT_EQ(text.substr(0, first_sentence), expected_.substr(0, first_sentence));
  EXPECT_GT(text.size(), expected_.size() / 2);
}

// Hub checkpoints store q/k rows for half-split RoPE. Writing them without
// the reordering, or reading a correct folder as interleaved, must change
// the text: this is what would break if either side skipped the permutation.
TEST_F(HubFolderTest, SkippingTheQkPermutationOnEitherSideBreaksTheText) {
  const std::string unpermuted = ConvertStories("stories260K-unpermuted", DType::kF32, false);
  ASSERT_OK_AND_ASSIGN(auto weights, LoadModel(unpermuted));
  ASSERT_OK_AND_ASSIGN(auto tokenizer, LoadTokenizer(unpermuted));
  EXPECT_NE(GreedyText(*weights, *tokenizer, 256), expected_);

  const std::string good = ConvertStories("stories260K-good", DType::kF32);
  ASSERT_OK_AND_ASSIGN(auto read_as_interleaved, LoadModel(good));
  read_as_interleaved->config.rope_layout = RopeLayout::kInterleaved;
  EXPECT_NE(GreedyText(*read_as_interleaved, *tokenizer, 256), expected_);
}

TEST_F(HubFolderTest, ShardedFolderLoadsTheSameModel) {
  const std::string one = ConvertStories("stories260K-one", DType::kF32);
  const std::string dir = ::tandem::testing::TempDir() + "/stories260K-sharded";
  ASSERT_OK_AND_ASSIGN(auto weights, LoadModel(one));
  HubWriteOptions options;
  options.dtype = DType::kF32;
  options.max_shard_bytes = 200 << 10;
  ASSERT_OK(WriteHubModel(*weights, dir, options));
  ASSERT_OK_AND_ASSIGN(auto sharded, LoadModel(dir));
  EXPECT_EQ(sharded->Fingerprint(), weights->Fingerprint());
  ASSERT_OK_AND_ASSIGN(auto tokenizer, LoadTokenizer(one));
  EXPECT_EQ(GreedyText(*sharded, *tokenizer, 256), expected_);
}

TEST_F(HubFolderTest, Bf16KvCacheOfTheF32ModelHalvesItsBytes) {
  const std::string dir = ConvertStories("stories260K-kv", DType::kF32);
  ASSERT_OK_AND_ASSIGN(auto weights, LoadModel(dir));
  ASSERT_OK_AND_ASSIGN(auto tokenizer, LoadTokenizer(dir));
  auto make = [&](DType kv) {
    EngineOptions options;
    options.kv_dtype = kv;
    auto engine = Engine::Create(*weights, std::move(CpuBackend::Create()).value(), options);
    EXPECT_OK(engine.status());
    return std::move(engine).value();
  };
  EXPECT_EQ(make(DType::kBF16)->kv_cache_bytes() * 2, make(DType::kF32)->kv_cache_bytes());
  const std::string text = GreedyText(*weights, *tokenizer, 256, DType::kBF16);
  const size_t first_sentence = expected_.find('.') + 1;
  EXPECT_EQ(text.substr(0, first_sentence), expected_.substr(0, first_sentence));
}

}  // namespace
}  // namespace tandem
