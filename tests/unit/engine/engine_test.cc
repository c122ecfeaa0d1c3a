#include "common/engine/engine.h"

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/base/logging.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/generate.h"
#include "common/engine/sampler.h"
#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/reference_model.h"
#include "tests/testing/status_matchers.h"

namespace tandem {
namespace {

using ::tandem::testing::MaxRelativeError;
using ::tandem::testing::ReferenceLogits;
using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

ModelConfig SmallShape(int n_heads, int n_kv_heads, bool tied = true) {
  return ModelConfig{.dim = 64,
                     .hidden_dim = 96,
                     .n_layers = 3,
                     .n_heads = n_heads,
                     .n_kv_heads = n_kv_heads,
                     .vocab_size = 101,
                     .seq_len = 128,
                     .shared_classifier = tied};
}

std::unique_ptr<Engine> MakeEngine(const ModelWeights& w, EngineOptions options = {}) {
  auto backend = CpuBackend::Create();
  CHECK_OK(backend.status());
  auto engine = Engine::Create(w, std::move(backend).value(), options);
  CHECK_OK(engine.status());
  return std::move(engine).value();
}

std::vector<int32_t> RandomTokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& id : t) id = static_cast<int32_t>(rng() % vocab);
  return t;
}

// Logits of every position of `tokens`, fed `chunk` tokens per step.
std::vector<std::vector<float>> ChunkedLogits(Engine& engine, std::span<const int32_t> tokens,
                                              int chunk) {
  BlockTable table = engine.NewSequence();
  std::vector<std::vector<float>> out;
  const int vocab = engine.config().vocab_size;
  for (size_t at = 0; at < tokens.size(); at += chunk) {
    const size_t n = std::min<size_t>(chunk, tokens.size() - at);
    // One item per position would need one sequence per item; instead take
    // the last position's logits of each chunk, and of chunk 1 every one.
    const BatchItem item{&table, tokens.subspan(at, n), true};
    auto logits = engine.Step({&item, 1});
    CHECK_OK(logits.status());
    out.emplace_back(logits->begin(), logits->begin() + vocab);
  }
  engine.Release(table);
  return out;
}

struct ShapeCase {
  std::string name;
  int n_heads, n_kv_heads;
  bool tied;
};

class EngineVsReference : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(EngineVsReference, LogitsMatchFloat64Reference) {
  const ShapeCase& shape = GetParam();
  ASSERT_OK_AND_ASSIGN(auto weights,
                       MakeSyntheticModel(SmallShape(shape.n_heads, shape.n_kv_heads, shape.tied),
                                          /*seed=*/7));
  auto engine = MakeEngine(*weights);
  const std::vector<int32_t> tokens = RandomTokens(40, weights->config.vocab_size, 11);
  const auto expected = ReferenceLogits(*weights, tokens);
  // Token by token, so every position's logits are checked.
  const auto actual = ChunkedLogits(*engine, tokens, 1);
  ASSERT_EQ(actual.size(), expected.size());
  double worst = 0.0;
  for (size_t p = 0; p < actual.size(); ++p) {
    worst = std::max(worst, MaxRelativeError(actual[p], expected[p]));
  }
  EXPECT_LE(worst, 1e-4) << shape.name;
  RecordProperty("max_relative_error", std::to_string(worst));
}

INSTANTIATE_TEST_SUITE_P(Shapes, EngineVsReference,
                         ::testing::Values(ShapeCase{"MHA", 8, 8, true},
                                           ShapeCase{"GQA2", 8, 4, true},
                                           ShapeCase{"GQA4", 8, 2, true},
                                           ShapeCase{"MQA", 8, 1, true},
                                           ShapeCase{"Untied", 4, 2, false}),
                         [](const auto& info) { return info.param.name; });

