#include "decode_worker/decode_loop.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/decode_worker/decode_test_util.h"

namespace tandem::decode {
namespace {

using ::tandem::decode::testing::DecodeHarness;
using ::tandem::decode::testing::LocalRequest;
using ::tandem::decode::testing::LoopCaughtUp;
using ::tandem::decode::testing::NewSink;
using ::tandem::decode::testing::RandomTokens;
using ::tandem::decode::testing::RecordingSink;
using ::tandem::decode::testing::RemoteRequest;
using ::tandem::decode::testing::StartResult;
using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

using testing::kVocab;

// Runs a local-prefill request to its end; the streamed tokens.
std::vector<int32_t> RunLocal(DecodeLoop& loop, const Request& r,
                              const std::shared_ptr<RecordingSink>& sink) {
  EXPECT_OK(loop.Submit(r, sink).status());
  EXPECT_TRUE(sink->WaitEnded());
  EXPECT_OK(sink->status());
  return sink->tokens();
}

TEST(DecodeLoop, RemotePrefillTokensMatchGenerate) {
  DecodeHarness h;
  const Request r = RemoteRequest("remote-1", RandomTokens(37, kVocab, 1), 20);
  auto sink = NewSink();
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> got, h.RunRemote(r, sink));
  EXPECT_EQ(got, h.Expected(r));
  ASSERT_TRUE(sink->finished().has_value());
  EXPECT_EQ(sink->finished()->reason, FinishReason::kLength);
  EXPECT_EQ(sink->finished()->completion_tokens, 20);
  EXPECT_EQ(sink->finished()->prefill, absl::ZeroDuration());
  EXPECT_GT(sink->finished()->kv_wait, absl::ZeroDuration());
  EXPECT_EQ(sink->reserved_count(), 1);
  EXPECT_EQ(sink->events_after_end(), 0);
  EXPECT_TRUE(h.AllBlocksFree());
  const LoopStats s = h.loop().Stats();
  EXPECT_EQ(s.kv_transfers, 1u);
  EXPECT_GT(s.kv_transfer_bytes, 0u);
  EXPECT_EQ(s.requests_total, 1u);
  EXPECT_EQ(s.requests_failed, 0u);
}

// Sampled, not greedy: the decode worker continues the random stream the
// prefill worker began, so the tokens are those of a local run.
TEST(DecodeLoop, RemotePrefillSampledTokensMatchGenerate) {
  DecodeHarness h;
  Request r = RemoteRequest("sampled", RandomTokens(21, kVocab, 31), 30);
  for (uint64_t seed : {1u, 2u, 3u}) {
    r.sampling = SamplingParams{.temperature = 1.0f, .top_k = 0, .top_p = 0.95f, .seed = seed};
    r.request_id = absl::StrCat("sampled-", seed);
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> got, h.RunRemote(r, NewSink()));
    EXPECT_EQ(got, h.Expected(r)) << "seed " << seed;
  }
  EXPECT_TRUE(h.AllBlocksFree());
}

