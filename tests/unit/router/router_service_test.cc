// RouterService against fake prefill and decode workers over real gRPC: routing
// a request over the workers (disaggregated, colocated, local prefill) and
// what it survives of theirs: failed, lost, refusing, dying, disagreeing and
// hung workers. What a client's request does (cancels, timeouts, bad input,
// text, refusals, stop strings, EOS) is in router_service_request_test.cc.
#include "router/router_service.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/rpc/grpc_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/request_driver.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/router/router_harness.h"
#include "tests/unit/router/router_service_fixture.h"

namespace tandem::router::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(RouterServiceTest, DisaggregatedStreamsPrefillTokenFirstThenDecodeTokens) {
  auto h = StartHarness({.prefill = 1, .decode = 1});
  ASSERT_NE(h, nullptr);
  const Result r = h->Run(TokenRequest({1, 5, 6, 7}, 5));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_THAT(r.tokens, ElementsAre(40, 20, 21, 22, 23));
  // The prefill worker's token reaches the client on its own, before decoding.
  ASSERT_GE(r.messages.size(), 2u);
  EXPECT_THAT(r.messages[0].token_ids(), ElementsAre(40));
  EXPECT_EQ(r.messages[0].text(), " w40");
  EXPECT_EQ(r.text, " w40 w20 w21 w22 w23");

  // The protocol of worker.proto: Generate -> Reserved -> Prefill(lease) -> Start(generation).
  const auto decode_requests = h->decode(0).requests();
  ASSERT_EQ(decode_requests.size(), 1u);
  EXPECT_FALSE(decode_requests[0].local_prefill());
  EXPECT_THAT(decode_requests[0].prompt(), ElementsAre(1, 5, 6, 7));
  EXPECT_EQ(decode_requests[0].max_tokens(), 5);
  EXPECT_THAT(decode_requests[0].stop_token_ids(), ElementsAre(kFakeEos));
  const auto prefill_requests = h->prefill(0).requests();
  ASSERT_EQ(prefill_requests.size(), 1u);
  EXPECT_EQ(prefill_requests[0].request_id(), decode_requests[0].request_id());
  EXPECT_EQ(prefill_requests[0].kv_descriptor(), "kv:" + decode_requests[0].request_id());
  EXPECT_THAT(prefill_requests[0].tokens(), ElementsAre(1, 5, 6, 7));
  const auto starts = h->decode(0).starts();
  ASSERT_EQ(starts.size(), 1u);
  EXPECT_EQ(starts[0].request_id(), decode_requests[0].request_id());
  EXPECT_EQ(starts[0].generation(), h->decode(0).generations().at(0));
  EXPECT_EQ(starts[0].first_token(), 40);

