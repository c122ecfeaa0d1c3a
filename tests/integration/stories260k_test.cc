// The real stories260K model end to end: files on disk -> tokenizer ->
// engine -> text.
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/engine/generate.h"
#include "common/model/gguf_model.h"
#include "common/model/model_weights.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

std::unique_ptr<Engine> MakeEngine(const ModelWeights& weights) {
  auto backend = CpuBackend::Create();
  EXPECT_OK(backend.status());
  EngineOptions options;
  options.max_batch_tokens = weights.config.seq_len;
  auto engine = Engine::Create(weights, std::move(backend).value(), options);
  EXPECT_OK(engine.status());
  return engine.ok() ? std::move(engine).value() : nullptr;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Greedy text streamed through the incremental detokenizer.
std::string GreedyText(Engine& engine, const Tokenizer& tokenizer, std::vector<int32_t> prompt,
                       int max_new_tokens) {
  GenerateRequest request;
  request.prompt = std::move(prompt);
  request.max_new_tokens = max_new_tokens;
  request.eos_ids = tokenizer.eos_ids();
  IncrementalDetokenizer detok(tokenizer, request.prompt.back());
  std::string text;
  auto result = Generate(engine, request, [&](int32_t id) {
    auto piece = detok.Push(id);
    EXPECT_OK(piece.status());
    text += piece.value_or("");
    return true;
  });
  EXPECT_OK(result.status());
  return text + detok.Flush();
}

// The fixture is the text a reference fp32 implementation prints from BOS
// alone at 256 positions: BOS and 255 generated tokens are fed, and the
// token sampled at the last position is printed too, 256 tokens in all.
TEST(Stories260K, GreedyFromBosMatchesReferenceText) {
  TANDEM_MODEL_FILE_OR_SKIP(model_path, "stories260K.bin");
  TANDEM_MODEL_FILE_OR_SKIP(tokenizer_path, "tok512.bin");
  TANDEM_MODEL_FILE_OR_SKIP(expected_path, "stories260K.greedy256.txt");
  ASSERT_OK_AND_ASSIGN(auto weights, LoadModel(model_path));
  ASSERT_OK_AND_ASSIGN(auto tokenizer, LoadTokenizer(tokenizer_path));
  auto engine = MakeEngine(*weights);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(GreedyText(*engine, *tokenizer, {tokenizer->bos_id()}, 256), ReadFile(expected_path));
  EXPECT_EQ(engine->block_pool().num_free(), engine->block_pool().num_blocks());
}

// The checkpoint written as GGUF and loaded back computes the same logits,
// bit for bit (F32 tensors are the same numbers in another container).
TEST(Stories260K, GgufCopyGivesIdenticalLogits) {
  TANDEM_MODEL_FILE_OR_SKIP(model_path, "stories260K.bin");
  TANDEM_MODEL_FILE_OR_SKIP(tokenizer_path, "tok512.bin");
  ASSERT_OK_AND_ASSIGN(auto weights, LoadModel(model_path));
  const std::string gguf_path = ::tandem::testing::TempDir() + "/stories260K.gguf";
  ASSERT_OK(WriteGgufModel(*weights, gguf_path));
  ASSERT_OK_AND_ASSIGN(auto gguf_weights, LoadModel(gguf_path));
  ASSERT_OK_AND_ASSIGN(auto tokenizer, LoadTokenizer(tokenizer_path));
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> prompt,
                       tokenizer->Encode("Once upon a time, a little fox", true));

  auto logits_of = [&](const ModelWeights& w) {
    auto engine = MakeEngine(w);
    BlockTable table = engine->NewSequence();
    const BatchItem item{&table, prompt, true};
    auto logits = engine->Step({&item, 1});
    EXPECT_OK(logits.status());
    engine->Release(table);
    return logits.value_or(std::vector<float>{});
  };
  const std::vector<float> a = logits_of(*weights);
  const std::vector<float> b = logits_of(*gguf_weights);
  ASSERT_EQ(a.size(), size_t(weights->config.vocab_size));
  EXPECT_EQ(a, b);
}

// Greedy decoding after a text prompt is deterministic and, when the prompt
// is the first sentence of the reference story, continues that story.
TEST(Stories260K, PromptedGreedyIsDeterministicAndStreamsWholeText) {
  TANDEM_MODEL_FILE_OR_SKIP(model_path, "stories260K.bin");
  TANDEM_MODEL_FILE_OR_SKIP(tokenizer_path, "tok512.bin");
  ASSERT_OK_AND_ASSIGN(auto weights, LoadModel(model_path));
  ASSERT_OK_AND_ASSIGN(auto tokenizer, LoadTokenizer(tokenizer_path));
  auto engine = MakeEngine(*weights);
  ASSERT_OK_AND_ASSIGN(
      std::vector<int32_t> prompt,
      tokenizer->Encode("Once upon a time, there was a little girl named Lily.", true));
  const std::string first = GreedyText(*engine, *tokenizer, prompt, 40);
  const std::string second = GreedyText(*engine, *tokenizer, prompt, 40);
  EXPECT_FALSE(first.empty());
  EXPECT_EQ(first, second);
  // The reference story from BOS begins with this very sentence, so greedy
  // decoding after it must continue the reference text.
  TANDEM_MODEL_FILE_OR_SKIP(expected_path, "stories260K.greedy256.txt");
  const std::string expected = ReadFile(expected_path);
  const std::string sentence = "Once upon a time, there was a little girl named Lily.";
  ASSERT_EQ(expected.rfind(sentence, 0), 0u);
  EXPECT_EQ(expected.substr(sentence.size(), 60), first.substr(0, 60));
}

}  // namespace
}  // namespace tandem