TEST(Engine, ChunkedPrefillMatchesOnePass) {
  ASSERT_OK_AND_ASSIGN(auto weights, MakeSyntheticModel(SmallShape(8, 2), 3));
  auto engine = MakeEngine(*weights);
  const std::vector<int32_t> tokens = RandomTokens(100, weights->config.vocab_size, 5);
  const std::vector<float> whole = ChunkedLogits(*engine, tokens, 100).back();
  for (int chunk : {1, 7, 16, 64}) {
    const std::vector<float> last = ChunkedLogits(*engine, tokens, chunk).back();
    double max_diff = 0.0;
    for (size_t i = 0; i < whole.size(); ++i) {
      max_diff = std::max<double>(max_diff, std::abs(last[i] - whole[i]));
    }
    EXPECT_LE(max_diff, 1e-5) << "chunk " << chunk;
  }
  EXPECT_EQ(engine->block_pool().num_free(), engine->block_pool().num_blocks());
}

// Greedy tokens of one sequence must not depend on what else is in its batch.
TEST(Engine, GreedyTokensAreBatchInvariant) {
  ASSERT_OK_AND_ASSIGN(auto weights, MakeSyntheticModel(SmallShape(8, 4), 21));
  EngineOptions options;
  options.num_blocks = 64;
  auto engine = MakeEngine(*weights, options);
  const int vocab = weights->config.vocab_size;
  const std::vector<int32_t> prompt = RandomTokens(20, vocab, 1);
  constexpr int kNew = 30;

  GenerateRequest request;
  request.prompt = prompt;
  request.max_new_tokens = kNew;
  ASSERT_OK_AND_ASSIGN(GenerateResult alone, Generate(*engine, request));
  ASSERT_EQ(alone.tokens.size(), size_t{kNew});

  // The same sequence, stepped with two neighbours: one decoding from the
  // start, one that prefills a long prompt in chunks while ours decodes.
  BlockTable ours = engine->NewSequence(), decoder = engine->NewSequence(),
             prefiller = engine->NewSequence();
  const std::vector<int32_t> other_prompt = RandomTokens(9, vocab, 2);
  const std::vector<int32_t> long_prompt = RandomTokens(90, vocab, 3);
  std::vector<int32_t> got;
  int32_t our_next = -1, decoder_next = -1;
  size_t long_at = 0;
  for (int step = 0; static_cast<int>(got.size()) < kNew; ++step) {
    std::vector<BatchItem> items;
    std::vector<int32_t> ours_in = step == 0 ? prompt : std::vector<int32_t>{our_next};
    std::vector<int32_t> dec_in = step == 0 ? other_prompt : std::vector<int32_t>{decoder_next};
    items.push_back({&decoder, dec_in, true});
    if (long_at < long_prompt.size()) {
      const size_t n = std::min<size_t>(13, long_prompt.size() - long_at);
      items.push_back({&prefiller, std::span(long_prompt).subspan(long_at, n), false});
      long_at += n;
    }
    items.push_back({&ours, ours_in, true});
    ASSERT_OK_AND_ASSIGN(std::vector<float> logits, engine->Step(items));
    decoder_next = Argmax(std::span(logits).subspan(0, vocab));
    our_next = Argmax(std::span(logits).subspan(vocab, vocab));
    got.push_back(our_next);
  }
  EXPECT_EQ(got, alone.tokens);
  for (BlockTable* t : {&ours, &decoder, &prefiller}) engine->Release(*t);
  EXPECT_EQ(engine->block_pool().num_free(), engine->block_pool().num_blocks());
}