  const v1::Finished& f = r.finished;
  EXPECT_EQ(f.reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(f.usage().prompt_tokens(), 4);
  EXPECT_EQ(f.usage().completion_tokens(), 5);
  EXPECT_TRUE(f.disaggregated());
  EXPECT_EQ(f.prefill_worker(), h->prefill_address(0));
  EXPECT_EQ(f.decode_worker(), h->decode_address(0));
  const v1::Timeline& t = f.timeline();
  EXPECT_GT(t.router_queue_us(), 0);
  EXPECT_EQ(t.prefill_queue_us(), 11);
  EXPECT_EQ(t.prefill_us(), 22);
  EXPECT_EQ(t.kv_transfer_us(), 33);
  EXPECT_EQ(t.decode_queue_us(), 44);
  EXPECT_GE(t.first_token_us(), t.router_queue_us());
  EXPECT_GE(t.end_us(), t.first_token_us());
  EXPECT_TRUE(r.messages.back().has_finished());
}

TEST(RouterServiceTest, ColocatedModePrefillsOnTheDecodeWorker) {
  auto h = StartHarness({.prefill = 0, .decode = 1});
  ASSERT_NE(h, nullptr);
  const Result r = h->Run(TokenRequest({1, 5}, 3));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_THAT(r.tokens, ElementsAre(20, 21, 22));
  EXPECT_EQ(r.text, " w20 w21 w22");
  const auto requests = h->decode(0).requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_TRUE(requests[0].local_prefill());
  EXPECT_TRUE(h->decode(0).starts().empty());
  EXPECT_FALSE(r.finished.disaggregated());
  EXPECT_EQ(r.finished.prefill_worker(), "");
  EXPECT_EQ(r.finished.timeline().prefill_us(), 55);
  EXPECT_EQ(r.finished.timeline().kv_transfer_us(), 0);
  EXPECT_EQ(r.finished.usage().completion_tokens(), 3);
}

TEST(RouterServiceTest, ShortPromptsArePrefilledLocallyLongOnesDisaggregated) {
  HarnessOptions options{.prefill = 1, .decode = 1};
  options.router.driver.local_prefill_tokens = 3;
  auto h = StartHarness(options);
  ASSERT_NE(h, nullptr);
  const Result short_prompt = h->Run(TokenRequest({1, 5, 6}, 2));
  const Result long_prompt = h->Run(TokenRequest({1, 5, 6, 7}, 2));
  ASSERT_TRUE(short_prompt.status.ok() && long_prompt.status.ok());
  EXPECT_FALSE(short_prompt.finished.disaggregated());
  EXPECT_TRUE(long_prompt.finished.disaggregated());
  EXPECT_EQ(h->prefill(0).requests().size(), 1u);
}

TEST(RouterServiceTest, UsageCountsThePromptTokensThePrefillWorkerHadCached) {
  auto h = StartHarness({.prefill = 1, .decode = 1});
  ASSERT_NE(h, nullptr);
  h->prefill(0).SetBehaviour({.cached_tokens = 32});
  const Result r = h->Run(TokenRequest(std::vector<int32_t>(40, 5), 2));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.finished.usage().prompt_tokens(), 40);
  EXPECT_EQ(r.finished.usage().cached_tokens(), 32);
}

TEST(RouterServiceTest, PrefillFailureIsRetriedOnTheOtherPrefillWorker) {
  auto h = StartHarness({.prefill = 2, .decode = 1});
  ASSERT_NE(h, nullptr);
  const int bad = h->FirstPrefill();
  const int good = 1 - bad;
  h->prefill(bad).SetBehaviour({.fail = absl::InternalError("prefill blew up")});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 3));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_THAT(r.tokens, ElementsAre(40, 20, 21));
  EXPECT_EQ(r.finished.prefill_worker(), h->prefill_address(good));
  EXPECT_EQ(h->prefill(bad).requests().size(), 1u);
  EXPECT_EQ(h->prefill(good).requests().size(), 1u);
  // A fresh reservation for the retry; the first one was cancelled.
  const auto decode_requests = h->decode(0).requests();
  ASSERT_EQ(decode_requests.size(), 2u);
  EXPECT_NE(decode_requests[0].request_id(), decode_requests[1].request_id());
  EXPECT_TRUE(h->decode(0).WaitForCancelled(1, kWait));
  const auto starts = h->decode(0).starts();
  ASSERT_EQ(starts.size(), 1u);
  EXPECT_EQ(starts[0].generation(), h->decode(0).generations().at(1));
  EXPECT_EQ(h->prefill(good).requests()[0].kv_descriptor(),
            "kv:" + decode_requests[1].request_id());
}

// A prefill worker that cannot ship the KV to a decode worker cut off from
// the network only times out; the retry reserves on the other decode
// worker, not on that one again.
TEST(RouterServiceTest, PrefillRetryReservesOnAnotherDecodeWorker) {
  auto h = StartHarness({.prefill = 2, .decode = 2});
  ASSERT_NE(h, nullptr);
  const int bad = h->FirstPrefill();
  h->prefill(bad).SetBehaviour({.fail = absl::UnavailableError("KV transfer lost")});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 3));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.finished.prefill_worker(), h->prefill_address(1 - bad));
  ASSERT_EQ(h->decode(0).requests().size(), 1u);
  ASSERT_EQ(h->decode(1).requests().size(), 1u);
  const int first = h->prefill(bad).requests()[0].kv_descriptor() ==
                            "kv:" + h->decode(0).requests()[0].request_id()
                        ? 0
                        : 1;
  EXPECT_EQ(r.finished.decode_worker(), h->decode_address(1 - first));
  EXPECT_TRUE(h->decode(first).WaitForCancelled(1, kWait));
}

