// The decode core driven directly, without DecodeLoop's thread or inbox:
// every call and every round on the test's thread, deadlines on a fake
// clock. What a simulator does with it.
#include "decode_worker/decode_core.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/model/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/inproc_transport.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/decode_worker/decode_test_util.h"
#include "tests/unit/decode_worker/recording_sink.h"

namespace tandem::decode::testing {
namespace {

using ::tandem::testing::StatusIs;

// Bounds every drive loop: far more rounds than any request here needs.
constexpr int kMaxRounds = 2000;

class CoreHarness {
 public:
  explicit CoreHarness(DecodeLoopOptions options = {}) {
    weights_ = MakeSyntheticModel(SmallShape(), /*seed=*/7).value();
    fabric_ = kvtransfer::InProcFabric::Create();
    transport_ = kvtransfer::InProcTransport::Create(fabric_);
    options.clock = &clock_;
    options.own_thread = false;
    options.kv_blocks = 24;
    auto core = DecodeCore::Create(*weights_, OneThreadBackend(), transport_.get(), options,
                                   [this](int n) { released_ += n; });
    CHECK_OK(core.status());
    core_ = std::move(core).value();
    prefill_ = std::make_unique<FakePrefill>(*weights_, fabric_);
    reference_ = MakeEngine(*weights_, EngineOptions{.num_blocks = 16, .max_batch_tokens = 128});
  }
  ~CoreHarness() { core_.reset(); }

  DecodeCore& core() { return *core_; }
  FakePrefill& prefill() { return *prefill_; }
  FakeClock& clock() { return clock_; }
  int released() const { return released_; }

  void Submit(Request r, std::shared_ptr<RecordingSink> sink) {
    core_->Submit(Submission{next_ticket_++, std::move(r), std::move(sink), clock_.Now()});
  }
  // Runs rounds until every sink has heard its end; false if they did not
  // within kMaxRounds.
  bool RunUntilEnded(const std::vector<std::shared_ptr<RecordingSink>>& sinks) {
    for (int round = 0; round < kMaxRounds; ++round) {
      bool all = true;
      for (const auto& s : sinks) all = all && s->WaitEnded(absl::ZeroDuration());
      if (all) return true;
      core_->RunRound();
    }
    return false;
  }
  bool AllBlocksFree() const {
    const LoopStats s = core_->Snapshot();
    return s.kv_blocks_free == s.kv_blocks_total && s.running == 0 && s.waiting == 0;
  }
  std::vector<int32_t> Expected(const Request& r) { return EngineTokens(*reference_, r); }

