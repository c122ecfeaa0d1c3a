// A planned move between two decode cores on one in-process fabric: the
// draining one offers its stream, the other reserves a resume of it, the
// first ships the stream's K/V into that lease (Handoff), and the stream
// goes on there with exactly the tokens of a run that never moved. Every
// round on the test's thread; deadlines on a fake clock.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "common/model/synthetic.h"
#include "decode_worker/decode_core.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvtransfer/inproc_transport.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/decode_worker/decode_test_util.h"
#include "tests/unit/decode_worker/recording_sink.h"

namespace tandem::decode::testing {
namespace {

using ::tandem::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int kMaxRounds = 2000;

struct HandoffAnswer {
  std::optional<absl::StatusOr<HandoffResult>> result;
  HandoffDoneFn Callback() {
    return [this](absl::StatusOr<HandoffResult> r) { result = std::move(r); };
  }
};

class TwoCores {
 public:
  // `ship`: the draining core has a handoff transport.
  explicit TwoCores(bool ship = true) {
    weights_ = MakeSyntheticModel(SmallShape(), /*seed=*/7).value();
    fabric_ = kvtransfer::InProcFabric::Create();
    for (int i = 0; i < 2; ++i) {
      transports_[i] = kvtransfer::InProcTransport::Create(fabric_);
      DecodeLoopOptions options;
      options.clock = &clock_;
      options.own_thread = false;
      options.kv_blocks = 24;
      if (i == 0 && ship) {
        handoff_transport_ = kvtransfer::InProcTransport::Create(fabric_);
        options.handoff_transport = handoff_transport_.get();
      }
      auto core = DecodeCore::Create(*weights_, OneThreadBackend(), transports_[i].get(), options,
                                     [](int) {});
      CHECK_OK(core.status());
      cores_[i] = std::move(core).value();
    }
    reference_ = MakeEngine(*weights_, EngineOptions{.num_blocks = 16, .max_batch_tokens = 128});
  }
  ~TwoCores() {
    for (auto& core : cores_) core.reset();
  }

  DecodeCore& from() { return *cores_[0]; }
  DecodeCore& to() { return *cores_[1]; }
  void Submit(DecodeCore& core, Request r, std::shared_ptr<RecordingSink> sink) {
    core.Submit(Submission{next_ticket_++, std::move(r), std::move(sink), clock_.Now()});
  }
  void Round() {
    cores_[0]->RunRound();
    cores_[1]->RunRound();
  }
  // Rounds until `done` holds; false if it did not within kMaxRounds.
  template <typename Done>
  bool RunUntil(Done done) {
    for (int i = 0; i < kMaxRounds; ++i) {
      if (done()) return true;
      Round();
    }
    return done();
  }
  bool AllBlocksFree(DecodeCore& core) const {
    const LoopStats s = core.Snapshot();
    return s.kv_blocks_free == s.kv_blocks_total && s.running == 0 && s.waiting == 0;
  }
  std::vector<int32_t> Expected(const Request& r) { return EngineTokens(*reference_, r); }
  Ticket last_ticket() const { return next_ticket_ - 1; }

  // The other core reserves "stream.1", `stream` resumed from `have`
  // without local prefill; null if no reservation came.
  std::shared_ptr<RecordingSink> ReserveResume(Request stream, const std::vector<int32_t>& have) {
    stream.request_id = "stream.1";
    stream.local_prefill = false;
    stream.resume = {{.tokens = have}};
    auto sink = std::make_shared<RecordingSink>();
    Submit(to(), std::move(stream), sink);
    return RunUntil([&] { return sink->reserved_count() > 0; }) ? sink : nullptr;
  }
  // The draining core ships "stream" into `sink`'s lease.
  void Handoff(const RecordingSink& sink, const std::vector<int32_t>& have, HandoffAnswer& answer) {
    from().Handoff(HandoffCommand{.request_id = "stream",
                                  .kv_descriptor = sink.descriptor(),
                                  .tokens = have,
                                  .done = answer.Callback()});
  }

