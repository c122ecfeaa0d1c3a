// The decode loop's KV admission with a watermark, preemption by recompute
// and priorities: requests whose blocks cannot all be held at once still
// complete with the tokens a lone run gives (greedy, or sampled: a resumed
// request carries on with its sampler's draws), waiting requests are
// admitted by priority, the lowest priority running request is the one
// preempted, and no block leaks whatever ends a request.
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/decode_worker/decode_test_util.h"
#include "tests/unit/decode_worker/step_gate.h"

namespace tandem::decode::testing {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

// Forwards to a RecordingSink and appends `name` to a shared log when the
// request ends (well or not), so that a test sees the order of ends.
class EndOrderSink final : public EventSink {
 public:
  struct Log {
    absl::Mutex mu;
    std::vector<std::string> ends ABSL_GUARDED_BY(mu);
    std::vector<std::string> Get() {
      absl::MutexLock lock(&mu);
      return ends;
    }
  };
  EndOrderSink(std::string name, Log* log, std::shared_ptr<RecordingSink> inner)
      : name_(std::move(name)), log_(log), inner_(std::move(inner)) {}

  void OnReserved(const Reservation& r) override { inner_->OnReserved(r); }
  void OnPromptLogprobs(std::span<const TokenLogprob> l) override { inner_->OnPromptLogprobs(l); }
  void OnTokens(int index, std::span<const int32_t> ids,
                std::span<const TokenLogprob> logprobs) override {
    inner_->OnTokens(index, ids, logprobs);
  }
  void OnFinished(const Finished& f) override {
    if (f.last) Ended();
    inner_->OnFinished(f);
  }
  void OnMoving(bool ships_kv) override { inner_->OnMoving(ships_kv); }
  void OnFailed(const absl::Status& status) override {
    Ended();
    inner_->OnFailed(status);
  }

 private:
  void Ended() {
    absl::MutexLock lock(&log_->mu);
    log_->ends.push_back(name_);
  }
  const std::string name_;
  Log* const log_;
  const std::shared_ptr<RecordingSink> inner_;
};

// A decode harness whose engine steps can be held (GatedBackend).
struct GatedHarness {
  explicit GatedHarness(DecodeLoopOptions options) {
    auto gated = std::make_unique<GatedBackend>(OneThreadBackend(), &log);
    gate = gated.get();
    HarnessSetup setup;
    setup.backend = std::move(gated);
    h = std::make_unique<DecodeHarness>(options, kvtransfer::FaultPlan{}, std::move(setup));
  }
  StepLog log;
  GatedBackend* gate = nullptr;
  std::unique_ptr<DecodeHarness> h;
};

// Parameters: the prefix cache on or off; greedy or sampled decoding.
class DecodePreemption : public ::testing::TestWithParam<std::tuple<bool, bool>> {
 protected:
  // Sampled: every request draws with its own seed, through top-p and a
  // frequency penalty (which counts the tokens generated so far), so that a
  // resumed request must carry on with its sampler's draws and counts.
  Request Sampled(Request r, uint64_t seed) const {
    if (std::get<1>(GetParam())) {
      r.sampling = SamplingParams{
          .temperature = 0.9f, .top_p = 0.95f, .seed = seed, .frequency_penalty = 0.4f};
    }
    return r;
  }
};

// Tokens a lone run gives for choice `c` of `r` (seed ChoiceSeed(seed, c)).
std::vector<int32_t> ExpectedChoice(DecodeHarness& h, Request r, int c) {
  r.sampling.seed = ChoiceSeed(r.sampling.seed, c);
  return h.Expected(r);
}

// Five requests (one remote, one of two choices) that would need 30 blocks
// at their longest share a pool of 12: they are preempted and recomputed
// (from the prefix cache, or whole without it), and every one gives the
// tokens a lone run gives, greedy or sampled.
TEST_P(DecodePreemption, EveryRequestCompletesWithTheTokensOfALoneRun) {
  DecodeLoopOptions options;
  options.kv_blocks = 12;  // 16 tokens a block; each request reaches 70+.
  options.kv_watermark_blocks = 1;
  options.prefix_cache = std::get<0>(GetParam());
  GatedHarness g(options);
  DecodeHarness& h = *g.h;
  g.gate->Arm();

  // The remote one first: reserved, prefilled, started, held in its first
  // decode step while the others are submitted, so that all of them arrive
  // in one round and grow together.
  const Request remote = Sampled(RemoteRequest("remote", RandomTokens(12, kVocab, 1), 60), 77);
  auto remote_sink = NewSink();
  ASSERT_OK(h.loop().Submit(remote, remote_sink).status());
  ASSERT_TRUE(remote_sink->WaitReserved());
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> first,
                       h.prefill().PrefillChoices(remote.prompt, remote_sink->descriptor(), -1,
                                                  remote.sampling, 1, remote.stop_token_ids));
  StartResult start;
  h.loop().Start(remote.request_id, remote_sink->generation(), first[0], {}, start.Callback(),
                 h.prefill().last_draws());
  ASSERT_OK(start.Wait());
  ASSERT_TRUE(g.gate->WaitHeld(1, kWait));