 private:
  // Starts at the real time: the stand-in prefill worker's sender reads the
  // lease's deadline on the real clock.
  FakeClock clock_{absl::Now()};
  std::unique_ptr<ModelWeights> weights_;
  std::shared_ptr<kvtransfer::InProcFabric> fabric_;
  std::unique_ptr<kvtransfer::KvTransport> transport_;
  std::unique_ptr<DecodeCore> core_;
  std::unique_ptr<FakePrefill> prefill_;
  std::unique_ptr<Engine> reference_;
  Ticket next_ticket_ = 1;
  int released_ = 0;
};

TEST(DecodeCore, LocalRequestsRunInTheCallersThreadWithTheEngineTokens) {
  CoreHarness h;
  std::vector<Request> requests = {LocalRequest("a", RandomTokens(20, kVocab, 1), 12),
                                   LocalRequest("b", RandomTokens(37, kVocab, 2), 9),
                                   LocalRequest("c", RandomTokens(5, kVocab, 3), 15)};
  requests[2].sampling.temperature = 0.8f;
  requests[2].sampling.seed = 11;
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (const Request& r : requests) {
    sinks.push_back(std::make_shared<RecordingSink>());
    h.Submit(r, sinks.back());
  }
  ASSERT_TRUE(h.RunUntilEnded(sinks));
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_OK(sinks[i]->status());
    EXPECT_EQ(sinks[i]->tokens(), h.Expected(requests[i])) << requests[i].request_id;
  }
  EXPECT_EQ(h.released(), 3);
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeCore, ARemotePrefillCompletesWhenTheTestThreadDrivesBothSides) {
  CoreHarness h;
  const Request r = RemoteRequest("remote", RandomTokens(40, kVocab, 4), 10);
  auto sink = std::make_shared<RecordingSink>();
  h.Submit(r, sink);
  h.core().RunRound();  // Admits it: the lease is issued and reserved.
  ASSERT_EQ(sink->reserved_count(), 1);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FakePrefill::Sent> sent,
                       h.prefill().Send(r.prompt, sink->descriptor(), -1, r.sampling, 1, {}));
  // The receiver acknowledges inside the core's rounds.
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> first,
                       h.prefill().Finish(*sent, [&] { h.core().RunRound(); }));
  absl::Status started = absl::UnknownError("no answer");
  h.core().Start(StartCommand{.request_id = r.request_id,
                              .generation = sink->generation(),
                              .first_tokens = first,
                              .done = [&](absl::Status s) { started = s; },
                              .received = h.clock().Now()});
  ASSERT_OK(started);  // The KV was in: committed at once.
  ASSERT_TRUE(h.RunUntilEnded({sink}));
  ASSERT_OK(sink->status());
  std::vector<int32_t> got = sink->tokens();
  got.insert(got.begin(), first[0]);
  EXPECT_EQ(got, h.Expected(r));
  EXPECT_EQ(h.released(), 1);
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeCore, DeadlinesFollowTheFakeClock) {
  CoreHarness h;
  Request r = LocalRequest("late", RandomTokens(10, kVocab, 5), 100);
  r.deadline = h.clock().Now() + absl::Seconds(1);
  auto sink = std::make_shared<RecordingSink>();
  h.Submit(r, sink);
  for (int i = 0; i < 3; ++i) h.core().RunRound();
  ASSERT_FALSE(sink->WaitEnded(absl::ZeroDuration()));
  h.clock().Advance(absl::Seconds(2));
  h.core().RunRound();
  ASSERT_TRUE(sink->WaitEnded(absl::ZeroDuration()));
  EXPECT_THAT(sink->status(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(h.released(), 1);
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeCore, AnUnfundedReservationExpiresOnTheFakeClock) {
  DecodeLoopOptions options;
  options.kv_timeout = absl::Seconds(5);
  CoreHarness h(options);
  auto sink = std::make_shared<RecordingSink>();
  h.Submit(RemoteRequest("never-sent", RandomTokens(30, kVocab, 6), 4), sink);
  h.core().RunRound();
  ASSERT_EQ(sink->reserved_count(), 1);
  h.clock().Advance(absl::Seconds(6));
  ASSERT_TRUE(h.RunUntilEnded({sink}));
  EXPECT_THAT(sink->status(), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(h.released(), 1);
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeCore, RefusalsAtEnqueueGoThroughTheSinkAndReleaseTheRequest) {
  CoreHarness h;
  auto first = std::make_shared<RecordingSink>();
  auto twin = std::make_shared<RecordingSink>();
  auto huge = std::make_shared<RecordingSink>();
  h.Submit(LocalRequest("dup", RandomTokens(8, kVocab, 7), 4), first);
  h.Submit(LocalRequest("dup", RandomTokens(8, kVocab, 8), 4), twin);
  Request big = LocalRequest("big", RandomTokens(8, kVocab, 9), 120);
  big.n = 4;  // 4 choices of 128 tokens: 32 blocks, more than the pool's 24.
  h.Submit(big, huge);
  EXPECT_THAT(twin->status(), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(huge->status(), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(h.released(), 1 + 4);
  ASSERT_TRUE(h.RunUntilEnded({first}));
  ASSERT_OK(first->status());
  EXPECT_EQ(h.released(), 1 + 4 + 1);
  EXPECT_EQ(h.core().Snapshot().requests_failed, 2u);
}

// A draining core offers each movable request once (OnMoving), when each of
// its choices has a token, after the tokens it already sent; the request
// runs on until the caller cancels it (it moved). Others are not offered.
TEST(DecodeCore, DrainingOffersMovableRequestsOnceTheyHaveTokens) {
  CoreHarness h;
  Request movable = LocalRequest("movable", RandomTokens(12, kVocab, 12), 60);
  movable.movable = true;
  movable.n = 2;
  Request fixed = LocalRequest("fixed", RandomTokens(9, kVocab, 13), 20);
  Request waiting = RemoteRequest("waiting", RandomTokens(20, kVocab, 14), 5);
  waiting.movable = true;
  auto movable_sink = std::make_shared<RecordingSink>();
  auto fixed_sink = std::make_shared<RecordingSink>();
  auto waiting_sink = std::make_shared<RecordingSink>();
  h.Submit(movable, movable_sink);  // ticket 1
  h.Submit(fixed, fixed_sink);      // ticket 2
  h.Submit(waiting, waiting_sink);  // ticket 3: reserved, no token yet
  h.core().RunRound();
  h.core().RunRound();
  ASSERT_FALSE(movable_sink->tokens(0).empty());
  EXPECT_EQ(movable_sink->moving_count(), 0);  // Not draining yet.

  h.core().Drain();
  h.core().RunRound();
  EXPECT_EQ(movable_sink->moving_count(), 1);
  EXPECT_FALSE(movable_sink->ships_kv());  // Two choices, and no sender.
  EXPECT_EQ(fixed_sink->moving_count(), 0);
  EXPECT_EQ(waiting_sink->moving_count(), 0);
  // Every choice had its token before the offer, and nothing came after it
  // in that round.
  EXPECT_FALSE(movable_sink->tokens_at_moving(0).empty());
  EXPECT_FALSE(movable_sink->tokens_at_moving(1).empty());
  EXPECT_EQ(movable_sink->tokens_at_moving(0), movable_sink->tokens(0));

  // It runs on, offered once.
  for (int i = 0; i < 3; ++i) h.core().RunRound();
  EXPECT_GT(movable_sink->tokens(0).size(), movable_sink->tokens_at_moving(0).size());
  EXPECT_EQ(movable_sink->moving_count(), 1);
  h.core().Cancel(1);
  h.core().Cancel(3);
  ASSERT_TRUE(h.RunUntilEnded({movable_sink, fixed_sink, waiting_sink}));
  EXPECT_THAT(movable_sink->status(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_THAT(waiting_sink->status(), StatusIs(absl::StatusCode::kCancelled));
  ASSERT_OK(fixed_sink->status());
  EXPECT_EQ(fixed_sink->tokens(), h.Expected(fixed));
  EXPECT_EQ(movable_sink->events_after_end(), 0);
  EXPECT_EQ(h.released(), 2 + 1 + 1);
  EXPECT_TRUE(h.AllBlocksFree());
}

TEST(DecodeCore, ShutdownEndsEverythingHeldAndFreesItsBlocks) {
  CoreHarness h;
  auto local = std::make_shared<RecordingSink>();
  auto remote = std::make_shared<RecordingSink>();
  h.Submit(LocalRequest("running", RandomTokens(12, kVocab, 10), 50), local);
  h.Submit(RemoteRequest("reserved", RandomTokens(20, kVocab, 11), 5), remote);
  h.core().RunRound();
  h.core().Shutdown(absl::UnavailableError("going away"));
  EXPECT_THAT(local->status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(remote->status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(h.released(), 2);
  EXPECT_TRUE(h.AllBlocksFree());
}

}  // namespace
}  // namespace tandem::decode::testing
