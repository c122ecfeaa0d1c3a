// Perplexity on stories260K (real weights) against the test's own scoring
// of the same chunks one token at a time, with its own log-softmax, so that
// a wrong row, target or offset in the chunked scoring cannot pass; BOS
// replacement, the scored count, the errors and the freed blocks; and the
// cost of an int8 KV cache.
#include "common/engine/perplexity.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/model/model_weights.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int kCtx = 64;

class PerplexityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TANDEM_MODEL_FILE_OR_SKIP(model_path, "stories260K.bin");
    TANDEM_MODEL_FILE_OR_SKIP(tokenizer_path, "tok512.bin");
    TANDEM_MODEL_FILE_OR_SKIP(text_path, "stories260K.greedy256.txt");
    ASSERT_OK_AND_ASSIGN(weights_, LoadModel(model_path));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer(tokenizer_path));
    bos_ = tokenizer->bos_id();
    std::ifstream in(text_path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_OK_AND_ASSIGN(tokens_, tokenizer->Encode(text, /*add_bos=*/true));
    ASSERT_GE(tokens_.size(), 4u * kCtx) << "bad fixture";
  }

  std::unique_ptr<Engine> MakeEngine(std::optional<DType> kv = std::nullopt, int logit_rows = kCtx,
                                     int batch_tokens = kCtx) {
    auto backend = CpuBackend::Create({.num_threads = 1});
    EXPECT_OK(backend.status());
    auto engine = Engine::Create(
        *weights_, std::move(backend).value(),
        EngineOptions{
            .max_batch_tokens = batch_tokens, .max_logit_rows = logit_rows, .kv_dtype = kv});
    EXPECT_OK(engine.status());
    return std::move(engine).value();
  }

  std::unique_ptr<ModelWeights> weights_;
  std::vector<int32_t> tokens_;
  int32_t bos_ = -1;
};

// The mean NLL of chunk `c`'s second half, fed one token a step.
double OneTokenAtATime(Engine& engine, const std::vector<int32_t>& tokens, int c, int32_t bos) {
  std::vector<int32_t> chunk(tokens.begin() + c * kCtx, tokens.begin() + (c + 1) * kCtx);
  chunk[0] = bos;
  BlockTable table = engine.NewSequence();
  absl::Cleanup release = [&] { engine.Release(table); };
  double nll = 0.0;
  for (int t = 0; t + 1 < kCtx; ++t) {
    const BatchItem item{&table, {&chunk[t], 1}, true};
    auto logits = engine.Step({&item, 1});
    EXPECT_OK(logits.status());
    if (t < kCtx / 2) continue;
    double max = -INFINITY, sum = 0.0;
    for (float l : *logits) max = std::max<double>(max, l);
    for (float l : *logits) sum += std::exp(l - max);
    nll += -((*logits)[chunk[t + 1]] - max - std::log(sum));
  }
  return nll;
}

TEST_F(PerplexityTest, ChunkedScoringMatchesOneTokenAtATime) {
  std::unique_ptr<Engine> engine = MakeEngine();
  const int free_before = engine->block_pool().num_free();
  std::vector<double> running;
  ASSERT_OK_AND_ASSIGN(PerplexityResult result,
                       Perplexity(*engine, tokens_, {.ctx = kCtx, .max_chunks = 3, .bos_id = bos_},
                                  [&](int chunk, double ppl) {
                                    EXPECT_EQ(chunk, static_cast<int>(running.size()));
                                    running.push_back(ppl);
                                  }));
  EXPECT_EQ(result.chunks, 3);
  EXPECT_EQ(result.scored, 3 * (kCtx - kCtx / 2 - 1));
  ASSERT_EQ(running.size(), 3u);
  EXPECT_DOUBLE_EQ(running.back(), result.perplexity);
  EXPECT_EQ(engine->block_pool().num_free(), free_before) << "blocks left behind";
  double nll = 0.0;
  for (int c = 0; c < 3; ++c) nll += OneTokenAtATime(*engine, tokens_, c, bos_);
  EXPECT_NEAR(result.mean_nll, nll / result.scored, 1e-4 * (nll / result.scored));
  EXPECT_NEAR(result.perplexity, std::exp(nll / result.scored), 1e-4 * result.perplexity);
  // The model's own greedy text is easy for it, and not trivially so.
  EXPECT_GT(result.perplexity, 1.0);
  EXPECT_LT(result.perplexity, 3.0);
}