 private:
  FakeClock clock_{absl::Now()};
  std::unique_ptr<ModelWeights> weights_;
  std::shared_ptr<kvtransfer::InProcFabric> fabric_;
  std::unique_ptr<kvtransfer::KvTransport> transports_[2];
  std::unique_ptr<kvtransfer::KvTransport> handoff_transport_;
  std::unique_ptr<DecodeCore> cores_[2];
  std::unique_ptr<Engine> reference_;
  Ticket next_ticket_ = 1;
};

// A greedy or seeded-sampled stream, offered by a draining core.
Request Stream(bool sampled) {
  Request r = LocalRequest("stream", RandomTokens(23, kVocab, 41), 60);
  r.movable = true;
  if (sampled) {
    r.sampling =
        SamplingParams{.temperature = 0.9f, .top_p = 0.95f, .seed = 5, .frequency_penalty = 0.4f};
  }
  return r;
}

class DecodeHandoff : public ::testing::TestWithParam<bool> {};

TEST_P(DecodeHandoff, TheStreamContinuesOnTheOtherCoreAsIfItNeverMoved) {
  TwoCores h;
  const Request stream = Stream(GetParam());
  const std::vector<int32_t> want = h.Expected(stream);
  ASSERT_EQ(want.size(), 60u);
  auto old_sink = std::make_shared<RecordingSink>();
  h.Submit(h.from(), stream, old_sink);
  const Ticket old_ticket = h.last_ticket();
  ASSERT_TRUE(h.RunUntil([&] { return old_sink->tokens().size() >= 20; }));
  h.from().Drain();
  ASSERT_TRUE(h.RunUntil([&] { return old_sink->moving_count() > 0; }));
  const std::vector<int32_t> have = old_sink->tokens_at_moving();
  EXPECT_TRUE(old_sink->ships_kv());

  // The new worker reserves the resume: the prompt and `have` but its last.
  const std::shared_ptr<RecordingSink> new_sink = h.ReserveResume(stream, have);
  ASSERT_NE(new_sink, nullptr);
  HandoffAnswer answer;
  h.Handoff(*new_sink, have, answer);
  ASSERT_TRUE(h.RunUntil([&] { return answer.result.has_value(); }));
  ASSERT_OK(answer.result->status());
  EXPECT_GT((*answer.result)->kv_bytes, 0u);
  // Out of the old core's batch: nothing more comes there.
  const size_t old_tokens = old_sink->tokens().size();
  for (int i = 0; i < 3; ++i) h.Round();
  EXPECT_EQ(old_sink->tokens().size(), old_tokens);

  std::optional<absl::Status> started;
  h.to().Start(StartCommand{.request_id = "stream.1",
                            .generation = new_sink->generation(),
                            .first_tokens = {have.back()},
                            .done = [&](absl::Status s) { started = s; }});
  ASSERT_TRUE(h.RunUntil([&] { return new_sink->WaitEnded(absl::ZeroDuration()); }));
  ASSERT_TRUE(started.has_value());
  ASSERT_OK(*started);
  ASSERT_OK(new_sink->status());
  EXPECT_EQ(new_sink->tokens(), std::vector<int32_t>(want.begin() + have.size(), want.end()));
  EXPECT_EQ(new_sink->finished(0)->completion_tokens, 60);

  // The router cancels the moved stream: its blocks go.
  h.from().Cancel(old_ticket);
  ASSERT_TRUE(h.RunUntil([&] { return old_sink->WaitEnded(absl::ZeroDuration()); }));
  EXPECT_THAT(old_sink->status(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_TRUE(h.AllBlocksFree(h.from()));
  EXPECT_TRUE(h.AllBlocksFree(h.to()));
}

INSTANTIATE_TEST_SUITE_P(GreedyAndSampled, DecodeHandoff, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Sampled" : "Greedy";
                         });

// What a handoff refuses; the stream decodes on in every case.
TEST(DecodeHandoffRefusals, SayWhyAndLeaveTheStreamDecoding) {
  TwoCores h;
  auto sink = std::make_shared<RecordingSink>();
  h.Submit(h.from(), Stream(false), sink);
  ASSERT_TRUE(h.RunUntil([&] { return sink->tokens().size() >= 5; }));
  const std::vector<int32_t> have = sink->tokens();
  struct Case {
    std::string request_id;
    std::vector<int32_t> tokens;
    absl::StatusCode code;
    const char* message;
  };
  std::vector<int32_t> wrong = have;
  wrong[2] = (wrong[2] + 1) % kVocab;
  const std::vector<int32_t> too_many(have.size() + 40, have[0]);
  const std::vector<Case> cases = {
      {"nobody", have, absl::StatusCode::kNotFound, "not held here"},
      {"stream", wrong, absl::StatusCode::kInvalidArgument, "but the stream's is"},
      {"stream", too_many, absl::StatusCode::kInvalidArgument, "names"},
      {"stream", {}, absl::StatusCode::kInvalidArgument, "names 0 tokens"},
  };
  for (const Case& c : cases) {
    HandoffAnswer answer;
    h.from().Handoff(HandoffCommand{.request_id = c.request_id,
                                    .kv_descriptor = "not a lease",
                                    .tokens = c.tokens,
                                    .done = answer.Callback()});
    ASSERT_TRUE(answer.result.has_value());
    EXPECT_THAT(answer.result->status(), StatusIs(c.code, HasSubstr(c.message))) << c.message;
  }
  HandoffAnswer bad_lease;
  h.from().Handoff(HandoffCommand{.request_id = "stream",
                                  .kv_descriptor = "not a lease",
                                  .tokens = have,
                                  .done = bad_lease.Callback()});
  EXPECT_THAT(bad_lease.result->status(), StatusIs(absl::StatusCode::kInvalidArgument));
  const size_t before = sink->tokens().size();
  h.Round();
  EXPECT_GT(sink->tokens().size(), before);
}

TEST(DecodeHandoffRefusals, AWorkerWithoutAHandoffTransportShipsNothing) {
  TwoCores h(/*ship=*/false);
  auto sink = std::make_shared<RecordingSink>();
  h.Submit(h.from(), Stream(false), sink);
  ASSERT_TRUE(h.RunUntil([&] { return sink->tokens().size() >= 3; }));
  HandoffAnswer answer;
  h.from().Handoff(HandoffCommand{.request_id = "stream",
                                  .kv_descriptor = "",
                                  .tokens = sink->tokens(),
                                  .done = answer.Callback()});
  ASSERT_TRUE(answer.result.has_value());
  EXPECT_THAT(answer.result->status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("recompute")));
}

// The caller cancelling while the K/V ships (its client went away): the
// blocks go once the send has ended, never under it.
TEST(DecodeHandoff, ACancelWhileShippingFreesTheBlocksAfterTheSend) {
  TwoCores h;
  auto old_sink = std::make_shared<RecordingSink>();
  h.Submit(h.from(), Stream(false), old_sink);
  const Ticket old_ticket = h.last_ticket();
  ASSERT_TRUE(h.RunUntil([&] { return old_sink->tokens().size() >= 10; }));
  const std::vector<int32_t> have = old_sink->tokens();
  const std::shared_ptr<RecordingSink> new_sink = h.ReserveResume(Stream(false), have);
  ASSERT_NE(new_sink, nullptr);
  const Ticket new_ticket = h.last_ticket();
  HandoffAnswer answer;
  h.Handoff(*new_sink, have, answer);
  h.from().Cancel(old_ticket);  // Before a round moved a byte.
  // The caller hears at once, not when the send gives up.
  ASSERT_TRUE(answer.result.has_value());
  EXPECT_THAT(answer.result->status(), StatusIs(absl::StatusCode::kCancelled));
  h.to().Cancel(new_ticket);
  ASSERT_TRUE(h.RunUntil([&] { return answer.result.has_value(); }));
  EXPECT_FALSE(answer.result->ok());
  ASSERT_TRUE(h.RunUntil([&] { return h.AllBlocksFree(h.from()) && h.AllBlocksFree(h.to()); }));
}

}  // namespace
}  // namespace tandem::decode::testing