// Both prefill workers lost the request (their KV link is down): the
// decode worker computes the prompt and the request goes on.
TEST(RouterServiceTest, WhenEveryPrefillWorkerIsLostTheDecodeWorkerComputesThePrompt) {
  auto h = StartHarness({.prefill = 2, .decode = 1});
  ASSERT_NE(h, nullptr);
  h->prefill(0).SetBehaviour({.fail = absl::UnavailableError("kv link down")});
  h->prefill(1).SetBehaviour({.fail = absl::UnavailableError("kv link down")});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 3));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens.size(), 3u);
  EXPECT_FALSE(r.finished.disaggregated());
  // Both reservations were given back, then the request ran locally.
  const std::vector<v1::DecodeRequest> seen = h->decode(0).requests();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_FALSE(seen[1].local_prefill());
  EXPECT_TRUE(seen[2].local_prefill());
  EXPECT_TRUE(h->decode(0).WaitForCancelled(2, kWait));
  EXPECT_TRUE(h->decode(0).starts().empty());
}

// Refusals are not losses: both prefill workers full is an error naming
// them, not a local prefill.
TEST(RouterServiceTest, BothPrefillWorkersRefusingIsAnErrorNamingThem) {
  auto h = StartHarness({.prefill = 2, .decode = 1});
  ASSERT_NE(h, nullptr);
  h->prefill(0).SetBehaviour({.fail = absl::ResourceExhaustedError("queue full")});
  h->prefill(1).SetBehaviour({.fail = absl::ResourceExhaustedError("queue full")});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 3));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(r.status.error_message(), HasSubstr(h->prefill_address(0)));
  EXPECT_THAT(r.status.error_message(), HasSubstr(h->prefill_address(1)));
  EXPECT_THAT(r.status.error_message(), HasSubstr("queue full"));
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_EQ(h->decode(0).requests().size(), 2u);
  EXPECT_TRUE(h->decode(0).WaitForCancelled(2, kWait));
}

TEST(RouterServiceTest, DecodeWorkerDyingMidStreamIsUnavailableNamingIt) {
  auto h = StartHarness({.prefill = 1, .decode = 1});
  ASSERT_NE(h, nullptr);
  h->decode(0).SetBehaviour({.fail_after = 3});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 10));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(r.status.error_message(), HasSubstr("decode worker " + h->decode_address(0) +
                                                  " was lost mid-stream after 4 tokens"));
  EXPECT_THAT(r.status.error_message(), HasSubstr("fake decode worker crashed"));
  EXPECT_THAT(r.tokens, ElementsAre(40, 20, 21, 22));
}

// With another decode worker, a stream whose worker dies moves there: the
// new worker gets the tokens sent so far to resume from, and the client
// gets every token once, with status OK.
TEST(RouterServiceTest, DecodeWorkerDyingMidStreamMigratesToAnother) {
  auto h = StartHarness({.prefill = 1, .decode = 2});
  ASSERT_NE(h, nullptr);
  const int bad = h->FirstDecode();
  h->decode(bad).SetBehaviour({.fail_after = 3});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 10));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_THAT(r.tokens, ElementsAre(40, 20, 21, 22, 23, 24, 25, 26, 27, 28));
  EXPECT_EQ(r.finished.decode_worker(), h->decode_address(1 - bad));
  EXPECT_EQ(r.finished.usage().completion_tokens(), 10);
  const std::vector<v1::DecodeRequest> moved = h->decode(1 - bad).requests();
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_TRUE(moved[0].local_prefill());
  EXPECT_FALSE(moved[0].prompt_logprobs());
  EXPECT_THAT(moved[0].prompt(), ElementsAre(1, 5, 6));
  ASSERT_EQ(moved[0].resume_size(), 1);
  EXPECT_THAT(moved[0].resume(0).tokens(), ElementsAre(40, 20, 21, 22));
  EXPECT_EQ(moved[0].max_tokens(), 10);
}