TEST_F(PerplexityTest, ShuffledTokensScoreWorseAndEveryWholeChunkCounts) {
  std::unique_ptr<Engine> engine = MakeEngine();
  std::vector<int32_t> shuffled = tokens_;
  std::shuffle(shuffled.begin() + 1, shuffled.end(), std::mt19937_64(3));
  ASSERT_OK_AND_ASSIGN(PerplexityResult text,
                       Perplexity(*engine, tokens_, {.ctx = kCtx, .bos_id = bos_}));
  ASSERT_OK_AND_ASSIGN(PerplexityResult noise,
                       Perplexity(*engine, shuffled, {.ctx = kCtx, .bos_id = bos_}));
  EXPECT_EQ(text.chunks, static_cast<int>(tokens_.size() / kCtx));
  EXPECT_GT(noise.perplexity, 5 * text.perplexity);
}

TEST_F(PerplexityTest, BosTakesEachChunksFirstPosition) {
  std::unique_ptr<Engine> engine = MakeEngine();
  std::vector<int32_t> with_bos = tokens_;
  for (size_t at = 0; at < with_bos.size(); at += kCtx) with_bos[at] = bos_;
  const PerplexityOptions replace{.ctx = kCtx, .max_chunks = 3, .bos_id = bos_};
  const PerplexityOptions keep{.ctx = kCtx, .max_chunks = 3, .bos_id = -1};
  ASSERT_OK_AND_ASSIGN(PerplexityResult replaced, Perplexity(*engine, tokens_, replace));
  ASSERT_OK_AND_ASSIGN(PerplexityResult given, Perplexity(*engine, with_bos, keep));
  ASSERT_OK_AND_ASSIGN(PerplexityResult kept, Perplexity(*engine, tokens_, keep));
  EXPECT_DOUBLE_EQ(replaced.mean_nll, given.mean_nll);
  EXPECT_NE(replaced.mean_nll, kept.mean_nll) << "chunks 2 and 3 start mid-text, not at BOS";
}

TEST_F(PerplexityTest, RefusesWhatCannotBeScored) {
  std::unique_ptr<Engine> engine = MakeEngine();
  const std::vector<int32_t> short_text(tokens_.begin(), tokens_.begin() + 2 * kCtx - 1);
  EXPECT_THAT(Perplexity(*engine, short_text, {.ctx = kCtx}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least 128")));
  EXPECT_THAT(Perplexity(*engine, tokens_, {.ctx = 3}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("from 4")));
  EXPECT_THAT(Perplexity(*engine, tokens_, {.ctx = weights_->config.seq_len + 2}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("context")));
  EXPECT_THAT(Perplexity(*engine, tokens_, {.ctx = kCtx, .max_chunks = -1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_chunks")));
}

// An engine whose steps are smaller than a chunk's halves runs each chunk in
// several steps (uneven ones here: 7 tokens, 5 logit rows) to the same figure,
// and still frees every block.
TEST_F(PerplexityTest, SmallStepsGiveTheSameFigure) {
  std::unique_ptr<Engine> whole = MakeEngine();
  std::unique_ptr<Engine> narrow = MakeEngine(std::nullopt, /*logit_rows=*/5, /*batch_tokens=*/7);
  const int free_before = narrow->block_pool().num_free();
  const PerplexityOptions options{.ctx = kCtx, .max_chunks = 3, .bos_id = bos_};
  ASSERT_OK_AND_ASSIGN(PerplexityResult one, Perplexity(*whole, tokens_, options));
  ASSERT_OK_AND_ASSIGN(PerplexityResult many, Perplexity(*narrow, tokens_, options));
  EXPECT_EQ(many.scored, one.scored);
  EXPECT_NEAR(many.mean_nll, one.mean_nll, 1e-5 * one.mean_nll);
  EXPECT_EQ(narrow->block_pool().num_free(), free_before) << "blocks left behind";
}

// An int8 KV cache costs stories260K little perplexity on its own text
// (measured: +0.25% at chunks of 64, see docs/benchmarks/engine-cpu.md); a cache that mangled
// values would not.
TEST_F(PerplexityTest, Int8KvCostsLittle) {
  std::unique_ptr<Engine> f32 = MakeEngine(DType::kF32);
  std::unique_ptr<Engine> int8 = MakeEngine(DType::kI8);
  const PerplexityOptions options{.ctx = kCtx, .bos_id = bos_};
  ASSERT_OK_AND_ASSIGN(PerplexityResult exact, Perplexity(*f32, tokens_, options));
  ASSERT_OK_AND_ASSIGN(PerplexityResult rounded, Perplexity(*int8, tokens_, options));
  EXPECT_NE(rounded.mean_nll, exact.mean_nll);
  EXPECT_NEAR(rounded.perplexity / exact.perplexity, 1.0, 0.02);
}

}  // namespace
}  // namespace tandem
