// The decode worker's generation options: n choices, logprobs, prompt
// logprobs, penalties and min_tokens, locally and with a remote prefill.
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/engine/logprobs.h"
#include "common/engine/sampler.h"
#include "decode_worker/decode_loop.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/decode_worker/decode_test_util.h"

namespace tandem::decode {
namespace {

using ::tandem::decode::testing::DecodeHarness;
using ::tandem::decode::testing::LocalRequest;
using ::tandem::decode::testing::NewSink;
using ::tandem::decode::testing::RandomTokens;
using ::tandem::decode::testing::RecordingSink;
using ::tandem::decode::testing::RemoteRequest;
using ::tandem::decode::testing::StartResult;
using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

using testing::kVocab;

// Every choice finished once, in any order, and exactly one was the last.
void ExpectEveryChoiceFinished(const RecordingSink& sink, int n) {
  EXPECT_EQ(sink.finished_count(), n);
  int last = 0;
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(sink.finished(i).has_value()) << "choice " << i;
    EXPECT_EQ(sink.finished(i)->index, i);
    last += sink.finished(i)->last ? 1 : 0;
  }
  EXPECT_EQ(last, 1);
  EXPECT_EQ(sink.events_after_end(), 0);
}

// What Generate (the single-stream reference) gives choice `index`.
std::vector<int32_t> ExpectedChoice(DecodeHarness& h, Request r, int index) {
  r.sampling.seed = ChoiceSeed(r.sampling.seed, index);
  return h.Expected(r);
}

SamplingParams Penalized(uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 30;
  p.seed = seed;
  p.presence_penalty = 0.6f;
  p.frequency_penalty = 0.4f;
  p.repetition_penalty = 1.3f;
  p.logit_bias = {{3, 2.0f}, {17, -5.0f}};
  p.min_tokens = 4;
  return p;
}

TEST(DecodeChoices, GreedyChoicesEqualEachOtherAndOneChoiceLocally) {
  DecodeHarness h;
  Request r = LocalRequest("greedy", RandomTokens(25, kVocab, 1), 12);
  const std::vector<int32_t> one = h.Expected(r);
  r.n = 3;
  auto sink = NewSink();
  ASSERT_OK_AND_ASSIGN(std::vector<std::vector<int32_t>> all, h.RunLocalChoices(r, sink));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(all[i], one) << "choice " << i;
  ExpectEveryChoiceFinished(*sink, 3);
  EXPECT_EQ(sink->finished(2)->completion_tokens, 12);
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeChoices, GreedyChoicesEqualEachOtherAndOneChoiceRemotely) {
  DecodeHarness h;
  Request r = RemoteRequest("greedy-remote", RandomTokens(40, kVocab, 2), 10);
  const std::vector<int32_t> one = h.Expected(r);
  r.n = 2;
  auto sink = NewSink();
  ASSERT_OK_AND_ASSIGN(std::vector<std::vector<int32_t>> all, h.RunRemoteChoices(r, sink));
  EXPECT_EQ(all[0], one);
  EXPECT_EQ(all[1], one);
  ExpectEveryChoiceFinished(*sink, 2);
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeChoices, SampledChoiceZeroIsTheOneChoiceRunAndOthersUseTheirSeeds) {
  DecodeHarness h;
  Request r = LocalRequest("hot", RandomTokens(20, kVocab, 3), 16);
  r.sampling = SamplingParams{.temperature = 1.0f, .seed = 11};
  auto single = NewSink();
  ASSERT_OK_AND_ASSIGN(std::vector<std::vector<int32_t>> one, h.RunLocalChoices(r, single));

  r.request_id = "hot-3";
  r.n = 3;
  auto sink = NewSink();
  ASSERT_OK_AND_ASSIGN(std::vector<std::vector<int32_t>> all, h.RunLocalChoices(r, sink));
  EXPECT_EQ(all[0], one[0]);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(all[i], ExpectedChoice(h, r, i)) << "choice " << i;
  EXPECT_NE(all[0], all[1]);
  EXPECT_NE(all[1], all[2]);
  ExpectEveryChoiceFinished(*sink, 3);
  EXPECT_TRUE(h.AllBlocksFree());
}

// The prefill worker samples every choice's first token; the decode worker
// skips that draw and feeds its sampler the token: the tokens must equal a
// local run's with every processor on.
TEST(DecodeChoices, LocalAndRemoteGiveTheSameTokensWithPenalties) {
  DecodeHarness h;
  Request r = RemoteRequest("pen-remote", RandomTokens(33, kVocab, 4), 14);
  r.sampling = Penalized(21);
  r.n = 3;
  r.stop_token_ids = {5, 60};
  auto remote_sink = NewSink();
  ASSERT_OK_AND_ASSIGN(std::vector<std::vector<int32_t>> remote,
                       h.RunRemoteChoices(r, remote_sink));

  Request local = r;
  local.request_id = "pen-local";
  local.local_prefill = true;
  auto local_sink = NewSink();
  ASSERT_OK_AND_ASSIGN(std::vector<std::vector<int32_t>> here,
                       h.RunLocalChoices(local, local_sink));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(remote[i], here[i]) << "choice " << i;
    EXPECT_EQ(here[i], ExpectedChoice(h, local, i)) << "choice " << i;
    EXPECT_GE(here[i].size(), 4u) << "min_tokens";
    EXPECT_EQ(remote_sink->finished(i)->reason, local_sink->finished(i)->reason);
  }
  EXPECT_TRUE(h.AllBlocksFree());
}