  std::vector<Request> locals;
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int i = 0; i < 4; ++i) {
    Request r = Sampled(
        LocalRequest(absl::StrCat("local", i), RandomTokens(10 + 3 * i, kVocab, 10 + i), 58 + i),
        100 + i);
    if (i == 3) r.n = 2;
    locals.push_back(r);
    sinks.push_back(NewSink());
    ASSERT_OK(h.loop().Submit(r, sinks.back()).status());
  }
  g.gate->Disarm();
  g.gate->Allow();

  ASSERT_TRUE(remote_sink->WaitEnded());
  ASSERT_OK(remote_sink->status());
  std::vector<int32_t> remote_tokens = {first[0]};
  for (int32_t t : remote_sink->tokens()) remote_tokens.push_back(t);
  EXPECT_EQ(remote_tokens, h.Expected(remote));
  for (size_t i = 0; i < locals.size(); ++i) {
    ASSERT_TRUE(sinks[i]->WaitEnded());
    ASSERT_OK(sinks[i]->status());
    for (int c = 0; c < locals[i].n; ++c) {
      EXPECT_EQ(sinks[i]->tokens(c), ExpectedChoice(h, locals[i], c))
          << "request " << i << " choice " << c;
    }
  }
  const LoopStats stats = h.loop().Stats();
  EXPECT_GT(stats.preemptions, 0u);
  EXPECT_EQ(stats.requests_failed, 0u);
  EXPECT_TRUE(h.AllBlocksFree());
}

INSTANTIATE_TEST_SUITE_P(CacheAndSampling, DecodePreemption,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<bool, bool>>& info) {
                           return absl::StrCat(std::get<0>(info.param) ? "Cached" : "Uncached",
                                               std::get<1>(info.param) ? "Sampled" : "Greedy");
                         });

// A remote reservation holds 7 of 8 blocks; two local requests needing 5
// each wait (they are not refused), and when it is cancelled the one of
// higher priority is admitted and computed first although it came second.
TEST(DecodePriority, HigherPriorityIsAdmittedFirst) {
  DecodeLoopOptions options;
  options.kv_blocks = 8;
  options.kv_watermark_blocks = 0;
  GatedHarness g(options);
  DecodeHarness& h = *g.h;
  auto holder = NewSink();
  ASSERT_OK_AND_ASSIGN(
      DecodeLoop::Ticket held,
      h.loop().Submit(RemoteRequest("holder", RandomTokens(100, kVocab, 1), 5), holder));
  ASSERT_TRUE(holder->WaitReserved());
  // 69 and 70 prompt tokens: 5 blocks each with the first decode token.
  Request low = LocalRequest("low", RandomTokens(69, kVocab, 2), 4);
  Request high = LocalRequest("high", RandomTokens(70, kVocab, 3), 4);
  high.priority = 3;
  auto low_sink = NewSink();
  auto high_sink = NewSink();
  ASSERT_OK(h.loop().Submit(low, low_sink).status());
  ASSERT_OK(h.loop().Submit(high, high_sink).status());
  ASSERT_TRUE(WaitFor([&] { return h.loop().Stats().waiting == 3; }));
  EXPECT_FALSE(low_sink->WaitEnded(absl::ZeroDuration()));
  EXPECT_FALSE(high_sink->WaitEnded(absl::ZeroDuration()));
  g.gate->Arm();
  h.loop().Cancel(held);
  ASSERT_TRUE(g.gate->WaitHeld(1, kWait));
  EXPECT_EQ(g.log.step_rows(), std::vector<int>{70});  // High's prompt, alone.
  g.gate->Disarm();
  g.gate->Allow();
  ASSERT_TRUE(high_sink->WaitEnded());
  ASSERT_TRUE(low_sink->WaitEnded());
  ASSERT_OK(high_sink->status());
  ASSERT_OK(low_sink->status());
  EXPECT_EQ(high_sink->tokens(), h.Expected(high));
  EXPECT_EQ(low_sink->tokens(), h.Expected(low));
  EXPECT_TRUE(h.AllBlocksFree());
}

