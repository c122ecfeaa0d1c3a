#include "prefill_worker/prefill_loop.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/compute/cpu/cpu_backend.h"
#include "common/engine/logprobs.h"
#include "common/engine/sampler.h"
#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/inproc_transport.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/prefill_worker/decode_side.h"

namespace tandem::prefill {
namespace {

using ::tandem::prefill::testing::DecodeSide;
using ::tandem::prefill::testing::MakeEngine;
using ::tandem::prefill::testing::Outcome;
using ::tandem::prefill::testing::RandomTokens;
using ::tandem::prefill::testing::ReferenceTokens;
using ::tandem::prefill::testing::TestShape;
using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

constexpr absl::Duration kLoopWait = absl::Seconds(60);

// Waits (without driving the decode side) until `done()`.
bool WaitFor(const std::function<bool()>& done, absl::Duration timeout = kLoopWait) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

class PrefillLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(weights_, MakeSyntheticModel(TestShape(), 7));
    fabric_ = kvtransfer::InProcFabric::Create();
    transport_ = kvtransfer::InProcTransport::Create(fabric_);
    decode_ = std::make_unique<DecodeSide>(*weights_, fabric_);
    reference_ = MakeEngine(*weights_, 64);
    vocab_ = weights_->config.vocab_size;
  }

  // The loop reads deadlines and timings on `clock`: clock_ (fake) for the
  // tests of deadlines, which move it by hand.
  void StartLoop(PrefillLoopOptions options = {}, const Clock* clock = &Clock::Real()) {
    options.model_name = "synthetic";
    auto backend = CpuBackend::Create(CpuBackendOptions{1});
    ASSERT_OK(backend.status());
    ASSERT_OK_AND_ASSIGN(loop_, PrefillLoop::Create(*weights_, std::move(backend).value(),
                                                    transport_.get(), clock, options));
  }

  PrefillJob Job(const std::vector<int32_t>& tokens, const DecodeSide::Lease& lease,
                 absl::Time deadline = absl::Now() + kLoopWait) {
    PrefillJob job;
    job.request_id = absl::StrCat("r", lease.request_id);
    job.tokens = tokens;
    job.kv_descriptor = lease.descriptor;
    job.deadline = deadline;
    return job;
  }

  // The prefill worker's first token and the decode side's continuation
  // from the landed KV must equal one engine generating alone.
  void ExpectExact(const std::vector<int32_t>& prompt, DecodeSide::Lease& lease,
                   const PrefillResult& result, int n = 8) {
    const std::vector<int32_t> want = ReferenceTokens(*reference_, prompt, n);
    EXPECT_EQ(decode_->Continue(lease, result.first_token, n), want)
        << "prompt of " << prompt.size() << " tokens";
    decode_->Release(lease);
  }

  // Stats are published before replies go out, so once a job has been
  // answered its blocks show as free.
  void ExpectEveryBlockFree() {
    const PrefillStats stats = loop_->Stats();
    EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total);
    EXPECT_EQ(stats.running, 0);
    EXPECT_EQ(stats.waiting, 0);
  }

  std::unique_ptr<ModelWeights> weights_;
  std::shared_ptr<kvtransfer::InProcFabric> fabric_;
  std::unique_ptr<DecodeSide> decode_;
  std::unique_ptr<Engine> reference_;
  std::unique_ptr<kvtransfer::InProcTransport> transport_;
  // Starts at the real time, so that deadlines the decode side reads on the
  // real clock stay far off; stands still unless a test moves it.
  FakeClock clock_{absl::Now()};
  std::unique_ptr<PrefillLoop> loop_;  // Last: goes before the transport and the clock.
  int vocab_ = 0;
};