// A draining decode worker offers its streams (`moving`): with
// --kv_handoff=false the router moves the stream as it would a lost one,
// and cancels it there, which lets the worker finish its drain at once.
TEST(RouterServiceTest, StreamOfferedByADrainingWorkerMoves) {
  RouterCoreOptions router;
  router.driver.kv_handoff = false;
  auto h = StartHarness({.prefill = 1, .decode = 2, .router = router});
  ASSERT_NE(h, nullptr);
  const int draining = h->FirstDecode();
  // The draining worker holds the old stream open after the offer until
  // the router cancels it (were it to decode on to the end first, the
  // cancel would find nothing to cancel).
  h->decode(draining).SetBehaviour(
      {.hold_after = 4, .moving_after = 3, .token_interval = absl::Milliseconds(5)});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 10));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_THAT(r.tokens, ElementsAre(40, 20, 21, 22, 23, 24, 25, 26, 27, 28));
  EXPECT_EQ(r.finished.decode_worker(), h->decode_address(1 - draining));
  EXPECT_EQ(r.finished.usage().completion_tokens(), 10);
  ASSERT_EQ(h->decode(draining).requests().size(), 1u);
  EXPECT_TRUE(h->decode(draining).requests()[0].movable());
  EXPECT_TRUE(h->decode(draining).WaitForCancelled(1, kWait));
  const std::vector<v1::DecodeRequest> moved = h->decode(1 - draining).requests();
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_TRUE(moved[0].local_prefill());
  ASSERT_EQ(moved[0].resume_size(), 1);
  EXPECT_THAT(moved[0].resume(0).tokens(), ElementsAre(40, 20, 21, 22));
  // One of the two migrations is spent: the new stream may still move.
  EXPECT_TRUE(moved[0].movable());
}

// By default a one-choice stream moves with its K/V: the new worker
// reserves a resume (no local prefill), the draining one is asked to ship
// the stream's K/V into that lease, and the Start names the last token the
// client has. Nothing is recomputed, and the client sees every token once.
TEST(RouterServiceTest, StreamOfferedByADrainingWorkerMovesWithItsKv) {
  auto h = StartHarness({.prefill = 1, .decode = 2});
  ASSERT_NE(h, nullptr);
  const int draining = h->FirstDecode();
  // The draining worker holds the old stream open after the offer until
  // the router cancels it (were it to decode on to the end first, the
  // cancel would find nothing to cancel).
  h->decode(draining).SetBehaviour(
      {.hold_after = 4, .moving_after = 3, .token_interval = absl::Milliseconds(5)});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 10));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_THAT(r.tokens, ElementsAre(40, 20, 21, 22, 23, 24, 25, 26, 27, 28));
  EXPECT_EQ(r.finished.decode_worker(), h->decode_address(1 - draining));
  const std::vector<v1::DecodeRequest> moved = h->decode(1 - draining).requests();
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_FALSE(moved[0].local_prefill());
  ASSERT_EQ(moved[0].resume_size(), 1);
  EXPECT_THAT(moved[0].resume(0).tokens(), ElementsAre(40, 20, 21, 22));
  const std::vector<v1::HandoffRequest> handoffs = h->decode(draining).handoffs();
  ASSERT_EQ(handoffs.size(), 1u);
  EXPECT_EQ(handoffs[0].request_id(), h->decode(draining).requests()[0].request_id());
  EXPECT_THAT(handoffs[0].tokens(), ElementsAre(40, 20, 21, 22));
  EXPECT_FALSE(handoffs[0].kv_descriptor().empty());
  const std::vector<v1::StartRequest> starts = h->decode(1 - draining).starts();
  ASSERT_EQ(starts.size(), 1u);
  EXPECT_EQ(starts[0].request_id(), moved[0].request_id());
  EXPECT_EQ(starts[0].first_token(), 22);
  EXPECT_EQ(starts[0].sampler_draws_size(), 0);
  // The old stream is cancelled once the K/V is out.
  EXPECT_TRUE(h->decode(draining).WaitForCancelled(1, kWait));
}

// A draining worker that cannot ship (its KV on a GPU, or no sender) says
// so: the move recomputes at once, with no reservation spent on a handoff.
TEST(RouterServiceTest, AWorkerThatShipsNoKvIsRecomputedFrom) {
  auto h = StartHarness({.prefill = 1, .decode = 2});
  ASSERT_NE(h, nullptr);
  const int draining = h->FirstDecode();
  h->decode(draining).SetBehaviour(
      {.moving_after = 3, .ships_kv = false, .token_interval = absl::Milliseconds(5)});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 10));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_THAT(r.tokens, ElementsAre(40, 20, 21, 22, 23, 24, 25, 26, 27, 28));
  EXPECT_TRUE(h->decode(draining).handoffs().empty());
  const std::vector<v1::DecodeRequest> moved = h->decode(1 - draining).requests();
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_TRUE(moved[0].local_prefill());
}