// Two running requests outgrow a pool of 8: the older one, of lower
// priority, is preempted (not the newer one), so the newer one ends first;
// both give the tokens of a lone run.
TEST(DecodePriority, LowestPriorityRunningRequestIsTheVictim) {
  DecodeLoopOptions options;
  options.kv_blocks = 8;
  options.kv_watermark_blocks = 0;
  GatedHarness g(options);
  DecodeHarness& h = *g.h;
  g.gate->Arm();
  EndOrderSink::Log order;
  // 30 + 90 tokens: the whole pool alone. 30 + 60: 6 blocks.
  const Request low = LocalRequest("low", RandomTokens(30, kVocab, 4), 90);
  Request high = LocalRequest("high", RandomTokens(30, kVocab, 5), 60);
  high.priority = 1;
  auto low_sink = NewSink();
  auto high_sink = NewSink();
  ASSERT_OK(h.loop().Submit(low, std::make_shared<EndOrderSink>("low", &order, low_sink)).status());
  ASSERT_TRUE(g.gate->WaitHeld(1, kWait));  // Low's prompt.
  ASSERT_OK(
      h.loop().Submit(high, std::make_shared<EndOrderSink>("high", &order, high_sink)).status());
  g.gate->Disarm();
  g.gate->Allow();
  ASSERT_TRUE(low_sink->WaitEnded());
  ASSERT_TRUE(high_sink->WaitEnded());
  ASSERT_OK(low_sink->status());
  ASSERT_OK(high_sink->status());
  EXPECT_EQ(order.Get(), (std::vector<std::string>{"high", "low"}));
  EXPECT_EQ(low_sink->tokens(), h.Expected(low));
  EXPECT_EQ(high_sink->tokens(), h.Expected(high));
  EXPECT_GT(h.loop().Stats().preemptions, 0u);
  EXPECT_TRUE(h.AllBlocksFree());
}