TEST_F(PrefillLoopTest, FirstTokenIsTheArgmaxAndTheKvContinuesExactly) {
  StartLoop();
  const std::vector<int32_t> prompt = RandomTokens(37, vocab_, 1);
  DecodeSide::Lease* lease = decode_->Expect(37);
  Outcome out;
  EXPECT_NE(loop_->Submit(Job(prompt, *lease), out.Callback()), 0u);
  ASSERT_TRUE(decode_->PumpUntil([&] { return out.done() && lease->ended; }));
  ASSERT_OK(lease->status);
  ASSERT_OK_AND_ASSIGN(PrefillResult result, out.result());

  BlockTable table = reference_->NewSequence();
  const BatchItem item{&table, prompt, true};
  ASSERT_OK_AND_ASSIGN(std::vector<float> logits, reference_->Step({&item, 1}));
  reference_->Release(table);
  EXPECT_EQ(result.first_token, Argmax(logits));
  ExpectExact(prompt, *lease, result, 12);

  const KvLayout& layout = reference_->kv_layout();
  const int64_t kv_bytes = int64_t{3} * layout.n_layers * layout.block_bytes();
  EXPECT_EQ(result.kv_bytes, kv_bytes);
  EXPECT_GE(result.queue_us, 0);
  EXPECT_GT(result.prefill_us, 0);
  EXPECT_GE(result.kv_transfer_us, 0);
  ExpectEveryBlockFree();
  const PrefillStats stats = loop_->Stats();
  EXPECT_EQ(stats.kv_transfers, 1u);
  EXPECT_EQ(stats.kv_transfer_bytes, static_cast<uint64_t>(kv_bytes));
  EXPECT_EQ(stats.kv_transfers_failed, 0u);
  EXPECT_EQ(stats.requests_total, 1u);
  EXPECT_EQ(stats.requests_failed, 0u);
  EXPECT_EQ(stats.steps, 1u);
  EXPECT_EQ(out.calls(), 1);
}

TEST_F(PrefillLoopTest, SampledFirstTokenUsesTheRequestsSampler) {
  StartLoop();
  const std::vector<int32_t> prompt = RandomTokens(21, vocab_, 2);
  DecodeSide::Lease* lease = decode_->Expect(21);
  PrefillJob job = Job(prompt, *lease);
  job.sampling = SamplingParams{.temperature = 1.5f, .top_k = 40, .top_p = 0.9f, .seed = 5};
  Outcome out;
  loop_->Submit(job, out.Callback());
  ASSERT_TRUE(decode_->PumpUntil([&] { return out.done(); }));
  ASSERT_OK_AND_ASSIGN(PrefillResult result, out.result());

  BlockTable table = reference_->NewSequence();
  const BatchItem item{&table, prompt, true};
  ASSERT_OK_AND_ASSIGN(std::vector<float> logits, reference_->Step({&item, 1}));
  reference_->Release(table);
  Sampler sampler(job.sampling);
  EXPECT_EQ(result.first_token, sampler.Sample(logits));
}

// The engine is built with max_batch_tokens 16 and rejects bigger steps, so
// a 100-token prompt only succeeds when split over 7 steps.
TEST_F(PrefillLoopTest, LongPromptIsChunkedOverSeveralStepsAndStaysExact) {
  StartLoop({.max_batch_tokens = 16});
  const std::vector<int32_t> prompt = RandomTokens(100, vocab_, 3);
  DecodeSide::Lease* lease = decode_->Expect(100);
  Outcome out;
  loop_->Submit(Job(prompt, *lease), out.Callback());
  ASSERT_TRUE(decode_->PumpUntil([&] { return out.done() && lease->ended; }));
  ASSERT_OK_AND_ASSIGN(PrefillResult result, out.result());
  EXPECT_EQ(loop_->Stats().steps, 7u);
  ExpectExact(prompt, *lease, result);
  ExpectEveryBlockFree();
}

// A first job takes every KV block and holds them until the test lets its
// transfer complete; four more queue meanwhile (the pool is full: none is
// half-admitted) and are then admitted together, so they share steps.
class PrefillBatchTest : public PrefillLoopTest, public ::testing::WithParamInterface<int> {};