// The worker the stream moves to not answering its reservation in time:
// the move recomputes instead of failing the request.
TEST(RouterServiceTest, ASlowReservationForAHandoffRecomputesInstead) {
  RouterCoreOptions router;
  router.driver.reserve_timeout = absl::Milliseconds(200);
  auto h = StartHarness({.prefill = 1, .decode = 2, .router = router});
  ASSERT_NE(h, nullptr);
  const int draining = h->FirstDecode();
  h->decode(draining).SetBehaviour({.moving_after = 3, .token_interval = absl::Milliseconds(5)});
  h->decode(1 - draining).SetBehaviour({.hold_reservation = true});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 10));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_THAT(r.tokens, ElementsAre(40, 20, 21, 22, 23, 24, 25, 26, 27, 28));
  EXPECT_TRUE(h->decode(draining).handoffs().empty());
  const std::vector<v1::DecodeRequest> moved = h->decode(1 - draining).requests();
  ASSERT_EQ(moved.size(), 2u);
  EXPECT_FALSE(moved[0].local_prefill());
  EXPECT_TRUE(moved[1].local_prefill());
}

// A handoff that fails (the draining worker could not ship) costs a
// recompute, not the request: the reservation goes and the tokens are
// computed on a decode worker.
TEST(RouterServiceTest, AFailedKvHandoffRecomputesInstead) {
  auto h = StartHarness({.prefill = 1, .decode = 2});
  ASSERT_NE(h, nullptr);
  const int draining = h->FirstDecode();
  h->decode(draining).SetBehaviour({.moving_after = 3,
                                    .handoff = absl::FailedPreconditionError("no sender"),
                                    .token_interval = absl::Milliseconds(5)});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 10));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_THAT(r.tokens, ElementsAre(40, 20, 21, 22, 23, 24, 25, 26, 27, 28));
  EXPECT_EQ(h->decode(draining).handoffs().size(), 1u);
  const std::vector<v1::DecodeRequest> moved = h->decode(1 - draining).requests();
  ASSERT_EQ(moved.size(), 2u);
  EXPECT_FALSE(moved[0].local_prefill());
  EXPECT_TRUE(moved[1].local_prefill());
  EXPECT_THAT(moved[1].resume(0).tokens(), ElementsAre(40, 20, 21, 22));
  EXPECT_EQ(r.finished.decode_worker(), h->decode_address(1 - draining));
}

// With nowhere to go (or no migrations left) the offer is declined by
// saying nothing: the stream runs to its end on the draining worker.
TEST(RouterServiceTest, StreamOfferedWithNowhereToGoStays) {
  auto h = StartHarness({.prefill = 1, .decode = 1});
  ASSERT_NE(h, nullptr);
  h->decode(0).SetBehaviour({.moving_after = 3});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 10));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_THAT(r.tokens, ElementsAre(40, 20, 21, 22, 23, 24, 25, 26, 27, 28));
  EXPECT_EQ(h->decode(0).requests().size(), 1u);
  EXPECT_EQ(h->decode(0).cancelled(), 0);
}

// --max_migrations=0: streams are not movable, so a draining worker keeps
// them (the fake only offers movable ones).
TEST(RouterServiceTest, WithoutMigrationsStreamsAreNotMovable) {
  RouterCoreOptions router;
  router.driver.max_migrations = 0;
  auto h = StartHarness({.prefill = 1, .decode = 2, .router = router});
  ASSERT_NE(h, nullptr);
  for (int i = 0; i < 2; ++i) h->decode(i).SetBehaviour({.moving_after = 3});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 10));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  int requests = 0;
  for (int i = 0; i < 2; ++i) {
    for (const v1::DecodeRequest& d : h->decode(i).requests()) {
      ++requests;
      EXPECT_FALSE(d.movable());
    }
  }
  EXPECT_EQ(requests, 1);
}