// A seeded mix of requests sharing prefixes (some of two choices, various
// priorities), some cancelled at once or after a few tokens, in a pool far
// too small for them: each one ends OK with the lone run's tokens or
// CANCELLED with a prefix of them; afterwards every block is free or
// cached, and a flush empties the cache.
TEST(DecodePreemptionMix, NoBlockLeaksWhateverEndsARequest) {
  DecodeLoopOptions options;
  options.kv_blocks = 16;
  options.kv_watermark_blocks = 1;
  GatedHarness g(options);
  DecodeHarness& h = *g.h;
  std::mt19937 rng(1234);
  const std::vector<int32_t> shared = RandomTokens(40, kVocab, 99);
  g.gate->Arm();
  auto blocker = NewSink();  // Holds the loop so that the mix arrives in one round.
  ASSERT_OK(h.loop().Submit(LocalRequest("blocker", {1, 2, 3}, 2), blocker).status());
  ASSERT_TRUE(g.gate->WaitHeld(1, kWait));
  struct Entry {
    Request request;
    std::shared_ptr<RecordingSink> sink;
    DecodeLoop::Ticket ticket = 0;
    int cancel_after = -1;  // Tokens of choice 0 before the cancel; 0: at once.
  };
  std::vector<Entry> mix;
  for (int i = 0; i < 14; ++i) {
    std::vector<int32_t> prompt;
    if (rng() % 2 == 0) prompt.assign(shared.begin(), shared.begin() + 16 + rng() % 24);
    const std::vector<int32_t> tail = RandomTokens(1 + rng() % 30, kVocab, 200 + i);
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    Entry e;
    e.request = LocalRequest(absl::StrCat("mix", i), prompt, 20 + rng() % 50);
    e.request.n = rng() % 4 == 0 ? 2 : 1;
    e.request.priority = static_cast<int>(rng() % 3);
    const int fate = static_cast<int>(rng() % 4);
    if (fate == 0) e.cancel_after = 0;
    if (fate == 1) e.cancel_after = 1 + static_cast<int>(rng() % 10);
    e.sink = NewSink();
    ASSERT_OK_AND_ASSIGN(e.ticket, h.loop().Submit(e.request, e.sink));
    if (e.cancel_after == 0) h.loop().Cancel(e.ticket);
    mix.push_back(std::move(e));
  }
  g.gate->Disarm();
  g.gate->Allow();
  for (Entry& e : mix) {
    if (e.cancel_after > 0) {
      e.sink->WaitTokens(e.cancel_after);
      h.loop().Cancel(e.ticket);
    }
  }
  for (Entry& e : mix) {
    ASSERT_TRUE(e.sink->WaitEnded()) << e.request.request_id;
    const std::vector<int32_t> expected = h.Expected(e.request);
    if (e.cancel_after < 0) {
      ASSERT_OK(e.sink->status()) << e.request.request_id;
    } else if (!e.sink->status().ok()) {
      EXPECT_THAT(e.sink->status(), StatusIs(absl::StatusCode::kCancelled));
    }
    for (int c = 0; c < e.request.n; ++c) {
      const std::vector<int32_t> got = e.sink->tokens(c);
      ASSERT_LE(got.size(), expected.size()) << e.request.request_id;
      EXPECT_EQ(got, std::vector<int32_t>(expected.begin(), expected.begin() + got.size()))
          << e.request.request_id << " choice " << c;
    }
  }
  ASSERT_TRUE(blocker->WaitEnded());
  EXPECT_GT(h.loop().Stats().preemptions, 0u);
  ASSERT_TRUE(h.AllBlocksFree());
  EXPECT_GT(h.loop().Stats().kv_blocks_cached, 0);
  h.loop().FlushPrefixCache();
  EXPECT_TRUE(WaitFor([&] { return h.loop().Stats().kv_blocks_cached == 0; }));
  EXPECT_TRUE(h.AllBlocksFree());
}

// A request that could not fit the pool even alone fails at admission;
// one that fits alone but not beside a reservation waits for it.
TEST(DecodeAdmission, OnlyARequestTooBigForThePoolFails) {
  DecodeLoopOptions options;
  options.kv_blocks = 8;
  DecodeHarness h(options);
  Request big = LocalRequest("big", RandomTokens(60, kVocab, 1), 70);  // 130 > context: 128.
  big.n = 2;
  auto big_sink = NewSink();
  ASSERT_OK(h.loop().Submit(big, big_sink).status());
  ASSERT_TRUE(big_sink->WaitEnded());
  EXPECT_THAT(big_sink->status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("needs 16 KV blocks")));
  EXPECT_THAT(big_sink->status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("pool has 8 in all")));

  auto holder = NewSink();
  ASSERT_OK_AND_ASSIGN(
      DecodeLoop::Ticket held,
      h.loop().Submit(RemoteRequest("hold", RandomTokens(100, kVocab, 2), 5), holder));
  ASSERT_TRUE(holder->WaitReserved());
  const Request fits = LocalRequest("fits", RandomTokens(60, kVocab, 3), 60);  // 8 blocks.
  auto fits_sink = NewSink();
  ASSERT_OK(h.loop().Submit(fits, fits_sink).status());
  ASSERT_TRUE(WaitFor([&] { return h.loop().Stats().waiting == 2; }));
  EXPECT_FALSE(fits_sink->WaitEnded(absl::ZeroDuration()));
  h.loop().Cancel(held);
  ASSERT_TRUE(fits_sink->WaitEnded());
  ASSERT_OK(fits_sink->status());
  EXPECT_EQ(fits_sink->tokens(), h.Expected(fits));
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeAdmission, WatermarkOutsideThePoolIsRefused) {
  const auto weights = MakeSyntheticModel(SmallShape(), 7).value();
  auto fabric = kvtransfer::InProcFabric::Create();
  auto transport = kvtransfer::InProcTransport::Create(fabric);
  for (int watermark : {-2, 8}) {
    DecodeLoopOptions options;
    options.kv_blocks = 8;
    options.kv_watermark_blocks = watermark;
    EXPECT_THAT(DecodeLoop::Create(*weights, OneThreadBackend(), transport.get(), options),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kv_watermark_blocks")));
  }
}

}  // namespace
}  // namespace tandem::decode::testing