TEST_P(PrefillBatchTest, QueuedJobsAreBatchedTogetherAndAllExact) {
  const int budget = GetParam();
  StartLoop({.kv_blocks = 8, .max_batch_tokens = budget});
  const auto steps_for = [budget](int tokens) { return (tokens + budget - 1) / budget; };

  const std::vector<int32_t> first = RandomTokens(120, vocab_, 10);  // 8 blocks
  DecodeSide::Lease* first_lease = decode_->Expect(120);
  Outcome first_out;
  loop_->Submit(Job(first, *first_lease), first_out.Callback());
  ASSERT_TRUE(WaitFor([&] { return loop_->Stats().steps == uint64_t(steps_for(120)); }));

  const std::vector<int> lengths = {10, 25, 30, 40};  // 1 + 2 + 2 + 3 blocks
  std::vector<std::vector<int32_t>> prompts;
  std::vector<DecodeSide::Lease*> leases;
  std::vector<Outcome> outs(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    prompts.push_back(RandomTokens(lengths[i], vocab_, 20 + i));
    leases.push_back(decode_->Expect(lengths[i]));
    EXPECT_NE(loop_->Submit(Job(prompts[i], *leases[i]), outs[i].Callback()), 0u);
  }
  PrefillStats stats = loop_->Stats();
  EXPECT_EQ(stats.waiting, 4);
  EXPECT_EQ(stats.running, 1);
  EXPECT_EQ(stats.kv_blocks_free, 0);

  ASSERT_TRUE(decode_->PumpUntil([&] {
    bool all = first_out.done();
    for (const Outcome& o : outs) all = all && o.done();
    return all;
  }));
  ASSERT_OK_AND_ASSIGN(PrefillResult first_result, first_out.result());
  ExpectExact(first, *first_lease, first_result);
  for (size_t i = 0; i < outs.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(PrefillResult result, outs[i].result());
    ExpectExact(prompts[i], *leases[i], result);
  }
  EXPECT_EQ(loop_->Stats().steps, uint64_t(steps_for(120) + steps_for(10 + 25 + 30 + 40)));
  ExpectEveryBlockFree();
  EXPECT_EQ(loop_->Stats().kv_transfers, 5u);
}

INSTANTIATE_TEST_SUITE_P(Budgets, PrefillBatchTest, ::testing::Values(2048, 24),
                         [](const auto& info) { return absl::StrCat("budget", info.param); });

TEST_F(PrefillLoopTest, BadDescriptorIsInvalidArgumentAtOnce) {
  StartLoop();
  const std::vector<int32_t> prompt = RandomTokens(20, vocab_, 4);
  DecodeSide::Lease* lease = decode_->Expect(40);  // 3 blocks; the prompt has 2.

  PrefillJob garbage = Job(prompt, *lease);
  garbage.kv_descriptor = "not a lease";
  Outcome bad;
  EXPECT_EQ(loop_->Submit(garbage, bad.Callback()), 0u);
  EXPECT_EQ(bad.calls(), 1);
  EXPECT_THAT(bad.status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("descriptor")));

  Outcome mismatch;
  EXPECT_EQ(loop_->Submit(Job(prompt, *lease), mismatch.Callback()), 0u);
  EXPECT_THAT(mismatch.status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lease exactly")));
  ExpectEveryBlockFree();
  EXPECT_EQ(loop_->Stats().requests_failed, 2u);
}

TEST_F(PrefillLoopTest, BadPromptOrSamplingIsInvalidArgument) {
  StartLoop();
  DecodeSide::Lease* lease = decode_->Expect(5);
  struct Case {
    std::vector<int32_t> tokens;
    SamplingParams sampling;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{}, {}, "empty"},
      {{1, 2, vocab_, 3, 4}, {}, "out of range"},
      {{1, 2, -1, 3, 4}, {}, "out of range"},
      {RandomTokens(128, vocab_, 5), {}, "context"},
      {{1, 2, 3, 4, 5}, {.temperature = -1.0f}, "temperature"},
      {{1, 2, 3, 4, 5}, {.top_p = 0.0f}, "top_p"},
  };
  for (const Case& c : cases) {
    PrefillJob job = Job(c.tokens, *lease);
    job.sampling = c.sampling;
    Outcome out;
    EXPECT_EQ(loop_->Submit(job, out.Callback()), 0u);
    EXPECT_THAT(out.status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
  ExpectEveryBlockFree();
}

// Logits of every prompt position from the reference engine, one pass.
std::vector<std::vector<float>> AllRows(Engine& engine, const std::vector<int32_t>& prompt) {
  BlockTable table = engine.NewSequence();
  BatchItem item{&table, prompt};
  item.all_logits = true;
  auto logits = engine.Step({&item, 1});
  CHECK_OK(logits.status());
  engine.Release(table);
  const size_t vocab = engine.config().vocab_size;
  std::vector<std::vector<float>> rows;
  for (size_t r = 0; r < prompt.size(); ++r) {
    rows.emplace_back(logits->begin() + r * vocab, logits->begin() + (r + 1) * vocab);
  }
  return rows;
}

TEST_F(PrefillLoopTest, EveryChoiceSamplesWithItsOwnSeedAndLogprobs) {
  StartLoop();
  const std::vector<int32_t> prompt = RandomTokens(21, vocab_, 2);
  DecodeSide::Lease* lease = decode_->Expect(21);
  PrefillJob job = Job(prompt, *lease);
  job.sampling = SamplingParams{.temperature = 2.0f, .seed = 9};
  job.sampling.presence_penalty = 0.5f;
  job.sampling.repetition_penalty = 1.3f;
  job.n = 4;
  job.logprobs = 3;
  Outcome out;
  loop_->Submit(job, out.Callback());
  ASSERT_TRUE(decode_->PumpUntil([&] { return out.done(); }));
  ASSERT_OK_AND_ASSIGN(PrefillResult result, out.result());

  const std::vector<float> last = AllRows(*reference_, prompt).back();
  std::vector<int32_t> want;
  for (int i = 0; i < 4; ++i) {
    SamplingParams p = job.sampling;
    p.seed = ChoiceSeed(9, i);
    Sampler sampler(p, prompt, {});
    want.push_back(sampler.Sample(last));
  }
  EXPECT_EQ(result.first_token, want[0]);
  EXPECT_EQ(result.extra_first_tokens, std::vector<int32_t>(want.begin() + 1, want.end()));
  // Each choice drew one number for its first token.
  EXPECT_EQ(result.sampler_draws, std::vector<uint64_t>(4, 1));
  ASSERT_EQ(result.first_logprobs.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const TokenLogprob expected = ComputeLogprob(last, want[i], 3);
    EXPECT_EQ(result.first_logprobs[i].token_id, want[i]);
    EXPECT_NEAR(result.first_logprobs[i].logprob, expected.logprob, 1e-4);
    ASSERT_EQ(result.first_logprobs[i].top.size(), 3u);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(result.first_logprobs[i].top[k].token_id, expected.top[k].token_id);
    }
  }
  EXPECT_TRUE(result.prompt_logprobs.empty());
  ExpectEveryBlockFree();
}

