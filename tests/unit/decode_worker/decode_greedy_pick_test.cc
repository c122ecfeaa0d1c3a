// The decode core lets the engine pick greedy tokens where the logits are
// (BatchItem::pick_greedy) when nothing else needs the row: the tokens are
// the ones the host's sampler picks, and a request whose sampler or
// logprobs need the row gets it.
#include <algorithm>
#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/forwarding_backend.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/decode_worker/decode_test_util.h"

namespace tandem::decode::testing {
namespace {

// Counts the rows the engine picks on the backend.
class CountingBackend final : public ::tandem::testing::ForwardingBackend {
 public:
  CountingBackend(std::unique_ptr<Backend> inner, std::atomic<int>* picked)
      : ForwardingBackend(std::move(inner)), picked_(picked) {}
  void Argmax(const float* x, int rows, int n, int32_t* out) override {
    picked_->fetch_add(rows);
    ForwardingBackend::Argmax(x, rows, n, out);
  }

 private:
  std::atomic<int>* picked_;
};

class GreedyPicks : public ::testing::Test {
 protected:
  GreedyPicks() {
    HarnessSetup setup;
    setup.backend = std::make_unique<CountingBackend>(OneThreadBackend(), &picked_);
    harness_ = std::make_unique<DecodeHarness>(DecodeLoopOptions{}, kvtransfer::FaultPlan{},
                                               std::move(setup));
  }

  // Runs `r` to its end; choice `index`'s tokens, and how many rows were
  // picked for the request.
  std::pair<std::vector<int32_t>, int> Run(const Request& r, int index = 0) {
    const int before = picked_.load();
    auto sink = NewSink();
    EXPECT_OK(harness_->loop().Submit(r, sink).status());
    EXPECT_TRUE(sink->WaitEnded());
    EXPECT_OK(sink->status());
    last_sink_ = sink;
    return {sink->tokens(index), picked_.load() - before};
  }

  std::shared_ptr<RecordingSink> last_sink_;

  std::atomic<int> picked_{0};
  std::unique_ptr<DecodeHarness> harness_;
};

constexpr int kMaxTokens = 8;

// The first token comes from the prompt's last row (the logits come back
// for it); each of the other 7 is a decode step's pick.
TEST_F(GreedyPicks, GreedyDecodeStepsArePickedAndGiveTheSameTokens) {
  const Request r =
      LocalRequest("greedy", RandomTokens(20, harness_->config().vocab_size, 5), kMaxTokens);
  const auto [tokens, picked] = Run(r);
  EXPECT_EQ(tokens, harness_->Expected(r));
  EXPECT_EQ(picked, kMaxTokens - 1);

  // Two choices decode side by side: both picked, both the greedy text.
  Request two = r;
  two.request_id = "greedy-n2";
  two.n = 2;
  EXPECT_EQ(Run(two), std::make_pair(tokens, 2 * (kMaxTokens - 1)));
  EXPECT_EQ(last_sink_->tokens(1), tokens);
}

TEST_F(GreedyPicks, RowsThatAreNeededComeBack) {
  const int vocab = harness_->config().vocab_size;
  const Request plain = LocalRequest("plain", RandomTokens(20, vocab, 6), kMaxTokens);
  const std::vector<int32_t> greedy = harness_->Expected(plain);

  // Logprobs need the row: nothing is picked, the tokens are the same.
  Request logprobs = plain;
  logprobs.request_id = "logprobs";
  logprobs.logprobs = 2;
  EXPECT_EQ(Run(logprobs), std::make_pair(greedy, 0));

  // A penalty or a temperature changes what is picked from the row.
  Request penalised = plain;
  penalised.request_id = "penalised";
  penalised.sampling.presence_penalty = 0.5f;
  auto [penalised_tokens, penalised_picks] = Run(penalised);
  EXPECT_EQ(penalised_tokens, harness_->Expected(penalised));
  EXPECT_EQ(penalised_picks, 0);
  Request hot = plain;
  hot.request_id = "hot";
  hot.sampling.temperature = 0.9f;
  hot.sampling.seed = 4;
  auto [hot_tokens, hot_picks] = Run(hot);
  EXPECT_EQ(hot_tokens, harness_->Expected(hot));
  EXPECT_EQ(hot_picks, 0);

  // min_tokens masks the stop ids until 3 tokens were accepted: the steps
  // of tokens 2 and 3 need the row, tokens 4 to 8 are picked. The stop id is
  // one greedy decoding never reaches, so the text stays the greedy one.
  Request min_tokens = plain;
  min_tokens.request_id = "min-tokens";
  min_tokens.sampling.min_tokens = 3;
  int32_t unused = 0;
  while (std::find(greedy.begin(), greedy.end(), unused) != greedy.end()) ++unused;
  min_tokens.stop_token_ids = {unused};
  EXPECT_EQ(Run(min_tokens), std::make_pair(greedy, kMaxTokens - 3));
}

}  // namespace
}  // namespace tandem::decode::testing