// Each choice resumes from its own tokens; the second worker dying too,
// within --max_migrations, moves the stream once more; beyond it the
// request fails as lost.
TEST(RouterServiceTest, MigrationsResumeEveryChoiceAndAreBounded) {
  auto h = StartHarness({.prefill = 1, .decode = 3});
  ASSERT_NE(h, nullptr);
  for (int i = 0; i < 3; ++i) h->decode(i).SetBehaviour({.fail_after = 2});
  v1::GenerateRequest request = TokenRequest({1, 5, 6}, 12);
  request.set_n(2);
  const Result r = h->Run(request);
  // Three workers fail in turn: two migrations, then the third loss ends it.
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_THAT(r.status.error_message(), HasSubstr("lost mid-stream"));
  int with_resume = 0;
  for (int i = 0; i < 3; ++i) {
    for (const v1::DecodeRequest& d : h->decode(i).requests()) {
      if (d.resume_size() == 0) continue;
      ++with_resume;
      ASSERT_EQ(d.resume_size(), 2);
      // Choice c's tokens so far: its first from prefill, then its script.
      EXPECT_GE(d.resume(0).tokens_size(), 1);
      EXPECT_GE(d.resume(1).tokens_size(), 1);
    }
  }
  EXPECT_EQ(with_resume, 2);
}

TEST(RouterServiceTest, DecodeWorkerRefusingIsReplacedByAnother) {
  auto h = StartHarness({.prefill = 1, .decode = 2});
  ASSERT_NE(h, nullptr);
  const int bad = h->FirstDecode();
  h->decode(bad).SetBehaviour({.refuse = absl::UnavailableError("worker is draining")});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 3));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.finished.decode_worker(), h->decode_address(1 - bad));
  EXPECT_EQ(h->decode(bad).requests().size(), 1u);
  EXPECT_EQ(h->decode(1 - bad).requests().size(), 1u);
}

// A worker whose server shuts down (SIGTERM) with the reservation call not
// yet handled ends it CANCELLED; the router did not cancel it, so the
// request goes to another worker instead of failing CANCELLED.
TEST(RouterServiceTest, DecodeWorkerCancellingTheReservationIsReplacedByAnother) {
  auto h = StartHarness({.prefill = 1, .decode = 2});
  ASSERT_NE(h, nullptr);
  const int bad = h->FirstDecode();
  h->decode(bad).SetBehaviour({.refuse = absl::CancelledError("server shutting down")});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 3));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.finished.decode_worker(), h->decode_address(1 - bad));
  EXPECT_EQ(h->decode(bad).requests().size(), 1u);
}

// Waits until `pred(registry)` holds, polling the workers.
template <typename Pred>
bool PollUntil(RouterHarness& h, Pred pred) {
  const absl::Time deadline = absl::Now() + kWait;
  while (!pred(h.registry())) {
    if (absl::Now() > deadline) return false;
    h.registry().PollNow();
  }
  return true;
}

bool Routable(WorkerRegistry& registry, WorkerRole role, const std::string& address) {
  for (const WorkerSnapshot& s : registry.Snapshot(role)) {
    if (s.address == address) return s.routable();
  }
  return false;
}

// Guards: a decode worker with another KV layout than the prefill workers
// received their KV blocks (and decoded garbage).
TEST(RouterServiceTest, ADecodeWorkerThatDisagreesWithThePoolGetsNoRequest) {
  auto h = StartHarness({.prefill = 1, .decode = 3});
  ASSERT_NE(h, nullptr);
  // The one the policy would pick first.
  const int bad = h->FirstDecode();
  h->decode(bad).SetModel({.kv_dtype = "bf16"});
  ASSERT_TRUE(PollUntil(*h, [&](WorkerRegistry& r) {
    return !Routable(r, WorkerRole::kDecode, h->decode_address(bad));
  }));
  for (int i = 0; i < 6; ++i) {
    const Result r = h->Run(TokenRequest({1, 5, 6}, 2));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_NE(r.finished.decode_worker(), h->decode_address(bad));
  }
  EXPECT_EQ(h->decode(bad).requests().size(), 0u);
}