TEST_F(PrefillLoopTest, NOfOneWithoutLogprobsIsAsBefore) {
  StartLoop();
  const std::vector<int32_t> prompt = RandomTokens(9, vocab_, 4);
  DecodeSide::Lease* lease = decode_->Expect(9);
  Outcome out;
  loop_->Submit(Job(prompt, *lease), out.Callback());
  ASSERT_TRUE(decode_->PumpUntil([&] { return out.done(); }));
  ASSERT_OK_AND_ASSIGN(PrefillResult result, out.result());
  EXPECT_TRUE(result.extra_first_tokens.empty());
  EXPECT_EQ(result.sampler_draws, std::vector<uint64_t>{0});  // Greedy draws nothing.
  EXPECT_TRUE(result.first_logprobs.empty());
  EXPECT_TRUE(result.prompt_logprobs.empty());
}

// max_batch_tokens 16 caps the rows of logits of a step at 16 too, so the
// prompt's logprobs come from seven chunks batched with another job.
TEST_F(PrefillLoopTest, PromptLogprobsMatchTheReferenceAcrossChunks) {
  StartLoop({.max_batch_tokens = 16});
  const std::vector<int32_t> prompt = RandomTokens(100, vocab_, 3);
  const std::vector<int32_t> other = RandomTokens(30, vocab_, 4);
  DecodeSide::Lease* lease = decode_->Expect(100);
  DecodeSide::Lease* other_lease = decode_->Expect(30);
  PrefillJob job = Job(prompt, *lease);
  job.prompt_logprobs = true;
  job.logprobs = 2;
  Outcome out, other_out;
  loop_->Submit(job, out.Callback());
  loop_->Submit(Job(other, *other_lease), other_out.Callback());
  ASSERT_TRUE(decode_->PumpUntil([&] { return out.done() && other_out.done(); }));
  ASSERT_OK_AND_ASSIGN(PrefillResult result, out.result());
  ASSERT_OK(other_out.result().status());

  const std::vector<std::vector<float>> rows = AllRows(*reference_, prompt);
  ASSERT_EQ(result.prompt_logprobs.size(), prompt.size() - 1);
  for (size_t t = 0; t + 1 < prompt.size(); ++t) {
    const TokenLogprob want = ComputeLogprob(rows[t], prompt[t + 1], 2);
    const TokenLogprob& got = result.prompt_logprobs[t];
    EXPECT_EQ(got.token_id, prompt[t + 1]);
    EXPECT_NEAR(got.logprob, want.logprob, 1e-4) << "position " << t;
    ASSERT_EQ(got.top.size(), 2u);
    EXPECT_EQ(got.top[0].token_id, want.top[0].token_id) << "position " << t;
  }
  EXPECT_EQ(result.first_token, Argmax(rows.back()));
  ExpectExact(prompt, *lease, result, 6);
  decode_->Release(*other_lease);
  ExpectEveryBlockFree();
}