// A prompt that ends exactly on a block boundary and one that fills most of
// the context exercise the slice layout at its edges.
TEST(DecodeLoop, RemotePrefillAtBlockBoundariesMatchesGenerate) {
  DecodeHarness h;
  for (int len : {1, 16, 32, 100}) {
    const Request r = RemoteRequest(absl::StrCat("r", len), RandomTokens(len, kVocab, len), 8);
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> got, h.RunRemote(r, NewSink()));
    EXPECT_EQ(got, h.Expected(r)) << "prompt of " << len;
  }
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeLoop, ChunkedKvTransferWithChecksumsMatchesGenerate) {
  DecodeLoopOptions options;
  options.receiver.chunk_bytes = 1000;  // Not a divisor of a block: chunks straddle blocks.
  options.receiver.checksums = true;
  DecodeHarness h(options);
  const Request r = RemoteRequest("chunked", RandomTokens(45, kVocab, 3), 12);
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> got, h.RunRemote(r, NewSink()));
  EXPECT_EQ(got, h.Expected(r));
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeLoop, LocalPrefillTokensMatchGenerate) {
  DecodeHarness h;
  Request r = LocalRequest("local-1", RandomTokens(30, kVocab, 2), 25);
  auto sink = NewSink();
  EXPECT_EQ(RunLocal(h.loop(), r, sink), h.Expected(r));
  ASSERT_TRUE(sink->finished().has_value());
  EXPECT_EQ(sink->finished()->reason, FinishReason::kLength);
  EXPECT_EQ(sink->finished()->completion_tokens, 25);
  EXPECT_GT(sink->finished()->prefill, absl::ZeroDuration());
  EXPECT_EQ(sink->finished()->kv_wait, absl::ZeroDuration());
  EXPECT_EQ(sink->reserved_count(), 0);

  // Sampled, not greedy: the loop's sampler draws exactly as Generate's.
  r.request_id = "local-2";
  r.sampling = SamplingParams{.temperature = 0.9f, .top_k = 20, .top_p = 0.9f, .seed = 1234};
  EXPECT_EQ(RunLocal(h.loop(), r, NewSink()), h.Expected(r));
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeLoop, LocalPrefillLongerThanTheBatchBudgetIsChunked) {
  DecodeLoopOptions options;
  options.max_batch_tokens = 16;
  options.max_sequences = 4;
  DecodeHarness h(options);
  // Greedy tokens after a chunked prefill may only differ from the one-pass
  // ones in a near-tie; this model and prompt have none.
  const Request r = LocalRequest("long", RandomTokens(70, kVocab, 11), 10);
  EXPECT_EQ(RunLocal(h.loop(), r, NewSink()), h.Expected(r));
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeLoop, ConcurrentMixedSequencesAreAllCorrect) {
  DecodeHarness h;
  struct Case {
    Request request;
    std::shared_ptr<RecordingSink> sink = std::make_shared<RecordingSink>();
    std::vector<int32_t> want;
  };
  std::vector<Case> cases;
  for (int i = 0; i < 8; ++i) {
    const std::vector<int32_t> prompt = RandomTokens(5 + 9 * i, kVocab, 100 + i);
    const int max_tokens = 10 + 3 * i;
    Case c;
    c.request = i % 2 == 0 ? LocalRequest(absl::StrCat("c", i), prompt, max_tokens)
                           : RemoteRequest(absl::StrCat("c", i), prompt, max_tokens);
    c.want = h.Expected(c.request);
    cases.push_back(std::move(c));
  }
  // Everything is admitted at once; the remote ones are prefilled one by one
  // while the local ones already decode.
  for (Case& c : cases) ASSERT_OK(h.loop().Submit(c.request, c.sink).status());
  std::vector<int32_t> first(cases.size(), -1);
  for (size_t i = 0; i < cases.size(); ++i) {
    Case& c = cases[i];
    if (c.request.local_prefill) continue;
    ASSERT_TRUE(c.sink->WaitReserved());
    ASSERT_OK_AND_ASSIGN(first[i], h.prefill().Prefill(c.request.prompt, c.sink->descriptor()));
    StartResult start;
    h.loop().Start(c.request.request_id, c.sink->generation(), first[i], start.Callback());
    ASSERT_OK(start.Wait());
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    Case& c = cases[i];
    ASSERT_TRUE(c.sink->WaitEnded());
    ASSERT_OK(c.sink->status());
    std::vector<int32_t> got = c.sink->tokens();
    if (!c.request.local_prefill) got.insert(got.begin(), first[i]);
    EXPECT_EQ(got, c.want) << c.request.request_id;
    EXPECT_EQ(c.sink->finished()->completion_tokens, c.request.max_tokens);
  }
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeLoop, CancelBeforeKvArrivesFreesEveryBlock) {
  DecodeHarness h;
  auto sink = NewSink();
  const Request r = RemoteRequest("cancel-early", RandomTokens(40, kVocab, 4), 30);
  ASSERT_OK_AND_ASSIGN(DecodeLoop::Ticket ticket, h.loop().Submit(r, sink));
  ASSERT_TRUE(sink->WaitReserved());
  // Stats are published at the end of the loop's round: wait for them.
  EXPECT_TRUE(testing::WaitFor([&] {
    const LoopStats s = h.loop().Stats();
    return s.kv_blocks_free < s.kv_blocks_total && s.waiting == 1;
  }));
  h.loop().Cancel(ticket);
  ASSERT_TRUE(sink->WaitEnded());
  EXPECT_THAT(sink->status(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_TRUE(h.AllBlocksFree());
  // The prefill worker learns the lease is gone; a late Start finds nothing.
  EXPECT_FALSE(h.prefill().Prefill(r.prompt, sink->descriptor()).ok());
  StartResult start;
  h.loop().Start(r.request_id, sink->generation(), 5, start.Callback());
  EXPECT_THAT(start.Wait(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_TRUE(h.AllBlocksFree());
  EXPECT_EQ(h.loop().Stats().requests_failed, 0u);  // Cancellations are not failures.
}

TEST(DecodeLoop, CancelAfterKvBeforeStartFreesEveryBlock) {
  DecodeHarness h;
  auto sink = NewSink();
  const Request r = RemoteRequest("cancel-kv", RandomTokens(40, kVocab, 5), 30);
  ASSERT_OK_AND_ASSIGN(DecodeLoop::Ticket ticket, h.loop().Submit(r, sink));
  ASSERT_TRUE(sink->WaitReserved());
  ASSERT_OK(h.prefill().Prefill(r.prompt, sink->descriptor()).status());
  h.loop().Cancel(ticket);
  ASSERT_TRUE(sink->WaitEnded());
  EXPECT_THAT(sink->status(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeLoop, CancelMidDecodeFreesEveryBlock) {
  DecodeHarness h;
  for (bool local : {true, false}) {
    auto sink = NewSink();
    // The context bounds generation: 100 tokens at most.
    Request r =
        RemoteRequest(local ? "mid-local" : "mid-remote", RandomTokens(28, kVocab, 6), 1000);
    r.local_prefill = local;
    ASSERT_OK_AND_ASSIGN(DecodeLoop::Ticket ticket, h.loop().Submit(r, sink));
    if (!local) {
      ASSERT_TRUE(sink->WaitReserved());
      ASSERT_OK_AND_ASSIGN(int32_t first, h.prefill().Prefill(r.prompt, sink->descriptor()));
      StartResult start;
      h.loop().Start(r.request_id, sink->generation(), first, start.Callback());
      ASSERT_OK(start.Wait());
    }
    ASSERT_TRUE(sink->WaitTokens(3));
    h.loop().Cancel(ticket);
    ASSERT_TRUE(sink->WaitEnded());
    // It may have reached the end of the context first on a fast machine.
    if (!sink->status().ok()) {
      EXPECT_THAT(sink->status(), StatusIs(absl::StatusCode::kCancelled));
    }
    EXPECT_TRUE(h.AllBlocksFree());
    EXPECT_EQ(sink->events_after_end(), 0);
  }
}

TEST(DecodeLoop, StartWithStaleGenerationIsRefused) {
  DecodeHarness h;
  auto sink = NewSink();
  const Request r = RemoteRequest("stale", RandomTokens(20, kVocab, 7), 6);
  ASSERT_OK(h.loop().Submit(r, sink).status());
  ASSERT_TRUE(sink->WaitReserved());
  ASSERT_OK_AND_ASSIGN(int32_t first, h.prefill().Prefill(r.prompt, sink->descriptor()));
  StartResult stale;
  h.loop().Start(r.request_id, sink->generation() + 1, first, stale.Callback());
  EXPECT_THAT(stale.Wait(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("generation")));
  // The reservation survives; the right generation starts it.
  StartResult ok;
  h.loop().Start(r.request_id, sink->generation(), first, ok.Callback());
  ASSERT_OK(ok.Wait());
  ASSERT_TRUE(sink->WaitEnded());
  ASSERT_OK(sink->status());
  std::vector<int32_t> got = {first};
  for (int32_t t : sink->tokens()) got.push_back(t);
  EXPECT_EQ(got, h.Expected(r));
  // A second Start of the same request is refused.
  StartResult twice;
  h.loop().Start(r.request_id, sink->generation(), first, twice.Callback());
  EXPECT_THAT(twice.Wait(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeLoop, StartBeforeKvArrivesWaitsForIt) {
  DecodeHarness h;
  auto sink = NewSink();
  const Request r = RemoteRequest("early-start", RandomTokens(33, kVocab, 8), 9);
  ASSERT_OK(h.loop().Submit(r, sink).status());
  ASSERT_TRUE(sink->WaitReserved());
  const std::vector<int32_t> want = h.Expected(r);
  // The router would not do this, but a Start racing ahead of the last KV
  // byte must wait for it, not decode from a partial cache.
  StartResult start;
  h.loop().Start(r.request_id, sink->generation(), want[0], start.Callback());
  EXPECT_FALSE(start.answered());
  ASSERT_OK_AND_ASSIGN(int32_t first, h.prefill().Prefill(r.prompt, sink->descriptor()));
  EXPECT_EQ(first, want[0]);
  ASSERT_OK(start.Wait());
  ASSERT_TRUE(sink->WaitEnded());
  std::vector<int32_t> got = {first};
  for (int32_t t : sink->tokens()) got.push_back(t);
  EXPECT_EQ(got, want);
  EXPECT_TRUE(h.AllBlocksFree());
}

// The KV timeout runs on the loop's clock: a fake one here, moved by the
// test, so that a loaded machine neither expires a lease early nor makes
// the test wait for real time to pass.
TEST(DecodeLoop, ReservationWithoutKvExpires) {
  FakeClock clock(absl::Now());
  DecodeLoopOptions options;
  options.kv_timeout = absl::Seconds(30);
  options.clock = &clock;
  DecodeHarness h(options);
  auto sink = NewSink();
  const Request r = RemoteRequest("expire", RandomTokens(20, kVocab, 9), 6);
  ASSERT_OK(h.loop().Submit(r, sink).status());
  ASSERT_TRUE(sink->WaitReserved());
  // A Start waiting for KV that never comes fails with the lease.
  StartResult start;
  h.loop().Start(r.request_id, sink->generation(), 3, start.Callback());
  ASSERT_TRUE(LoopCaughtUp(h.loop()));
  clock.Advance(options.kv_timeout - absl::Milliseconds(1));
  ASSERT_TRUE(LoopCaughtUp(h.loop()));
  EXPECT_FALSE(start.answered()) << "the lease expired before its timeout";
  clock.Advance(absl::Milliseconds(1));
  ASSERT_TRUE(sink->WaitEnded());
  EXPECT_THAT(sink->status(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(start.Wait(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_TRUE(h.AllBlocksFree());
  EXPECT_EQ(h.loop().Stats().requests_failed, 1u);
}

TEST(DecodeLoop, ReservationWithoutStartExpires) {
  FakeClock clock(absl::Now());
  DecodeLoopOptions options;
  options.kv_timeout = absl::Seconds(30);
  options.clock = &clock;
  DecodeHarness h(options);
  auto sink = NewSink();
  const Request r = RemoteRequest("no-start", RandomTokens(20, kVocab, 10), 6);
  ASSERT_OK(h.loop().Submit(r, sink).status());
  ASSERT_TRUE(sink->WaitReserved());
  ASSERT_OK(h.prefill().Prefill(r.prompt, sink->descriptor()).status());
  clock.Advance(options.kv_timeout);
  ASSERT_TRUE(sink->WaitEnded());
  EXPECT_THAT(sink->status(), StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("Start")));
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeLoop, SenderAbortEndsTheStreamAndFreesBlocks) {
  DecodeHarness h;
  auto sink = NewSink();
  const Request r = RemoteRequest("abort", RandomTokens(40, kVocab, 12), 6);
  ASSERT_OK(h.loop().Submit(r, sink).status());
  ASSERT_TRUE(sink->WaitReserved());
  EXPECT_FALSE(h.prefill().Prefill(r.prompt, sink->descriptor(), /*abort_after_layer=*/1).ok());
  ASSERT_TRUE(sink->WaitEnded());
  EXPECT_FALSE(sink->status().ok());
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeLoop, RequestsBeyondThePoolAreRefusedOthersWait) {
  DecodeLoopOptions options;
  options.kv_blocks = 4;  // 64 tokens
  DecodeHarness h(options);
  auto sink = NewSink();
  // 50 + 30 tokens need 5 blocks.
  ASSERT_OK(h.loop().Submit(LocalRequest("big", RandomTokens(50, kVocab, 1), 30), sink).status());
  ASSERT_TRUE(sink->WaitEnded());
  EXPECT_THAT(sink->status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("needs 5 KV blocks")));
  EXPECT_THAT(sink->status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("has 4 in all")));
  // One that fits holds its prompt's blocks; the next, which would fit
  // alone, waits for them instead of failing.
  auto holder = NewSink();
  ASSERT_OK_AND_ASSIGN(
      DecodeLoop::Ticket held,
      h.loop().Submit(RemoteRequest("hold", RandomTokens(20, kVocab, 2), 20), holder));
  ASSERT_TRUE(holder->WaitReserved());
  const Request second = LocalRequest("second", RandomTokens(20, kVocab, 3), 20);
  auto second_sink = NewSink();
  ASSERT_OK(h.loop().Submit(second, second_sink).status());
  EXPECT_TRUE(testing::WaitFor([&] {
    const LoopStats s = h.loop().Stats();
    return s.kv_blocks_free == 2 && s.waiting == 2;
  }));
  EXPECT_FALSE(second_sink->WaitEnded(absl::ZeroDuration()));
  h.loop().Cancel(held);
  ASSERT_TRUE(second_sink->WaitEnded());
  ASSERT_OK(second_sink->status());
  EXPECT_EQ(second_sink->tokens(), h.Expected(second));
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeLoop, MoreThanMaxSequencesAreRefusedAtOnce) {
  DecodeLoopOptions options;
  options.max_sequences = 2;
  DecodeHarness h(options);
  std::vector<DecodeLoop::Ticket> tickets;
  for (int i = 0; i < 2; ++i) {
    auto sink = NewSink();
    ASSERT_OK_AND_ASSIGN(DecodeLoop::Ticket t,
                         h.loop().Submit(RemoteRequest(absl::StrCat("h", i), {1, 2, 3}, 5), sink));
    tickets.push_back(t);
  }
  EXPECT_THAT(h.loop().Submit(LocalRequest("third", {1, 2, 3}, 5), NewSink()),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("2 sequences")));
  for (DecodeLoop::Ticket t : tickets) h.loop().Cancel(t);
  EXPECT_TRUE(h.AllBlocksFree());
  EXPECT_TRUE(h.loop().WaitUntilIdle(absl::Seconds(10)));
  EXPECT_OK(h.loop().Submit(LocalRequest("now", {1, 2, 3}, 5), NewSink()).status());
  // More choices than the worker ever holds: not worth a retry.
  Request wide = LocalRequest("wide", {1, 2, 3}, 5);
  wide.n = 3;
  EXPECT_THAT(h.loop().Submit(std::move(wide), NewSink()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--max_sequences")));
}

TEST(DecodeLoop, BadInputIsRejected) {
  DecodeHarness h;
  auto expect_invalid = [&](Request r, const std::string& what) {
    EXPECT_THAT(h.loop().Submit(std::move(r), NewSink()),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(what)));
  };
  expect_invalid(LocalRequest("a", {}, 5), "prompt is empty");
  expect_invalid(LocalRequest("b", {1, 101}, 5), "token ids must be in [0, 101)");
  expect_invalid(LocalRequest("c", {1, -1}, 5), "prompt token 1 is -1");
  expect_invalid(LocalRequest("d", std::vector<int32_t>(128, 1), 5), "context");
  expect_invalid(LocalRequest("e", {1, 2}, 0), "max_tokens");
  Request bad_sampling = LocalRequest("f", {1, 2}, 5);
  bad_sampling.sampling.top_p = 0.0f;
  expect_invalid(bad_sampling, "top_p");
  bad_sampling.sampling = SamplingParams{.temperature = -1.0f};
  expect_invalid(bad_sampling, "temperature");
  expect_invalid(RemoteRequest("", {1, 2}, 5), "request_id");
  Request bad_stop = LocalRequest("g", {1, 2}, 5);
  bad_stop.stop_token_ids = {500};
  expect_invalid(bad_stop, "stop token");
  EXPECT_TRUE(h.AllBlocksFree());
  EXPECT_EQ(h.loop().Stats().requests_failed, 9u);
}

TEST(DecodeLoop, DuplicateRequestIdIsRefused) {
  DecodeHarness h;
  auto first = NewSink(), second = NewSink();
  ASSERT_OK(h.loop().Submit(RemoteRequest("dup", {1, 2, 3}, 5), first).status());
  ASSERT_TRUE(first->WaitReserved());
  ASSERT_OK(h.loop().Submit(RemoteRequest("dup", {1, 2, 3}, 5), second).status());
  ASSERT_TRUE(second->WaitEnded());
  EXPECT_THAT(second->status(), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_OK(first->status());
}

TEST(DecodeLoop, StopTokenEndsWithEos) {
  DecodeHarness h;
  const std::vector<int32_t> prompt = RandomTokens(25, kVocab, 13);
  const std::vector<int32_t> free_run = h.Expected(LocalRequest("x", prompt, 30));
  // The first token (after the first) that did not appear before it.
  size_t k = 1;
  while (k < free_run.size() &&
         std::find(free_run.begin(), free_run.begin() + k, free_run[k]) != free_run.begin() + k) {
    ++k;
  }
  ASSERT_LT(k, free_run.size());
  const std::vector<int32_t> want(free_run.begin(), free_run.begin() + k);
  for (bool local : {true, false}) {
    Request r = RemoteRequest(local ? "stop-local" : "stop-remote", prompt, 30);
    r.local_prefill = local;
    r.stop_token_ids = {free_run[k]};
    auto sink = NewSink();
    std::vector<int32_t> got;
    if (local) {
      got = RunLocal(h.loop(), r, sink);
    } else {
      ASSERT_OK_AND_ASSIGN(got, h.RunRemote(r, sink));
    }
    EXPECT_EQ(got, want);
    ASSERT_TRUE(sink->finished().has_value());
    EXPECT_EQ(sink->finished()->reason, FinishReason::kEos);
    EXPECT_EQ(sink->finished()->completion_tokens, static_cast<int>(k));
  }
  // The first token itself is a stop token: the stream ends at once.
  Request r = RemoteRequest("stop-first", prompt, 30);
  r.stop_token_ids = {free_run[0]};
  auto sink = NewSink();
  ASSERT_OK(h.RunRemote(r, sink).status());
  EXPECT_TRUE(sink->tokens().empty());
  EXPECT_EQ(sink->finished()->reason, FinishReason::kEos);
  EXPECT_EQ(sink->finished()->completion_tokens, 0);
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeLoop, MaxTokensOneFinishesOnTheFirstToken) {
  DecodeHarness h;
  const Request r = RemoteRequest("one", RandomTokens(10, kVocab, 14), 1);
  auto sink = NewSink();
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> got, h.RunRemote(r, sink));
  EXPECT_EQ(got, h.Expected(r));
  EXPECT_TRUE(sink->tokens().empty());
  EXPECT_EQ(sink->finished()->reason, FinishReason::kLength);
  EXPECT_EQ(sink->finished()->completion_tokens, 1);
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeLoop, GenerationStopsAtTheEndOfTheContext) {
  DecodeHarness h;
  for (bool local : {true, false}) {
    Request r = RemoteRequest(local ? "ctx-local" : "ctx-remote", RandomTokens(120, kVocab, 8), 50);
    r.local_prefill = local;
    auto sink = NewSink();
    std::vector<int32_t> got;
    if (local) {
      got = RunLocal(h.loop(), r, sink);
    } else {
      ASSERT_OK_AND_ASSIGN(got, h.RunRemote(r, sink));
    }
    // 120 prompt tokens + 8 fill the 128 positions; the 9th is sampled at the last.
    EXPECT_EQ(got.size(), 9u);
    EXPECT_EQ(got, h.Expected(r));
    EXPECT_EQ(sink->finished()->reason, FinishReason::kContext);
    EXPECT_EQ(sink->finished()->completion_tokens, 9);
  }
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeLoop, RequestDeadlineEndsTheRequest) {
  FakeClock clock(absl::Now());
  DecodeLoopOptions options;
  options.clock = &clock;
  DecodeHarness h(options);
  Request r = RemoteRequest("late", RandomTokens(10, kVocab, 15), 5);
  r.deadline = clock.Now() + absl::Seconds(1);
  auto sink = NewSink();
  ASSERT_OK(h.loop().Submit(r, sink).status());
  ASSERT_TRUE(sink->WaitReserved());
  ASSERT_TRUE(LoopCaughtUp(h.loop()));
  EXPECT_OK(sink->status()) << "the request ended before its deadline";
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(sink->WaitEnded());
  EXPECT_THAT(sink->status(), StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("late")));
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeLoop, DrainRefusesNewWorkAndFinishesRunningWork) {
  DecodeHarness h;
  auto sink = NewSink();
  const Request r = LocalRequest("before", RandomTokens(10, kVocab, 16), 40);
  ASSERT_OK(h.loop().Submit(r, sink).status());
  h.loop().Drain();
  EXPECT_TRUE(h.loop().Stats().draining);
  EXPECT_THAT(h.loop().Submit(LocalRequest("after", {1, 2}, 5), NewSink()),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("draining")));
  EXPECT_TRUE(h.loop().WaitUntilIdle(absl::Seconds(30)));
  ASSERT_TRUE(sink->WaitEnded());
  EXPECT_OK(sink->status());
  EXPECT_EQ(sink->tokens(), h.Expected(r));
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeLoop, ShutdownEndsEveryRequest) {
  auto h = std::make_unique<DecodeHarness>();
  auto reserved = NewSink(), running = NewSink();
  ASSERT_OK(h->loop().Submit(RemoteRequest("r", {1, 2, 3}, 5), reserved).status());
  ASSERT_OK(h->loop().Submit(LocalRequest("l", {1, 2, 3}, 1000), running).status());
  ASSERT_TRUE(reserved->WaitReserved());
  ASSERT_TRUE(running->WaitTokens(1));
  // A Start waiting for KV that will never come is answered too.
  StartResult start;
  h->loop().Start("r", reserved->generation(), 4, start.Callback());
  h->loop().Stop();
  EXPECT_THAT(start.Wait(absl::ZeroDuration()), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(h->loop().Submit(LocalRequest("late", {1, 2}, 5), NewSink()),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));
  h->loop().Cancel(1);  // Harmless.
  h.reset();
  ASSERT_TRUE(reserved->WaitEnded(absl::ZeroDuration()));
  EXPECT_THAT(reserved->status(), StatusIs(absl::StatusCode::kUnavailable));
  // The running one may have reached the end of the context first.
  ASSERT_TRUE(running->WaitEnded(absl::ZeroDuration()));
  if (!running->finished().has_value()) {
    EXPECT_THAT(running->status(), StatusIs(absl::StatusCode::kUnavailable));
  }
}

TEST(DecodeLoop, StatsDescribeTheWorker) {
  DecodeLoopOptions options;
  options.model_name = "tiny";
  options.kv_blocks = 20;
  options.block_size = 8;
  DecodeHarness h(options);
  const LoopStats s = h.loop().Stats();
  EXPECT_EQ(s.model, "tiny");
  EXPECT_EQ(s.vocab_size, kVocab);
  EXPECT_EQ(s.max_context, 128);
  EXPECT_EQ(s.block_size, 8);
  EXPECT_EQ(s.kv_blocks_total, 20);
  EXPECT_EQ(s.kv_blocks_free, 20);
  EXPECT_FALSE(s.draining);
}

TEST(DecodeLoop, ImpossibleOptionsAreRejected) {
  auto weights = MakeSyntheticModel(testing::SmallShape(), 1).value();
  auto fabric = kvtransfer::InProcFabric::Create();
  auto transport = kvtransfer::InProcTransport::Create(fabric);
  DecodeLoopOptions options;
  options.max_sequences = 100;
  options.max_batch_tokens = 50;
  EXPECT_THAT(DecodeLoop::Create(*weights, testing::OneThreadBackend(), transport.get(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_sequences")));
  EXPECT_THAT(DecodeLoop::Create(*weights, testing::OneThreadBackend(), nullptr, {}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace tandem::decode