// Regression guard for min_tokens: the greedy first token is made a stop
// id; with min_tokens the request must not end on it.
TEST(DecodeChoices, MinTokensKeepsStopIdsOut) {
  DecodeHarness h;
  Request r = LocalRequest("min", RandomTokens(18, kVocab, 5), 6);
  const int32_t first = h.Expected(r)[0];
  r.stop_token_ids = {first};
  r.sampling.min_tokens = 3;
  auto sink = NewSink();
  ASSERT_OK_AND_ASSIGN(std::vector<std::vector<int32_t>> all, h.RunLocalChoices(r, sink));
  ASSERT_GE(all[0].size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(all[0][i], first);
  EXPECT_EQ(all[0], h.Expected(r));
}

TEST(DecodeChoices, LogprobsComeWithEveryToken) {
  DecodeHarness h;
  Request r = LocalRequest("lp", RandomTokens(15, kVocab, 6), 8);
  r.logprobs = 3;
  r.n = 2;
  r.sampling = SamplingParams{.temperature = 1.0f, .seed = 2};
  auto sink = NewSink();
  ASSERT_OK_AND_ASSIGN(std::vector<std::vector<int32_t>> all, h.RunLocalChoices(r, sink));
  for (int c = 0; c < 2; ++c) {
    const std::vector<TokenLogprob> lps = sink->logprobs(c);
    ASSERT_EQ(lps.size(), all[c].size());
    for (size_t i = 0; i < lps.size(); ++i) {
      EXPECT_EQ(lps[i].token_id, all[c][i]);
      EXPECT_LE(lps[i].logprob, 0.0f);
      ASSERT_EQ(lps[i].top.size(), 3u);
      EXPECT_GE(lps[i].top[0].logprob, lps[i].top[1].logprob);
      EXPECT_GE(lps[i].top[0].logprob, lps[i].logprob);
    }
  }
  // Without logprobs none are sent.
  Request plain = LocalRequest("plain", RandomTokens(15, kVocab, 6), 4);
  auto plain_sink = NewSink();
  ASSERT_OK(h.RunLocalChoices(plain, plain_sink).status());
  EXPECT_TRUE(plain_sink->logprobs().empty());
  EXPECT_FALSE(plain_sink->prompt_logprobs().has_value());
}

// max_sequences 4 caps the step's rows of logits at 4: the prompt's
// logprobs come from ten chunks.
TEST(DecodeChoices, PromptLogprobsMatchTheReferenceAcrossChunks) {
  DecodeLoopOptions options;
  options.max_sequences = 4;
  options.max_batch_tokens = 64;
  DecodeHarness h(options);
  const std::vector<int32_t> prompt = RandomTokens(40, kVocab, 7);
  Request r = LocalRequest("plp", prompt, 5);
  r.prompt_logprobs = true;
  r.logprobs = 1;
  auto sink = NewSink();
  ASSERT_OK_AND_ASSIGN(std::vector<std::vector<int32_t>> all, h.RunLocalChoices(r, sink));
  EXPECT_EQ(all[0], h.Expected(r));
  ASSERT_TRUE(sink->prompt_logprobs().has_value());
  const std::vector<TokenLogprob> got = *sink->prompt_logprobs();
  ASSERT_EQ(got.size(), prompt.size() - 1);

  auto reference = testing::MakeEngine(h.weights(), EngineOptions{.max_logit_rows = 64});
  BlockTable table = reference->NewSequence();
  BatchItem item{&table, prompt};
  item.all_logits = true;
  ASSERT_OK_AND_ASSIGN(std::vector<float> rows, reference->Step({&item, 1}));
  for (size_t t = 0; t + 1 < prompt.size(); ++t) {
    const TokenLogprob want =
        ComputeLogprob(std::span<const float>(rows).subspan(t * kVocab, kVocab), prompt[t + 1], 1);
    EXPECT_EQ(got[t].token_id, prompt[t + 1]);
    EXPECT_NEAR(got[t].logprob, want.logprob, 1e-4) << "position " << t;
    ASSERT_EQ(got[t].top.size(), 1u);
    EXPECT_EQ(got[t].top[0].token_id, want.top[0].token_id);
  }
  reference->Release(table);
  EXPECT_EQ(sink->events_after_end(), 0);  // the prompt's came before any token
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeChoices, CancelFreesEveryChoicesBlocks) {
  DecodeHarness h;
  // Local, mid-decode.
  Request r = LocalRequest("cancel", RandomTokens(30, kVocab, 8), 90);
  r.n = 4;
  auto sink = NewSink();
  ASSERT_OK_AND_ASSIGN(DecodeLoop::Ticket t, h.loop().Submit(r, sink));
  ASSERT_TRUE(sink->WaitTokens(2));
  h.loop().Cancel(t);
  ASSERT_TRUE(sink->WaitEnded());
  EXPECT_THAT(sink->status(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_TRUE(h.AllBlocksFree());

  // Remote, reserved and waiting for its KV.
  Request remote = RemoteRequest("cancel-remote", RandomTokens(30, kVocab, 9), 20);
  remote.n = 3;
  auto waiting = NewSink();
  ASSERT_OK_AND_ASSIGN(DecodeLoop::Ticket w, h.loop().Submit(remote, waiting));
  ASSERT_TRUE(waiting->WaitReserved());
  EXPECT_TRUE(testing::WaitFor([&] { return h.loop().Stats().waiting == 3; }));
  h.loop().Cancel(w);
  ASSERT_TRUE(waiting->WaitEnded());
  EXPECT_TRUE(h.AllBlocksFree());
  EXPECT_TRUE(h.loop().WaitUntilIdle(absl::Seconds(10)));
}

TEST(DecodeChoices, AdmissionReservesBlocksForEveryChoice) {
  DecodeLoopOptions options;
  options.kv_blocks = 8;  // 128 tokens
  DecodeHarness h(options);
  // 20 + 20 tokens: 3 blocks a choice.
  Request r = LocalRequest("fits", RandomTokens(20, kVocab, 10), 20);
  r.n = 2;
  ASSERT_OK(h.RunLocalChoices(r, NewSink()).status());
  r.request_id = "too-many";
  r.n = 3;
  auto sink = NewSink();
  ASSERT_OK(h.loop().Submit(r, sink).status());
  ASSERT_TRUE(sink->WaitEnded());
  EXPECT_THAT(sink->status(), StatusIs(absl::StatusCode::kResourceExhausted,
                                       HasSubstr("needs 9 KV blocks (3 choices")));
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeChoices, ChoicesCountAgainstMaxSequences) {
  DecodeLoopOptions options;
  options.max_sequences = 4;
  DecodeHarness h(options);
  Request r = RemoteRequest("three", {1, 2, 3}, 5);
  r.n = 3;
  ASSERT_OK_AND_ASSIGN(DecodeLoop::Ticket t, h.loop().Submit(r, NewSink()));
  Request two = RemoteRequest("two", {1, 2, 3}, 5);
  two.n = 2;
  EXPECT_THAT(h.loop().Submit(two, NewSink()),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("2 choices")));
  EXPECT_OK(h.loop().Submit(LocalRequest("one", {1, 2, 3}, 5), NewSink()).status());
  h.loop().Cancel(t);
  EXPECT_TRUE(h.loop().WaitUntilIdle(absl::Seconds(10)));
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeChoices, OutOfBoundsOptionsAreInvalidArgument) {
  DecodeHarness h;
  auto with = [](auto mutate) {
    Request r = LocalRequest("bad", {1, 2, 3}, 5);
    mutate(r);
    return r;
  };
  EXPECT_THAT(h.loop().Submit(with([](Request& r) { r.n = 0; }), NewSink()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("n is 0")));
  EXPECT_THAT(h.loop().Submit(with([](Request& r) { r.n = kMaxChoices + 1; }), NewSink()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("choices")));
  EXPECT_THAT(
      h.loop().Submit(with([](Request& r) { r.logprobs = kMaxTopLogprobs + 1; }), NewSink()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("logprobs")));
  EXPECT_THAT(h.loop().Submit(with([](Request& r) { r.logprobs = -1; }), NewSink()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("logprobs")));
  EXPECT_THAT(h.loop().Submit(with([](Request& r) {
                                r.local_prefill = false;
                                r.prompt_logprobs = true;
                              }),
                              NewSink()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("local_prefill")));
  EXPECT_THAT(h.loop().Submit(with([](Request& r) {
                                r.sampling.logit_bias = {{kVocab, 1.0f}};
                              }),
                              NewSink()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("vocabulary")));
  EXPECT_THAT(
      h.loop().Submit(with([](Request& r) { r.sampling.repetition_penalty = 0.0f; }), NewSink()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("repetition_penalty")));
}

TEST(DecodeChoices, StartNeedsOneFirstTokenPerChoice) {
  DecodeHarness h;
  Request r = RemoteRequest("start-n", RandomTokens(10, kVocab, 11), 5);
  r.n = 3;
  auto sink = NewSink();
  ASSERT_OK(h.loop().Submit(r, sink).status());
  ASSERT_TRUE(sink->WaitReserved());
  StartResult short_start;
  h.loop().Start(r.request_id, sink->generation(), 1, {2}, short_start.Callback());
  EXPECT_THAT(short_start.Wait(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("3 choices")));
  StartResult bad_token;
  h.loop().Start(r.request_id, sink->generation(), 1, {2, kVocab}, bad_token.Callback());
  EXPECT_THAT(bad_token.Wait(), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("range")));
  StartResult two_draws;
  h.loop().Start(r.request_id, sink->generation(), 1, {2, 3}, two_draws.Callback(), {1, 1});
  EXPECT_THAT(two_draws.Wait(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sampler draw counts")));
  StartResult huge_draws;
  h.loop().Start(r.request_id, sink->generation(), 1, {2, 3}, huge_draws.Callback(),
                 {1, 1, Sampler::kMaxReplay + 1});
  EXPECT_THAT(huge_draws.Wait(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sampler draw count of")));
  // The reservation is still there: a good Start goes through.
  ASSERT_OK_AND_ASSIGN(
      std::vector<int32_t> first,
      h.prefill().PrefillChoices(r.prompt, sink->descriptor(), -1, r.sampling, 3, {}));
  StartResult good;
  h.loop().Start(r.request_id, sink->generation(), first[0], {first[1], first[2]}, good.Callback());
  EXPECT_OK(good.Wait());
  ASSERT_TRUE(sink->WaitEnded());
  ExpectEveryChoiceFinished(*sink, 3);
  EXPECT_TRUE(h.AllBlocksFree());
}

}  // namespace
}  // namespace tandem::decode