TEST_F(PrefillLoopTest, MinTokensKeepsStopIdsFromBeingTheFirstToken) {
  StartLoop();
  const std::vector<int32_t> prompt = RandomTokens(13, vocab_, 6);
  const std::vector<float> last = AllRows(*reference_, prompt).back();
  const int32_t best = Argmax(last);
  DecodeSide::Lease* lease = decode_->Expect(13);
  PrefillJob job = Job(prompt, *lease);
  job.stop_token_ids = {best};
  job.sampling.min_tokens = 1;
  Outcome out;
  loop_->Submit(job, out.Callback());
  ASSERT_TRUE(decode_->PumpUntil([&] { return out.done(); }));
  ASSERT_OK_AND_ASSIGN(PrefillResult result, out.result());
  std::vector<float> masked = last;
  masked[best] = -1e30f;
  EXPECT_EQ(result.first_token, Argmax(masked));
}

TEST_F(PrefillLoopTest, ChoicesLogprobsAndBiasOutOfBoundsAreInvalidArgument) {
  StartLoop();
  DecodeSide::Lease* lease = decode_->Expect(5);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  std::vector<std::pair<std::function<void(PrefillJob&)>, std::string>> cases = {
      {[](PrefillJob& j) { j.n = 0; }, "n is 0"},
      {[](PrefillJob& j) { j.n = kMaxChoices + 1; }, "choices"},
      {[](PrefillJob& j) { j.logprobs = -1; }, "logprobs"},
      {[](PrefillJob& j) { j.logprobs = kMaxTopLogprobs + 1; }, "logprobs"},
      {[&](PrefillJob& j) {
         j.sampling.logit_bias = {{vocab_, 1.0f}};
       },
       "vocabulary"},
      {[](PrefillJob& j) { j.sampling.frequency_penalty = 3.0f; }, "frequency_penalty"},
      {[&](PrefillJob& j) { j.stop_token_ids = {vocab_}; }, "stop token"},
  };
  for (auto& [mutate, message] : cases) {
    PrefillJob job = Job(prompt, *lease);
    mutate(job);
    Outcome out;
    EXPECT_EQ(loop_->Submit(job, out.Callback()), 0u);
    EXPECT_THAT(out.status(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)));
  }
  ExpectEveryBlockFree();
}

TEST_F(PrefillLoopTest, PromptThePoolCanNeverHoldIsRefusedAtOnce) {
  StartLoop({.kv_blocks = 4});
  const std::vector<int32_t> prompt = RandomTokens(100, vocab_, 6);  // 7 blocks
  DecodeSide::Lease* lease = decode_->Expect(100);
  Outcome out;
  EXPECT_EQ(loop_->Submit(Job(prompt, *lease), out.Callback()), 0u);
  EXPECT_THAT(out.status(), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("kv_blocks")));
}

TEST_F(PrefillLoopTest, LeaseDeadlineEndsAnUnconfirmedTransferAndFreesBlocks) {
  StartLoop({}, &clock_);
  const std::vector<int32_t> prompt = RandomTokens(30, vocab_, 7);
  // The decode side is never driven: nothing is ever confirmed.
  DecodeSide::Lease* lease = decode_->Expect(30, 16, clock_.Now() + absl::Seconds(1));
  Outcome out;
  loop_->Submit(Job(prompt, *lease), out.Callback());
  // Computed and sending; the lease runs out on the loop's clock only.
  ASSERT_TRUE(WaitFor([&] { return loop_->Stats().steps == 1; }));
  EXPECT_FALSE(out.done());
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(WaitFor([&] { return out.done(); }));
  EXPECT_THAT(out.status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("not confirmed")));
  ExpectEveryBlockFree();
  EXPECT_EQ(loop_->Stats().kv_transfers_failed, 1u);
  EXPECT_EQ(loop_->Stats().kv_transfers, 0u);
}