TEST(Engine, EveryBlockIsFreeAfterSequencesFinishOrAbort) {
  ASSERT_OK_AND_ASSIGN(auto weights, MakeSyntheticModel(SmallShape(4, 4), 9));
  EngineOptions options;
  options.num_blocks = 40;
  auto engine = MakeEngine(*weights, options);
  BlockPool& pool = engine->block_pool();
  std::mt19937_64 rng(42);
  std::vector<BlockTable> live;
  for (int step = 0; step < 300; ++step) {
    if (live.size() < 6 && rng() % 3 == 0) live.push_back(engine->NewSequence());
    std::vector<BatchItem> items;
    std::vector<std::vector<int32_t>> inputs;
    inputs.reserve(live.size());
    for (BlockTable& t : live) {
      inputs.push_back(RandomTokens(1 + rng() % 20, weights->config.vocab_size, rng()));
      items.push_back({&t, inputs.back(), rng() % 2 == 0});
    }
    if (!items.empty()) {
      auto logits = engine->Step(items);
      // A full pool or a full context is an expected outcome here; anything
      // else is a bug.
      if (!logits.ok()) {
        ASSERT_THAT(logits.status().code(), ::testing::AnyOf(absl::StatusCode::kResourceExhausted,
                                                             absl::StatusCode::kInvalidArgument))
            << logits.status();
      }
    }
    // Finish or abort a random sequence.
    if (!live.empty() && rng() % 4 == 0) {
      const size_t victim = rng() % live.size();
      engine->Release(live[victim]);
      live.erase(live.begin() + victim);
    }
    int held = 0;
    for (const BlockTable& t : live) held += static_cast<int>(t.blocks().size());
    ASSERT_EQ(pool.num_used(), held) << "step " << step;
  }
  for (BlockTable& t : live) engine->Release(t);
  EXPECT_EQ(pool.num_free(), pool.num_blocks());
}