TEST(RouterServiceTest, NoDecodeWorkerInThePoolIsUnavailableSayingWhatDiffers) {
  auto h = StartHarness({.prefill = 1, .decode = 1});
  ASSERT_NE(h, nullptr);
  // One against one: the pool keeps what it served (the prefill worker's).
  h->decode(0).SetModel({.weights_fingerprint = "ffffffffffffffff"});
  ASSERT_TRUE(PollUntil(*h, [&](WorkerRegistry& r) {
    return !Routable(r, WorkerRole::kDecode, h->decode_address(0));
  }));
  const Result r = h->Run(TokenRequest({1, 5, 6}, 2));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(r.status.error_message(),
              HasSubstr("out of the pool: it has weights fingerprint ffffffffffffffff, the pool "
                        "has 00000000000fa4e1"));
  EXPECT_EQ(h->decode(0).requests().size(), 0u);
}

// With no wait allowed (--queue_timeout 0), all full is refused at once;
// admission_test.cc has the wait.
TEST(RouterServiceTest, FullDecodeWorkerIsReplacedAndAllFullIsResourceExhausted) {
  HarnessOptions options{.prefill = 1, .decode = 2};
  options.router.queue_timeout = absl::ZeroDuration();
  auto h = StartHarness(std::move(options));
  ASSERT_NE(h, nullptr);
  const int full = h->FirstDecode();
  h->decode(full).SetBehaviour({.refuse = absl::ResourceExhaustedError("KV cache full")});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 3));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.finished.decode_worker(), h->decode_address(1 - full));

  h->decode(1 - full).SetBehaviour({.refuse = absl::ResourceExhaustedError("KV cache full")});
  const Result both = h->Run(TokenRequest({1, 5, 6}, 3));
  EXPECT_EQ(both.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(both.status.error_message(), HasSubstr("KV cache full"));
}

// The KV transfer fails before any token (the prefill worker was lost while
// sending): the request starts over on the other prefill worker, and the
// client sees nothing of it.
TEST(RouterServiceTest, FailedKvTransferIsRecomputedOnAnotherPrefillWorker) {
  auto h = StartHarness({.prefill = 2, .decode = 1});
  ASSERT_NE(h, nullptr);
  const int first = h->FirstPrefill();
  h->prefill(first).SetBehaviour({.hold = true});
  h->decode(0).SetBehaviour({.fail_transfers = 1});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 4));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens.size(), 4u);
  EXPECT_EQ(r.finished.prefill_worker(), h->prefill_address(1 - first));
  EXPECT_EQ(h->decode(0).requests().size(), 2u);
  EXPECT_TRUE(WaitForRouterIdle(*h));
  // The first prefill, for a reservation that is gone, was cancelled: the
  // worker saw it cancelled, or never saw it.
  testing::FakePrefillWorker& held = h->prefill(first);
  const absl::Time deadline = absl::Now() + kWait;
  while (held.cancelled() != static_cast<int>(held.requests().size()) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(held.cancelled(), static_cast<int>(held.requests().size()));
}

// A chunk that arrives corrupted (its checksum does not match, DATA_LOSS)
// fails the transfer the same way: the prompt is computed again elsewhere.
TEST(RouterServiceTest, CorruptedKvTransferIsRecomputedOnAnotherPrefillWorker) {
  auto h = StartHarness({.prefill = 2, .decode = 1});
  ASSERT_NE(h, nullptr);
  const int first = h->FirstPrefill();
  h->prefill(first).SetBehaviour({.hold = true});
  h->decode(0).SetBehaviour({.fail_transfers = 1, .transfer_failure = grpc::StatusCode::DATA_LOSS});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 4));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens.size(), 4u);
  EXPECT_EQ(r.finished.prefill_worker(), h->prefill_address(1 - first));
  EXPECT_TRUE(WaitForRouterIdle(*h));
}

// Real timers run these; the held worker never answers, so the timeout
// always passes, and the healthy worker has a whole second to answer.
constexpr absl::Duration kShortTimeout = absl::Seconds(1);

TEST(RouterServiceTest, HungReservationIsCancelledAndServedByTheOtherDecodeWorker) {
  HarnessOptions options{.prefill = 1, .decode = 2};
  options.router.driver.reserve_timeout = kShortTimeout;
  auto h = StartHarness(std::move(options));
  ASSERT_NE(h, nullptr);
  const int hung = h->FirstDecode();
  h->decode(hung).SetBehaviour({.hold_reservation = true});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 4));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens.size(), 4u);
  EXPECT_EQ(r.finished.decode_worker(), h->decode_address(1 - hung));
  // Asked once, and its reservation cancelled: nothing leaks when it wakes.
  EXPECT_EQ(h->decode(hung).requests().size(), 1u);
  EXPECT_TRUE(h->decode(hung).WaitForCancelled(1, kWait));
  EXPECT_TRUE(h->decode(hung).WaitForNoStreams(kWait));
  EXPECT_TRUE(WaitForRouterIdle(*h));
  EXPECT_TRUE(h->decode(1 - hung).WaitForNoStreams(kWait));
}