TEST_F(PrefillLoopTest, RequestDeadlineEndsAnUnconfirmedTransferAndFreesBlocks) {
  StartLoop({}, &clock_);
  const std::vector<int32_t> prompt = RandomTokens(30, vocab_, 8);
  // The decode side's lease never expires by itself: it ends only when the
  // sender's abort reaches it.
  DecodeSide::Lease* lease = decode_->Expect(30, 16, absl::InfiniteFuture());
  Outcome out;
  loop_->Submit(Job(prompt, *lease, clock_.Now() + absl::Seconds(1)), out.Callback());
  // Computed and sending when the deadline passes.
  ASSERT_TRUE(WaitFor([&] { return loop_->Stats().steps == 1; }));
  EXPECT_FALSE(out.done());
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(WaitFor([&] { return out.done(); }));
  EXPECT_THAT(out.status(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  ExpectEveryBlockFree();
  // The decode side hears of it and ends its lease too.
  ASSERT_TRUE(decode_->PumpUntil([&] { return lease->ended; }));
  EXPECT_THAT(lease->status,
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("aborted by the sender")));
}

TEST_F(PrefillLoopTest, ReceiverThatGivesUpFailsTheJob) {
  StartLoop();
  const std::vector<int32_t> prompt = RandomTokens(30, vocab_, 9);
  DecodeSide::Lease* lease = decode_->Expect(30);
  Outcome out;
  loop_->Submit(Job(prompt, *lease), out.Callback());
  // One poll at a time until a chunk was accepted: its bytes land only in
  // the next poll, so the transfer cannot have completed yet.
  kvtransfer::TransferReceiver& receiver = decode_->receiver();
  ASSERT_TRUE(WaitFor([&] {
    receiver.Poll();
    return receiver.stats().accepted_messages > 0;
  }));
  ASSERT_OK(receiver.Cancel(lease->request_id));
  ASSERT_TRUE(decode_->PumpUntil([&] { return out.done(); }));
  EXPECT_THAT(out.status(),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("aborted by the receiver")));
  ExpectEveryBlockFree();
  EXPECT_EQ(loop_->Stats().kv_transfers_failed, 1u);
}

TEST_F(PrefillLoopTest, QueueFullIsResourceExhaustedAtOnce) {
  StartLoop({.kv_blocks = 8, .max_queue = 1});
  const std::vector<int32_t> big = RandomTokens(120, vocab_, 11);  // Every block.
  DecodeSide::Lease* big_lease = decode_->Expect(120);
  Outcome big_out;
  loop_->Submit(Job(big, *big_lease), big_out.Callback());
  ASSERT_TRUE(WaitFor([&] { return loop_->Stats().running == 1; }));

  const std::vector<int32_t> small = RandomTokens(10, vocab_, 12);
  DecodeSide::Lease* queued_lease = decode_->Expect(10);
  Outcome queued;
  EXPECT_NE(loop_->Submit(Job(small, *queued_lease), queued.Callback()), 0u);
  EXPECT_EQ(loop_->Stats().waiting, 1);

  DecodeSide::Lease* refused_lease = decode_->Expect(10);
  Outcome refused;
  EXPECT_EQ(loop_->Submit(Job(small, *refused_lease), refused.Callback()), 0u);
  EXPECT_THAT(refused.status(), StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("queue")));
  EXPECT_FALSE(queued.done());

  ASSERT_TRUE(decode_->PumpUntil([&] { return big_out.done() && queued.done(); }));
  ASSERT_OK_AND_ASSIGN(PrefillResult big_result, big_out.result());
  ASSERT_OK_AND_ASSIGN(PrefillResult small_result, queued.result());
  ExpectExact(big, *big_lease, big_result);
  ExpectExact(small, *queued_lease, small_result);
  ExpectEveryBlockFree();
}

TEST_F(PrefillLoopTest, DeadlineWhileQueuedIsDeadlineExceeded) {
  StartLoop({.kv_blocks = 8}, &clock_);
  const std::vector<int32_t> big = RandomTokens(120, vocab_, 13);
  DecodeSide::Lease* big_lease = decode_->Expect(120);
  Outcome big_out;
  loop_->Submit(Job(big, *big_lease), big_out.Callback());
  DecodeSide::Lease* lease = decode_->Expect(10);
  Outcome out;
  loop_->Submit(Job(RandomTokens(10, vocab_, 14), *lease, clock_.Now() + absl::Seconds(1)),
                out.Callback());
  // The big job holds every block, so the small one waits in the queue
  // when its deadline passes.
  ASSERT_TRUE(WaitFor([&] { return loop_->Stats().steps == 1; }));
  EXPECT_FALSE(out.done());
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(WaitFor([&] { return out.done(); }));
  EXPECT_THAT(out.status(), StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("queued")));
  EXPECT_FALSE(big_out.done());
  ASSERT_TRUE(decode_->PumpUntil([&] { return big_out.done(); }));
  EXPECT_OK(big_out.status());
  ExpectEveryBlockFree();
}