// A KV pool beyond the block limit, or beyond the machine's memory, is a
// clear error naming the flag, not an allocation failure or a later
// out-of-memory kill (the CPU backend touches every page it hands out).
TEST(Engine, AnImpossibleKvCacheIsRefusedNamingTheFlag) {
  ASSERT_OK_AND_ASSIGN(auto weights, MakeSyntheticModel(SmallShape(4, 2), 1));
  auto backend = CpuBackend::Create();
  ASSERT_OK(backend.status());
  EngineOptions options;
  options.num_blocks = kMaxKvBlocks + 1;
  EXPECT_THAT(Engine::Create(*weights, std::move(backend).value(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--kv_blocks")));
}

TEST(Engine, BadInputIsRejectedWithoutSideEffects) {
  ASSERT_OK_AND_ASSIGN(auto weights, MakeSyntheticModel(SmallShape(4, 2), 1));
  EngineOptions options;
  options.num_blocks = 4;  // 64 tokens
  options.max_batch_tokens = 100;
  auto engine = MakeEngine(*weights, options);
  BlockTable table = engine->NewSequence();
  const int32_t bad_id[] = {5, 101};
  const BatchItem out_of_range{&table, bad_id, true};
  EXPECT_THAT(engine->Step({&out_of_range, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token id 101")));
  const BatchItem empty{&table, {}, true};
  EXPECT_THAT(engine->Step({&empty, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no tokens")));
  const std::vector<int32_t> too_long(129, 1);
  const BatchItem over_context{&table, too_long, true};
  EXPECT_THAT(engine->Step({&over_context, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("context")));
  const std::vector<int32_t> seventy(70, 1);
  const BatchItem over_pool{&table, seventy, true};
  EXPECT_THAT(engine->Step({&over_pool, 1}),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("KV cache full")));
  const int32_t good_id[] = {5};
  const BatchItem twice[] = {{&table, good_id, true}, {&table, good_id, true}};
  EXPECT_THAT(engine->Step(twice),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("repeats a sequence")));
  EXPECT_EQ(table.num_tokens(), 0);
  EXPECT_EQ(engine->block_pool().num_free(), 4);

  GenerateRequest request;
  EXPECT_THAT(Generate(*engine, request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("prompt is empty")));
  request.prompt.assign(128, 1);
  EXPECT_THAT(Generate(*engine, request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("context")));
  request.prompt = {1, 2};
  request.sampling.top_p = 0.0f;
  EXPECT_THAT(Generate(*engine, request),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("top_p")));
  EXPECT_EQ(engine->block_pool().num_free(), 4);
}

TEST(Engine, GenerationStopsAtContextEnd) {
  ASSERT_OK_AND_ASSIGN(auto weights, MakeSyntheticModel(SmallShape(4, 4), 2));
  auto engine = MakeEngine(*weights);
  GenerateRequest request;
  request.prompt = RandomTokens(120, weights->config.vocab_size, 8);
  request.max_new_tokens = 50;
  ASSERT_OK_AND_ASSIGN(GenerateResult result, Generate(*engine, request));
  // 120 prompt tokens + 8 generated fill the 128 positions; the 9th generated
  // token is the one sampled at the last position.
  EXPECT_EQ(result.finish, FinishReason::kContext);
  EXPECT_EQ(result.tokens.size(), 9u);
  EXPECT_EQ(engine->block_pool().num_free(), engine->block_pool().num_blocks());
}

// What a prefill worker and a decode worker do: one engine prefills and,
// layer by layer as each layer's K/V is written, its blocks are copied into
// another engine's cache at other block ids; the second engine then
// continues the sequence exactly as the first does.
TEST(Engine, KvCopiedLayerByLayerContinuesTheSequence) {
  ASSERT_OK_AND_ASSIGN(auto weights, MakeSyntheticModel(SmallShape(4, 2), 3));
  auto prefill = MakeEngine(*weights, EngineOptions{.num_blocks = 16});
  auto decode = MakeEngine(*weights, EngineOptions{.num_blocks = 16});
  const std::vector<int32_t> prompt = RandomTokens(37, weights->config.vocab_size, 4);
  const KvLayout& layout = prefill->kv_layout();
  ASSERT_EQ(prefill->kv_cache_bytes(), layout.total_bytes());

  // The decode side holds other blocks first, so the ids differ.
  BlockTable other = decode->NewSequence();
  ASSERT_OK(other.Reserve(40, decode->block_pool()));
  BlockTable source = prefill->NewSequence();
  BlockTable destination = decode->NewSequence();
  ASSERT_OK(destination.Reserve(static_cast<int>(prompt.size()) + 1, decode->block_pool()));
  ASSERT_NE(destination.blocks()[0], 0);

  std::vector<int> layers_seen;
  const BatchItem item{&source, prompt, true};
  auto copy_layer = [&](int layer) {
    layers_seen.push_back(layer);
    for (size_t i = 0; i < source.blocks().size(); ++i) {
      std::memcpy(static_cast<uint8_t*>(decode->kv_cache()) +
                      layout.BlockOffset(layer, destination.blocks()[i]) * layout.element_bytes(),
                  static_cast<uint8_t*>(prefill->kv_cache()) +
                      layout.BlockOffset(layer, source.blocks()[i]) * layout.element_bytes(),
                  layout.block_bytes());
    }
  };
  ASSERT_OK_AND_ASSIGN(std::vector<float> logits, prefill->Step({&item, 1}, copy_layer));
  EXPECT_THAT(layers_seen, ::testing::ElementsAre(0, 1, 2));
  destination.Advance(static_cast<int>(prompt.size()));

  const int32_t next = Argmax(logits);
  const BatchItem a{&source, {&next, 1}, true};
  const BatchItem b{&destination, {&next, 1}, true};
  ASSERT_OK_AND_ASSIGN(std::vector<float> want, prefill->Step({&a, 1}));
  ASSERT_OK_AND_ASSIGN(std::vector<float> got, decode->Step({&b, 1}));
  EXPECT_EQ(got, want);
}

TEST(Engine, AllLogitsGivesEveryPositionsRow) {
  ASSERT_OK_AND_ASSIGN(auto weights, MakeSyntheticModel(SmallShape(8, 2), 3));
  auto engine = MakeEngine(*weights, EngineOptions{.max_logit_rows = 16});
  const int vocab = weights->config.vocab_size;
  const std::vector<int32_t> tokens = RandomTokens(12, vocab, 8);
  const std::vector<std::vector<float>> one_by_one = ChunkedLogits(*engine, tokens, 1);

  // Two chunks, the second batched with another sequence's last row.
  BlockTable table = engine->NewSequence(), other = engine->NewSequence();
  const std::span<const int32_t> all(tokens);
  BatchItem first{&table, all.subspan(0, 5)};
  first.all_logits = true;
  ASSERT_OK_AND_ASSIGN(std::vector<float> rows, engine->Step({&first, 1}));
  ASSERT_EQ(rows.size(), 5u * vocab);
  std::vector<BatchItem> items = {BatchItem{&other, all.subspan(0, 3), true},
                                  BatchItem{&table, all.subspan(5, 7)}};
  items[1].all_logits = true;
  ASSERT_OK_AND_ASSIGN(std::vector<float> more, engine->Step(items));
  ASSERT_EQ(more.size(), 8u * vocab);
  rows.insert(rows.end(), more.begin() + vocab, more.end());
  for (int p = 0; p < 12; ++p) {
    for (int v = 0; v < vocab; ++v) {
      ASSERT_NEAR(rows[p * vocab + v], one_by_one[p][v], 1e-4) << "position " << p;
    }
  }
  // Over max_logit_rows: refused, nothing changes.
  BlockTable big = engine->NewSequence();
  const std::vector<int32_t> many = RandomTokens(17, vocab, 9);
  BatchItem over{&big, many};
  over.all_logits = true;
  EXPECT_THAT(engine->Step({&over, 1}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_logit_rows")));
  EXPECT_EQ(big.num_tokens(), 0);
  engine->Release(table);
  engine->Release(other);
}

// Items that pick greedily get the index of their row's largest logit in
// `picks` and add no row: the rows returned are the others', in item order.
TEST(Engine, GreedyPicksReplaceTheirRowsOfLogits) {
  ASSERT_OK_AND_ASSIGN(auto weights, MakeSyntheticModel(SmallShape(8, 2), 3));
  auto engine = MakeEngine(*weights, EngineOptions{.max_logit_rows = 8});
  const int vocab = weights->config.vocab_size;
  // Four sequences, two prompts: each picked one has a twin with logits.
  const std::vector<int32_t> a = RandomTokens(6, vocab, 21), b = RandomTokens(9, vocab, 22);
  std::vector<BlockTable> tables;
  for (int i = 0; i < 4; ++i) tables.push_back(engine->NewSequence());
  std::vector<BatchItem> items = {BatchItem{&tables[0], a}, BatchItem{&tables[1], a},
                                  BatchItem{&tables[2], b}, BatchItem{&tables[3], b}};
  items[0].pick_greedy = items[3].pick_greedy = true;
  std::vector<int32_t> picks = {99, 99, 99};  // replaced, not appended to
  ASSERT_OK_AND_ASSIGN(std::vector<float> rows, engine->Step(items, nullptr, &picks));
  ASSERT_EQ(rows.size(), 2u * vocab);
  const std::span<const float> row_a(rows.data(), vocab), row_b(rows.data() + vocab, vocab);
  ASSERT_EQ(picks.size(), 2u);
  EXPECT_EQ(picks[0], Argmax(row_a));
  EXPECT_EQ(picks[1], Argmax(row_b));
  for (const BlockTable& t : tables) EXPECT_EQ(t.num_tokens(), &t < &tables[2] ? 6 : 9);

  // A step of picks only waits for the pass and returns no logits.
  std::vector<BatchItem> next = {BatchItem{&tables[0], {&picks[0], 1}},
                                 BatchItem{&tables[3], {&picks[1], 1}}};
  next[0].pick_greedy = next[1].pick_greedy = true;
  ASSERT_OK_AND_ASSIGN(std::vector<float> none, engine->Step(next, nullptr, &picks));
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(picks.size(), 2u);
  EXPECT_EQ(tables[0].num_tokens(), 7);

  // Refused without side effects: nowhere to put a pick, or a pick with
  // every row's logits, or without logits.
  BatchItem bad{&tables[1], {&picks[0], 1}};
  bad.pick_greedy = true;
  EXPECT_THAT(engine->Step({&bad, 1}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("picks greedily")));
  bad.all_logits = true;
  EXPECT_THAT(engine->Step({&bad, 1}, nullptr, &picks).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("picks greedily")));
  bad.all_logits = false;
  bad.want_logits = false;
  EXPECT_THAT(engine->Step({&bad, 1}, nullptr, &picks).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("picks greedily")));
  EXPECT_EQ(tables[1].num_tokens(), 6);
  for (BlockTable& t : tables) engine->Release(t);
}

// The rows that come back are the ones a step without picks gives, bit for
// bit: picking some rows does not change the others' numbers.
TEST(Engine, GreedyPicksLeaveTheOtherRowsBitForBit) {
  ASSERT_OK_AND_ASSIGN(auto weights, MakeSyntheticModel(SmallShape(8, 2), 3));
  auto engine = MakeEngine(*weights, EngineOptions{.max_logit_rows = 8});
  const int vocab = weights->config.vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(RandomTokens(5 + i, vocab, 30 + i));
  std::vector<BlockTable> plain, picked;
  for (int i = 0; i < 4; ++i) {
    plain.push_back(engine->NewSequence());
    picked.push_back(engine->NewSequence());
  }
  std::vector<BatchItem> a, b;
  for (int i = 0; i < 4; ++i) {
    a.push_back(BatchItem{&plain[i], prompts[i]});
    b.push_back(BatchItem{&picked[i], prompts[i]});
  }
  b[0].pick_greedy = b[2].pick_greedy = true;
  std::vector<int32_t> picks;
  ASSERT_OK_AND_ASSIGN(std::vector<float> all, engine->Step(a));
  ASSERT_OK_AND_ASSIGN(std::vector<float> rest, engine->Step(b, nullptr, &picks));
  ASSERT_EQ(rest.size(), 2u * vocab);
  EXPECT_EQ(std::memcmp(rest.data(), all.data() + vocab, vocab * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(rest.data() + vocab, all.data() + 3 * vocab, vocab * sizeof(float)), 0);
  EXPECT_EQ(picks[0], Argmax(std::span<const float>(all.data(), vocab)));
  EXPECT_EQ(picks[1], Argmax(std::span<const float>(all.data() + 2 * vocab, vocab)));
  for (BlockTable& t : plain) engine->Release(t);
  for (BlockTable& t : picked) engine->Release(t);
}

TEST(Engine, CopiedSequenceContinuesLikeTheOriginal) {
  ASSERT_OK_AND_ASSIGN(auto weights, MakeSyntheticModel(SmallShape(4, 2), 5));
  auto engine = MakeEngine(*weights, EngineOptions{.block_size = 8, .num_blocks = 20});
  const std::vector<int32_t> prompt = RandomTokens(21, weights->config.vocab_size, 6);
  BlockTable source = engine->NewSequence();
  const BatchItem item{&source, prompt, true};
  ASSERT_OK_AND_ASSIGN(std::vector<float> logits, engine->Step({&item, 1}));

  // One destination with its blocks reserved up front, one empty.
  BlockTable reserved = engine->NewSequence(), empty = engine->NewSequence();
  ASSERT_OK(reserved.Reserve(40, engine->block_pool()));
  ASSERT_OK(engine->CopySequence(source, 21, reserved));
  ASSERT_OK(engine->CopySequence(source, 21, empty));
  EXPECT_EQ(reserved.blocks().size(), 5u);
  EXPECT_EQ(empty.blocks().size(), 3u);
  EXPECT_EQ(empty.num_tokens(), 21);

  const int32_t next = Argmax(logits);
  std::vector<float> want;
  for (BlockTable* t : {&source, &reserved, &empty}) {
    const BatchItem step{t, {&next, 1}, true};
    ASSERT_OK_AND_ASSIGN(std::vector<float> got, engine->Step({&step, 1}));
    if (want.empty()) {
      want = got;
    } else {
      EXPECT_EQ(got, want);
    }
  }
  BlockTable nonempty = engine->NewSequence();
  EXPECT_THAT(engine->CopySequence(source, 21, reserved),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(engine->CopySequence(source, 30, nonempty),
              StatusIs(absl::StatusCode::kInvalidArgument));
  for (BlockTable* t : {&source, &reserved, &empty}) engine->Release(*t);
  EXPECT_EQ(engine->block_pool().num_free(), engine->block_pool().num_blocks());
}

}  // namespace
}  // namespace tandem