TEST(RouterServiceTest, HungReservationOnTheOnlyDecodeWorkerIsUnavailableWithoutRetryLoop) {
  HarnessOptions options{.prefill = 1, .decode = 1};
  options.router.driver.reserve_timeout = kShortTimeout;
  auto h = StartHarness(std::move(options));
  ASSERT_NE(h, nullptr);
  h->decode(0).SetBehaviour({.hold_reservation = true});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(r.status.error_message(), ::testing::HasSubstr(h->decode_address(0)));
  EXPECT_THAT(r.status.error_message(), ::testing::HasSubstr("--reserve_timeout"));
  EXPECT_EQ(h->decode(0).requests().size(), 1u);
  EXPECT_TRUE(h->decode(0).WaitForCancelled(1, kWait));
  EXPECT_TRUE(h->decode(0).WaitForNoStreams(kWait));
  EXPECT_TRUE(WaitForRouterIdle(*h));
}

TEST(RouterServiceTest, HungPrefillIsAbandonedAndRetriedOnTheOtherPrefillWorker) {
  HarnessOptions options{.prefill = 2, .decode = 1};
  options.router.driver.prefill_answer_timeout = kShortTimeout;
  auto h = StartHarness(std::move(options));
  ASSERT_NE(h, nullptr);
  const int hung = h->FirstPrefill();
  h->prefill(hung).SetBehaviour({.hold = true});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 4));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens.size(), 4u);
  EXPECT_EQ(r.finished.prefill_worker(), h->prefill_address(1 - hung));
  EXPECT_TRUE(r.finished.disaggregated());
  EXPECT_EQ(h->prefill(hung).requests().size(), 1u);
  EXPECT_TRUE(h->prefill(hung).WaitForCancelled(1, kWait));
  // The reservation made for the abandoned prefill was cancelled; the
  // retry reserved again.
  EXPECT_EQ(h->decode(0).requests().size(), 2u);
  EXPECT_TRUE(h->decode(0).WaitForCancelled(1, kWait));
  EXPECT_TRUE(WaitForRouterIdle(*h));
  EXPECT_TRUE(h->decode(0).WaitForNoStreams(kWait));
}

TEST(RouterServiceTest, HungOnlyPrefillWorkerLeavesThePromptToTheDecodeWorker) {
  HarnessOptions options{.prefill = 1, .decode = 1};
  options.router.driver.prefill_answer_timeout = kShortTimeout;
  auto h = StartHarness(std::move(options));
  ASSERT_NE(h, nullptr);
  h->prefill(0).SetBehaviour({.hold = true});
  const Result r = h->Run(TokenRequest({1, 5, 6}, 4));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_FALSE(r.finished.disaggregated());
  EXPECT_EQ(h->prefill(0).requests().size(), 1u);
  EXPECT_TRUE(h->prefill(0).WaitForCancelled(1, kWait));
  EXPECT_TRUE(WaitForRouterIdle(*h));
  EXPECT_TRUE(h->decode(0).WaitForNoStreams(kWait));
}

TEST(RouterServiceTest, PrefillAnswerBudgetGrowsWithThePromptAndTheRequestsAhead) {
  const absl::Duration unit = absl::Seconds(2);
  EXPECT_EQ(PrefillAnswerBudget(unit, 3, 0), absl::Seconds(2));
  EXPECT_EQ(PrefillAnswerBudget(unit, 1024, 0), absl::Seconds(2));
  EXPECT_EQ(PrefillAnswerBudget(unit, 1025, 0), absl::Seconds(4));
  EXPECT_EQ(PrefillAnswerBudget(unit, 8000, 0), absl::Seconds(16));
  EXPECT_EQ(PrefillAnswerBudget(unit, 100, 3), absl::Seconds(8));
}
}  // namespace
}  // namespace tandem::router::testing