TEST_F(PrefillLoopTest, CancelFreesBlocksWhetherQueuedOrSending) {
  StartLoop({.kv_blocks = 8});
  const std::vector<int32_t> big = RandomTokens(120, vocab_, 15);
  DecodeSide::Lease* big_lease = decode_->Expect(120);
  Outcome big_out;
  const JobId big_id = loop_->Submit(Job(big, *big_lease), big_out.Callback());
  DecodeSide::Lease* lease = decode_->Expect(10);
  Outcome queued;
  const JobId queued_id =
      loop_->Submit(Job(RandomTokens(10, vocab_, 16), *lease), queued.Callback());
  // The big job holds every block: the small one is still queued and is
  // answered within Cancel.
  ASSERT_TRUE(WaitFor([&] { return loop_->Stats().running == 1; }));
  loop_->Cancel(queued_id);
  EXPECT_THAT(queued.status(), StatusIs(absl::StatusCode::kCancelled, HasSubstr("queued")));

  // The big one is computed and waiting for the (undriven) decode side.
  ASSERT_TRUE(WaitFor([&] { return loop_->Stats().steps == 1; }));
  // The decode side stays undriven until the job has ended, so none of the
  // KV can have landed: the cancelled sends are withdrawn.
  loop_->Cancel(big_id);
  ASSERT_TRUE(WaitFor([&] { return big_out.done(); }));
  EXPECT_THAT(big_out.status(), StatusIs(absl::StatusCode::kCancelled, HasSubstr("client")));
  ExpectEveryBlockFree();
  // The sender's abort ends the decode side's lease too.
  ASSERT_TRUE(decode_->PumpUntil([&] { return big_lease->ended; }));
  EXPECT_THAT(big_lease->status, StatusIs(absl::StatusCode::kCancelled));
  loop_->Cancel(big_id);  // Already ended: nothing happens.
  EXPECT_EQ(big_out.calls(), 1);
  EXPECT_EQ(queued.calls(), 1);
}

TEST_F(PrefillLoopTest, DrainRefusesNewJobsAndFinishesAccepted) {
  StartLoop();
  const std::vector<int32_t> prompt = RandomTokens(30, vocab_, 17);
  DecodeSide::Lease* lease = decode_->Expect(30);
  Outcome accepted;
  loop_->Submit(Job(prompt, *lease), accepted.Callback());
  loop_->Drain();
  EXPECT_TRUE(loop_->Stats().draining);
  Outcome refused;
  EXPECT_EQ(loop_->Submit(Job(prompt, *lease), refused.Callback()), 0u);
  EXPECT_THAT(refused.status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("worker is draining")));
  EXPECT_FALSE(loop_->WaitUntilIdle(absl::Now() + absl::Milliseconds(50)));
  ASSERT_TRUE(decode_->PumpUntil([&] { return accepted.done(); }));
  EXPECT_TRUE(loop_->WaitUntilIdle(absl::Now() + kLoopWait));
  ASSERT_OK_AND_ASSIGN(PrefillResult result, accepted.result());
  ExpectExact(prompt, *lease, result);
}

TEST_F(PrefillLoopTest, DestroyingTheLoopAnswersEveryJobOnce) {
  StartLoop({.kv_blocks = 8});
  DecodeSide::Lease* big_lease = decode_->Expect(120);
  Outcome big_out;
  loop_->Submit(Job(RandomTokens(120, vocab_, 18), *big_lease), big_out.Callback());
  DecodeSide::Lease* lease = decode_->Expect(10);
  Outcome queued;
  loop_->Submit(Job(RandomTokens(10, vocab_, 19), *lease), queued.Callback());
  ASSERT_TRUE(WaitFor([&] { return loop_->Stats().running == 1; }));
  loop_.reset();
  EXPECT_EQ(big_out.calls(), 1);
  EXPECT_EQ(queued.calls(), 1);
  EXPECT_THAT(big_out.status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(queued.status(), StatusIs(absl::StatusCode::kUnavailable));
}

}  // namespace
}  // namespace tandem::prefill
