// Prefix-aware routing end to end through the router's core, over fake
// prefill and decode workers on real gRPC: requests sharing a 64-token
// prefix stay on one prefill (and decode) worker while unrelated prompts
// spread; routing by load alone does neither.
#include "router/prefix_routing.h"

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/router/router_harness.h"

namespace tandem::router::testing {
namespace {

// `n` token ids in 3..62 (no BOS or EOS), a different run per seed.
std::vector<int32_t> Tokens(int n, int seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(3 + (i * 7 + seed * 13) % 60);
  return t;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Served {
  std::string prefill;
  std::string decode;
};

class PrefixRoutingTest : public ::testing::TestWithParam<bool> {
 protected:
  // Starts 2 prefill and 2 decode workers behind a router with prefix
  // routing (the parameter) or by load alone.
  void SetUp() override {
    HarnessOptions options{.prefill = 2, .decode = 2};
    if (GetParam()) {
      // A small load penalty: a request of this test that the router still
      // counts in flight on a worker (its stream's end not yet delivered)
      // weighs less than the 64 cached tokens.
      options.router.driver.prefix_router =
          std::make_shared<PrefixRouter>(PrefixRoutingOptions{.load_tokens = 16});
    }
    h_ = std::make_unique<RouterHarness>(std::move(options));
    ASSERT_OK(h_->Start());
  }

  Served Run(const std::vector<int32_t>& prompt) {
    const Result r = h_->Run(TokenRequest(prompt, 4));
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens.size(), 4u);
    return {r.finished.prefill_worker(), r.finished.decode_worker()};
  }

  std::unique_ptr<RouterHarness> h_;
};

TEST_P(PrefixRoutingTest, SharedPrefixesStayTogetherAndUnrelatedPromptsSpread) {
  const bool prefix = GetParam();
  const std::vector<int32_t> system_p = Tokens(64, 1);
  const std::vector<int32_t> system_q = Tokens(64, 2);
  std::vector<Served> p;
  std::vector<Served> q;
  // Alternating, each with its own 8-token suffix.
  for (int i = 0; i < 3; ++i) {
    p.push_back(Run(Concat(system_p, Tokens(8, 10 + i))));
    q.push_back(Run(Concat(system_q, Tokens(8, 20 + i))));
  }
  std::set<std::string> p_prefill, q_prefill, p_decode, q_decode;
  for (const Served& s : p) {
    p_prefill.insert(s.prefill);
    p_decode.insert(s.decode);
  }
  for (const Served& s : q) {
    q_prefill.insert(s.prefill);
    q_decode.insert(s.decode);
  }
  std::set<std::string> unrelated_prefill;
  for (int i = 0; i < 4; ++i) unrelated_prefill.insert(Run(Tokens(72, 40 + i)).prefill);

  const std::string first = h_->prefill_address(h_->FirstPrefill());
  if (prefix) {
    // Every request of a prefix on one prefill and one decode worker, the
    // two prefixes on different ones.
    ASSERT_EQ(p_prefill.size(), 1u);
    ASSERT_EQ(q_prefill.size(), 1u);
    EXPECT_NE(*p_prefill.begin(), *q_prefill.begin());
    ASSERT_EQ(p_decode.size(), 1u);
    ASSERT_EQ(q_decode.size(), 1u);
    EXPECT_NE(*p_decode.begin(), *q_decode.begin());
    // Prompts sharing nothing use both prefill workers.
    EXPECT_EQ(unrelated_prefill.size(), 2u);
  } else {
    // By load alone, idle workers tie and the first address takes all:
    // the two prefixes share one worker's cache, and nothing spreads.
    EXPECT_EQ(p_prefill, std::set<std::string>{first});
    EXPECT_EQ(q_prefill, std::set<std::string>{first});
    EXPECT_EQ(unrelated_prefill, std::set<std::string>{first});
  }
}

TEST_P(PrefixRoutingTest, AFailedPrefillIsStillRetriedOnTheOtherWorker) {
  const std::vector<int32_t> prompt = Concat(Tokens(64, 1), Tokens(8, 3));
  const Served warm = Run(prompt);
  // The worker holding the prefix now fails: the retry goes to the other.
  const int holder = warm.prefill == h_->prefill_address(0) ? 0 : 1;
  h_->prefill(holder).SetBehaviour({.fail = absl::UnavailableError("down")});
  const Served retried = Run(Concat(Tokens(64, 1), Tokens(8, 4)));
  EXPECT_EQ(retried.prefill, h_->prefill_address(1 - holder));
  EXPECT_EQ(h_->prefill(holder).requests().size(), 2u);
}

TEST(PrefixRoutingIndexTest, AFinishedSequenceLeavesItsGeneratedBlocksOnTheDecodeWorker) {
  auto prefix = std::make_shared<PrefixRouter>();
  HarnessOptions options{.prefill = 1, .decode = 1};
  options.router.driver.prefix_router = prefix;
  RouterHarness h(std::move(options));
  ASSERT_OK(h.Start());
  const std::vector<int32_t> prompt = Tokens(40, 1);
  const Result r = h.Run(TokenRequest(prompt, 30));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.tokens.size(), 30u);
  // The prompt's 2 full blocks on the prefill worker; on the decode worker
  // the 4 full blocks of prompt + completion (70 tokens, the last one's K/V
  // never written), recorded before the client saw the end.
  EXPECT_EQ(prefix->index(WorkerRole::kPrefill).size(h.prefill_address(0)), 2);
  EXPECT_EQ(prefix->index(WorkerRole::kDecode).size(h.decode_address(0)), 4);

  // A failed request records no completion.
  h.decode(0).SetBehaviour({.fail_after = 5});
  const Result failed = h.Run(TokenRequest(Tokens(40, 7), 30));
  EXPECT_FALSE(failed.status.ok());
  EXPECT_EQ(prefix->index(WorkerRole::kDecode).size(h.decode_address(0)), 6);  // + 2 prompt blocks.
}

INSTANTIATE_TEST_SUITE_P(Policies, PrefixRoutingTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Prefix" : "Load";
                         });

}  // namespace
}  // namespace tandem::router::testing
