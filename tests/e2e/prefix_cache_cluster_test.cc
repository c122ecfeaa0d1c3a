// Prefix caching across the pools: greedy outputs are the same with the
// caches on and off, colocated and disaggregated; repeated prefixes are not
// computed again; a multi-turn chat ships only its new blocks.
#include <memory>
#include <string>
#include <vector>

#include "common/base/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e/cluster_harness.h"
#include "tests/testing/model_files.h"

namespace tandem::testing {
namespace {

constexpr int kBlock = 16;

class PrefixCacheClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const ModelConfig shape{.dim = 64, .hidden_dim = 160, .n_layers = 4, .n_heads = 4,
                            .n_kv_heads = 2, .vocab_size = 512, .seq_len = 1024};
    auto files = WriteSyntheticModel(shape, 11, "prefix");
    CHECK_OK(files.status());
    model_ = files->model;
    tokenizer_ = files->tokenizer;
  }

  static std::unique_ptr<Cluster> Start(int prefill, bool cache) {
    ClusterOptions options{.prefill = prefill, .decode = 1, .model = model_,
                           .tokenizer = tokenizer_};
    if (!cache) {
      options.prefill_flags = {"--noprefix_cache"};
      options.decode_flags = {"--noprefix_cache"};
    }
    auto cluster = Cluster::Start(options);
    CHECK_OK(cluster.status());
    return std::move(cluster).value();
  }

  static v1::GenerateRequest Greedy(const std::vector<int32_t>& prompt, int max_tokens) {
    v1::GenerateRequest r;
    r.mutable_token_ids()->mutable_ids()->Assign(prompt.begin(), prompt.end());
    r.set_max_tokens(max_tokens);
    r.mutable_sampling()->set_temperature(0);
    r.set_ignore_eos(true);
    return r;
  }

  static std::vector<int32_t> Tokens(int n, int32_t from) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; ++i) v.push_back(3 + (from + 7 * i) % 500);
    return v;
  }

  static std::string model_, tokenizer_;
};

std::string PrefixCacheClusterTest::model_;
std::string PrefixCacheClusterTest::tokenizer_;

// Three prompts share a 64-token prefix; the same outputs come back with
// the caches on and off, and only the cache-on cluster skips the prefix.
TEST_F(PrefixCacheClusterTest, SharedPrefixesGiveTheSameTokensAndAreNotComputedAgain) {
  for (int prefill : {1, 0}) {
    SCOPED_TRACE(prefill == 1 ? "disaggregated" : "colocated");
    std::unique_ptr<Cluster> on = Start(prefill, true);
    std::unique_ptr<Cluster> off = Start(prefill, false);
    const std::vector<int32_t> system = Tokens(64, 1);
    for (int i = 0; i < 3; ++i) {
      std::vector<int32_t> prompt = system;
      const std::vector<int32_t> tail = Tokens(20 + 5 * i, 100 * (i + 1));
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      const Completion a = RunGenerate(on->router(), Greedy(prompt, 12));
      const Completion b = RunGenerate(off->router(), Greedy(prompt, 12));
      ASSERT_TRUE(a.status.ok()) << a.status.error_message() << on->Logs();
      ASSERT_TRUE(b.status.ok()) << b.status.error_message() << off->Logs();
      EXPECT_EQ(a.tokens, b.tokens) << "prompt " << i;
      EXPECT_EQ(a.finished.usage().cached_tokens(), i == 0 ? 0 : 64) << "prompt " << i;
      EXPECT_EQ(b.finished.usage().cached_tokens(), 0);
    }
    EXPECT_TRUE(on->WaitUntilIdle(absl::Seconds(30)).ok());
  }
}

// Each turn's prompt is the previous prompt, the previous reply and a new
// message. With the decode worker's cache the prefill worker ships only the
// blocks the decode worker does not hold yet; the replies do not change.
TEST_F(PrefixCacheClusterTest, AMultiTurnChatShipsOnlyItsNewBlocks) {
  std::unique_ptr<Cluster> on = Start(1, true);
  std::unique_ptr<Cluster> off = Start(1, false);
  std::vector<int32_t> history;
  uint64_t on_bytes = 0, off_bytes = 0;
  for (int turn = 0; turn < 5; ++turn) {
    const std::vector<int32_t> message = Tokens(24, 1000 + 37 * turn);
    history.insert(history.end(), message.begin(), message.end());
    const Completion a = RunGenerate(on->router(), Greedy(history, 10));
    const Completion b = RunGenerate(off->router(), Greedy(history, 10));
    ASSERT_TRUE(a.status.ok()) << a.status.error_message() << on->Logs();
    ASSERT_TRUE(b.status.ok()) << b.status.error_message() << off->Logs();
    ASSERT_EQ(a.tokens, b.tokens) << "turn " << turn;
    auto on_stats = on->Stats(on->decode(0));
    auto off_stats = off->Stats(off->decode(0));
    ASSERT_TRUE(on_stats.ok() && off_stats.ok());
    const uint64_t on_turn = on_stats->kv_transfer_bytes() - on_bytes;
    const uint64_t off_turn = off_stats->kv_transfer_bytes() - off_bytes;
    on_bytes = on_stats->kv_transfer_bytes();
    off_bytes = off_stats->kv_transfer_bytes();
    // Without the cache every turn ships the whole prompt's blocks.
    const uint64_t whole = (history.size() + kBlock - 1) / kBlock;
    ASSERT_GT(off_turn, 0u);
    const uint64_t block_bytes = off_turn / whole;
    if (turn == 0) {
      EXPECT_EQ(on_turn, off_turn);
    } else {
      // The decode worker holds every whole block of the previous turn's
      // prompt and reply but the reply's last token (its KV is never
      // written): only the blocks after them travel.
      const uint64_t held = (history.size() - message.size() - 1) / kBlock;
      EXPECT_EQ(on_turn, block_bytes * (whole - held)) << "turn " << turn;
      EXPECT_LT(on_turn, off_turn) << "turn " << turn;
    }
    history.insert(history.end(), a.tokens.begin(), a.tokens.end());
  }
  EXPECT_TRUE(on->WaitUntilIdle(absl::Seconds(30)).ok());
}

}  // namespace
}  // namespace tandem::testing
