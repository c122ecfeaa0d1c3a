// The decode loop receives KV while an engine step runs: a lease whose KV
// arrives mid-step completes inside that step and its sequence joins the
// very next one.
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/decode_worker/decode_test_util.h"
#include "tests/unit/decode_worker/step_gate.h"

namespace tandem::decode::testing {
namespace {

// More layers than SmallShape, so that a transfer that lands inside a step
// (it takes a few receiver polls) surely ends before the step's last layer.
ModelConfig SixLayers() {
  ModelConfig shape = SmallShape();
  shape.n_layers = 6;
  return shape;
}

class ReceiveDuringStepTest : public ::testing::Test {
 protected:
  ReceiveDuringStepTest() {
    auto gated = std::make_unique<GatedBackend>(OneThreadBackend(), &log_);
    gate_ = gated.get();
    HarnessSetup setup;
    setup.shape = SixLayers();
    setup.backend = std::move(gated);
    setup.wrap_transport = [this](std::unique_ptr<kvtransfer::KvTransport> inner) {
      return std::make_unique<AckLoggingTransport>(std::move(inner), &log_);
    };
    h_ = std::make_unique<DecodeHarness>(DecodeLoopOptions{}, kvtransfer::FaultPlan{},
                                         std::move(setup));
  }
  ~ReceiveDuringStepTest() override {
    gate_->Disarm();
    h_.reset();
  }

  StepLog log_;
  GatedBackend* gate_ = nullptr;  // Owned by the loop.
  std::unique_ptr<DecodeHarness> h_;
};

// Regression: the loop polled the receiver only between steps, so KV that
// arrived during a step landed over the following rounds and a request's
// first decode waited a whole extra step behind the running batch.
TEST_F(ReceiveDuringStepTest, KvArrivingMidStepCompletesInThatStepAndJoinsTheNext) {
  const int layers = SixLayers().n_layers;
  // B: a remote prefill, reserved, its KV not sent yet.
  const Request b = RemoteRequest("b", RandomTokens(20, SmallShape().vocab_size, 1), 6);
  auto b_sink = NewSink();
  ASSERT_OK(h_->loop().Submit(b, b_sink).status());
  ASSERT_TRUE(b_sink->WaitReserved());

  // A: a local request that keeps a batch running; every step from now on
  // waits for the test.
  gate_->Arm();
  const int base = gate_->started();
  const Request a = LocalRequest("a", RandomTokens(8, SmallShape().vocab_size, 2), 12);
  auto a_sink = NewSink();
  ASSERT_OK(h_->loop().Submit(a, a_sink).status());
  ASSERT_TRUE(gate_->WaitHeld(base + 1, kWait));  // A's prefill.
  gate_->Allow();
  ASSERT_TRUE(gate_->WaitHeld(base + 2, kWait));  // A's first decode: step S.

  // While S is under way, B's prefill ships its KV and B's Start comes in.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FakePrefill::Sent> sent,
                       h_->prefill().Send(b.prompt, b_sink->descriptor(), -1, b.sampling, 1, {}));
  ASSERT_OK(sent->first_tokens.status());
  const int32_t b_first = (*sent->first_tokens)[0];
  StartResult start;
  h_->loop().Start("b", b_sink->generation(), b_first, start.Callback());
  gate_->Allow();
  ASSERT_TRUE(gate_->WaitHeld(base + 3, kWait));  // Held at the start of S + 1.

  // The receiver acknowledged the whole transfer before S wrote its last
  // layer, i.e. before S returned.
  const std::vector<StepLog::Entry> entries = log_.entries();
  int steps = 0, last_layer_of_s = -1, ack = -1;
  for (int i = 0; i < static_cast<int>(entries.size()); ++i) {
    const StepLog::Entry& e = entries[i];
    if (e.kind == StepLog::Kind::kStep) ++steps;
    if (steps != base + 2) continue;
    if (e.kind == StepLog::Kind::kAck && ack < 0) ack = i;
    if (e.kind == StepLog::Kind::kKv && e.value == layers - 1) last_layer_of_s = i;
  }
  ASSERT_GE(last_layer_of_s, 0);
  EXPECT_GE(ack, 0) << "no completion acknowledgement went out during step S";
  EXPECT_LT(ack, last_layer_of_s);
  // The sender already has it, with the decode loop held.
  EXPECT_TRUE(h_->prefill().PollEnded(*sent, 10));
  // B was committed right after S (its Start answered) and steps in S + 1
  // with A: two rows.
  EXPECT_TRUE(start.answered());
  EXPECT_EQ(log_.step_rows().back(), 2);

  gate_->Disarm();
  gate_->Allow();
  ASSERT_OK(start.Wait());
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> b_first_tokens, h_->prefill().Finish(*sent));
  ASSERT_TRUE(b_sink->WaitEnded());
  ASSERT_TRUE(a_sink->WaitEnded());
  ASSERT_OK(b_sink->status());
  ASSERT_OK(a_sink->status());
  std::vector<int32_t> b_tokens = {b_first};
  for (int32_t t : b_sink->tokens()) b_tokens.push_back(t);
  EXPECT_EQ(b_tokens, h_->Expected(b));
  EXPECT_EQ(a_sink->tokens(), h_->Expected(a));
  EXPECT_TRUE(h_->AllBlocksFree());
}

// A lease that fails mid-step (its sender aborts) is handled after the
// step: the request fails, the running batch goes on, no block leaks.
TEST_F(ReceiveDuringStepTest, LeaseFailingMidStepEndsTheRequestAfterTheStep) {
  const Request b = RemoteRequest("b", RandomTokens(20, SmallShape().vocab_size, 3), 6);
  auto b_sink = NewSink();
  ASSERT_OK(h_->loop().Submit(b, b_sink).status());
  ASSERT_TRUE(b_sink->WaitReserved());
  gate_->Arm();
  const int base = gate_->started();
  const Request a = LocalRequest("a", RandomTokens(8, SmallShape().vocab_size, 4), 10);
  auto a_sink = NewSink();
  ASSERT_OK(h_->loop().Submit(a, a_sink).status());
  ASSERT_TRUE(gate_->WaitHeld(base + 1, kWait));
  gate_->Allow();
  ASSERT_TRUE(gate_->WaitHeld(base + 2, kWait));
  // Two layers shipped, then the sender gives up.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<FakePrefill::Sent> sent,
                       h_->prefill().Send(b.prompt, b_sink->descriptor(), 1, b.sampling, 1, {}));
  gate_->Disarm();
  gate_->Allow();
  EXPECT_FALSE(h_->prefill().Finish(*sent).ok());
  ASSERT_TRUE(b_sink->WaitEnded());
  EXPECT_FALSE(b_sink->status().ok());
  ASSERT_TRUE(a_sink->WaitEnded());
  ASSERT_OK(a_sink->status());
  EXPECT_EQ(a_sink->tokens(), h_->Expected(a));
  EXPECT_TRUE(h_->AllBlocksFree());
}

}  // namespace
}  // namespace tandem::decode::testing
