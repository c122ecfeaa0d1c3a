// The router's admission queue: the bookkeeping alone, then through the
// gRPC front end with fake workers (a queued request starts when a slot
// frees, larger priority first; a full queue or a timed-out wait is
// RESOURCE_EXHAUSTED; a client that leaves the queue is gone at once), and
// the wait for a decode worker with room when every one refuses as full.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/base/executor.h"
#include "common/rpc/grpc_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/admission_queue.h"
#include "tests/unit/router/router_harness.h"

namespace tandem::router {
namespace {

using ::testing::ElementsAre;
using testing::HarnessOptions;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::Result;
using testing::RouterHarness;
using testing::TokenRequest;

constexpr absl::Duration kWait = absl::Seconds(10);
const absl::Time kT0 = absl::UnixEpoch() + absl::Hours(1);

TEST(AdmissionQueue, RunsUpToTheLimitThenQueuesLargerPriorityFirst) {
  AdmissionQueue q(/*max_running=*/2, /*max_queued=*/3, absl::Seconds(10));
  EXPECT_EQ(q.Arrive(1, 0, kT0), AdmissionQueue::Decision::kRun);
  EXPECT_EQ(q.Arrive(2, 0, kT0), AdmissionQueue::Decision::kRun);
  EXPECT_EQ(q.Arrive(3, 0, kT0), AdmissionQueue::Decision::kQueued);
  EXPECT_EQ(q.Arrive(4, 5, kT0), AdmissionQueue::Decision::kQueued);
  EXPECT_EQ(q.Arrive(5, 0, kT0), AdmissionQueue::Decision::kQueued);
  EXPECT_EQ(q.Arrive(6, 9, kT0), AdmissionQueue::Decision::kFull);
  EXPECT_EQ(q.running(), 2);
  EXPECT_EQ(q.queued(), 3);
  // Priority 5 first, then priority 0 in arrival order.
  EXPECT_EQ(q.Finish(), std::optional<uint64_t>(4));
  EXPECT_EQ(q.Finish(), std::optional<uint64_t>(3));
  EXPECT_EQ(q.Finish(), std::optional<uint64_t>(5));
  EXPECT_EQ(q.running(), 2);
  EXPECT_EQ(q.Finish(), std::nullopt);
  EXPECT_EQ(q.Finish(), std::nullopt);
  EXPECT_EQ(q.running(), 0);
  EXPECT_EQ(q.Arrive(7, -3, kT0), AdmissionQueue::Decision::kRun);
}

TEST(AdmissionQueue, WaitsExpireInOrderAndRemovedOnesAreGone) {
  AdmissionQueue q(1, 10, absl::Seconds(10));
  ASSERT_EQ(q.Arrive(1, 0, kT0), AdmissionQueue::Decision::kRun);
  ASSERT_EQ(q.Arrive(2, 0, kT0 + absl::Seconds(1)), AdmissionQueue::Decision::kQueued);
  ASSERT_EQ(q.Arrive(3, 7, kT0 + absl::Seconds(2)), AdmissionQueue::Decision::kQueued);
  ASSERT_EQ(q.Arrive(4, 0, kT0 + absl::Seconds(3)), AdmissionQueue::Decision::kQueued);
  EXPECT_EQ(q.next_expiry(), kT0 + absl::Seconds(11));
  EXPECT_THAT(q.Expire(kT0 + absl::Seconds(10)), IsEmpty());
  EXPECT_TRUE(q.Remove(3));
  EXPECT_FALSE(q.Remove(3));
  EXPECT_THAT(q.Expire(kT0 + absl::Seconds(12)), ElementsAre(2));
  EXPECT_EQ(q.queued(), 1);
  EXPECT_EQ(q.Finish(), std::optional<uint64_t>(4));
  EXPECT_EQ(q.next_expiry(), absl::InfiniteFuture());
}

TEST(AdmissionQueue, ZeroQueueRefusesAtOnceAboveTheLimit) {
  AdmissionQueue q(1, 0, absl::Seconds(10));
  EXPECT_EQ(q.Arrive(1, 0, kT0), AdmissionQueue::Decision::kRun);
  EXPECT_EQ(q.Arrive(2, 100, kT0), AdmissionQueue::Decision::kFull);
}

// A client stream that runs on its own thread (cancelled and joined when
// it goes).
struct Client {
  grpc::ClientContext ctx;
  Result result;
  std::thread thread;

  void Run(v1::Router::Stub& stub, v1::GenerateRequest request) {
    ctx.set_deadline(rpc::ToChrono(absl::Now() + absl::Seconds(60)));
    thread = std::thread([this, &stub, request] {
      auto reader = stub.Generate(&ctx, request);
      v1::GenerateResponse response;
      while (reader->Read(&response)) {
        result.tokens.insert(result.tokens.end(), response.token_ids().begin(),
                             response.token_ids().end());
      }
      result.status = reader->Finish();
    });
  }
  void Join() {
    if (thread.joinable()) thread.join();
  }
  ~Client() {
    ctx.TryCancel();
    Join();
  }
};

v1::GenerateRequest WithPriority(v1::GenerateRequest r, int priority) {
  r.set_priority(priority);
  return r;
}

bool WaitForQueued(RouterHarness& h, int n) {
  const absl::Time deadline = absl::Now() + kWait;
  while (h.core().queued() != n && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  return h.core().queued() == n;
}

class AdmissionTest : public ::testing::Test {
 protected:
  void Start(int max_queued, absl::Duration queue_timeout = absl::Seconds(30)) {
    HarnessOptions options{.prefill = 0, .decode = 1};
    options.router.max_inflight = 1;
    options.router.max_queued = max_queued;
    options.router.queue_timeout = queue_timeout;
    options.router.clock = &clock_;
    h_ = std::make_unique<RouterHarness>(options);
    ASSERT_TRUE(h_->Start().ok());
    // The first request holds the only slot until it is cancelled.
    h_->decode(0).SetBehaviour({.hold_after = 0});
    holder_.Run(h_->stub(), TokenRequest({1, 5, 6}, 100));
    // Admitted, and its decode call has reached the worker: the router
    // prepares and sends a request on its executor, after admission.
    const absl::Time deadline = absl::Now() + kWait;
    while ((h_->core().inflight() != 1 || h_->decode(0).requests().size() != 1) &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    ASSERT_EQ(h_->core().inflight(), 1);
    ASSERT_EQ(h_->decode(0).requests().size(), 1u);
  }
  void ReleaseHolder() {
    h_->decode(0).SetBehaviour({});
    holder_.ctx.TryCancel();
    holder_.Join();
  }
  FakeClock clock_;
  std::unique_ptr<RouterHarness> h_;
  Client holder_;
};

TEST_F(AdmissionTest, QueuedRequestsStartLargerPriorityFirstWhenASlotFrees) {
  Start(/*max_queued=*/4);
  Client low, high;
  low.Run(h_->stub(), WithPriority(TokenRequest({1, 7}, 3), 1));
  ASSERT_TRUE(WaitForQueued(*h_, 1));
  high.Run(h_->stub(), WithPriority(TokenRequest({1, 8}, 3), 50));
  ASSERT_TRUE(WaitForQueued(*h_, 2));
  ReleaseHolder();
  low.Join();
  high.Join();
  ASSERT_TRUE(low.result.status.ok()) << low.result.status.error_message();
  ASSERT_TRUE(high.result.status.ok()) << high.result.status.error_message();
  EXPECT_EQ(low.result.tokens.size(), 3u);
  // The decode worker saw the holder, then the priority-50 request.
  const std::vector<v1::DecodeRequest> seen = h_->decode(0).requests();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_THAT(seen[1].prompt(), ElementsAre(1, 8));
  EXPECT_THAT(seen[2].prompt(), ElementsAre(1, 7));
  EXPECT_EQ(h_->core().queued(), 0);
}

TEST_F(AdmissionTest, AFullQueueRefusesAtOnceNamingTheFlags) {
  Start(/*max_queued=*/1);
  Client waiting;
  waiting.Run(h_->stub(), TokenRequest({1, 7}, 2));
  ASSERT_TRUE(WaitForQueued(*h_, 1));
  const Result refused = h_->Run(TokenRequest({1, 8}, 2));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("--max_queued"));
  ReleaseHolder();
  waiting.Join();
  EXPECT_TRUE(waiting.result.status.ok()) << waiting.result.status.error_message();
}

TEST_F(AdmissionTest, AWaitLongerThanTheQueueTimeoutIsRefused) {
  Start(/*max_queued=*/4, absl::Seconds(5));
  Client waiting;
  waiting.Run(h_->stub(), TokenRequest({1, 7}, 2));
  ASSERT_TRUE(WaitForQueued(*h_, 1));
  clock_.Advance(absl::Seconds(4));
  h_->core().ExpireQueued();
  EXPECT_EQ(h_->core().queued(), 1);
  clock_.Advance(absl::Seconds(2));
  h_->core().ExpireQueued();
  waiting.Join();
  EXPECT_EQ(waiting.result.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(waiting.result.status.error_message(), HasSubstr("--queue_timeout"));
  EXPECT_EQ(h_->core().queued(), 0);
  ReleaseHolder();
  EXPECT_EQ(h_->decode(0).requests().size(), 1u);  // The expired one never ran.
}

TEST_F(AdmissionTest, AClientThatLeavesTheQueueIsGoneAtOnce) {
  Start(/*max_queued=*/4);
  Client waiting;
  waiting.Run(h_->stub(), TokenRequest({1, 7}, 2));
  ASSERT_TRUE(WaitForQueued(*h_, 1));
  waiting.ctx.TryCancel();
  waiting.Join();
  EXPECT_EQ(waiting.result.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitForQueued(*h_, 0));
  ReleaseHolder();
  EXPECT_TRUE(h_->core().WaitForIdle(kWait));
  EXPECT_EQ(h_->decode(0).requests().size(), 1u);
}

TEST_F(AdmissionTest, APriorityOutOfRangeIsRefusedNamingTheRange) {
  Start(/*max_queued=*/4);
  const Result r = h_->Run(WithPriority(TokenRequest({1, 7}, 2), 5000));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(r.status.error_message(), HasSubstr("-1000 to 1000"));
}

// Every decode worker refuses as full: an admitted request waits for room
// (woken by the retry timer, on the router's clock), is served once a worker
// has room, and is refused once its wait reaches --queue_timeout.
class DecodeWaitTest : public ::testing::Test {
 protected:
  void Start(absl::Duration queue_timeout) {
    HarnessOptions options{.prefill = 1, .decode = 2};
    options.router.queue_timeout = queue_timeout;
    options.router.clock = &clock_;
    h_ = std::make_unique<RouterHarness>(options);
    ASSERT_TRUE(h_->Start().ok());
    for (int i = 0; i < 2; ++i) {
      h_->decode(i).SetBehaviour({.refuse = absl::ResourceExhaustedError("KV cache full")});
    }
  }
  size_t DecodeCalls() { return h_->decode(0).requests().size() + h_->decode(1).requests().size(); }
  // Until `calls` decode calls were made in all and the request is parked.
  bool WaitForParked(size_t calls) {
    const absl::Time deadline = absl::Now() + kWait;
    while ((DecodeCalls() != calls || h_->core().waiting_for_decode() != 1) &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    return DecodeCalls() == calls && h_->core().waiting_for_decode() == 1;
  }
  FakeClock clock_;
  std::unique_ptr<RouterHarness> h_;
  Client client_;
};

TEST_F(DecodeWaitTest, ARequestEveryDecodeWorkerRefusesAsFullWaitsAndIsServedWhenOneHasRoom) {
  Start(absl::Seconds(30));
  client_.Run(h_->stub(), TokenRequest({1, 5, 6}, 3));
  // Refused by both workers: waiting, not failed.
  ASSERT_TRUE(WaitForParked(2));
  EXPECT_EQ(h_->core().inflight(), 1);
  h_->decode(1).SetBehaviour({});
  clock_.Advance(absl::Milliseconds(200));  // The queue's retry timer.
  client_.Join();
  ASSERT_TRUE(client_.result.status.ok()) << client_.result.status.error_message();
  EXPECT_EQ(client_.result.tokens.size(), 3u);
  EXPECT_EQ(h_->core().waiting_for_decode(), 0);
}

TEST_F(DecodeWaitTest, AWaitThatReachesTheQueueTimeoutIsRefusedWithTheWorkersReason) {
  Start(absl::Seconds(5));
  client_.Run(h_->stub(), TokenRequest({1, 5, 6}, 3));
  ASSERT_TRUE(WaitForParked(2));
  clock_.Advance(absl::Milliseconds(200));
  // Tried both again, and waits again.
  ASSERT_TRUE(WaitForParked(4));
  clock_.Advance(absl::Seconds(5));
  client_.Join();
  EXPECT_EQ(client_.result.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(client_.result.status.error_message(), HasSubstr("--queue_timeout"));
  EXPECT_THAT(client_.result.status.error_message(), HasSubstr("KV cache full"));
  EXPECT_EQ(h_->core().waiting_for_decode(), 0);
  EXPECT_TRUE(h_->core().WaitForIdle(kWait));
}

TEST_F(DecodeWaitTest, AClientThatLeavesWhileWaitingIsGoneAtOnce) {
  Start(absl::Seconds(30));
  client_.Run(h_->stub(), TokenRequest({1, 5, 6}, 3));
  ASSERT_TRUE(WaitForParked(2));
  client_.ctx.TryCancel();
  client_.Join();
  EXPECT_EQ(client_.result.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(h_->core().WaitForIdle(kWait));
  EXPECT_EQ(h_->core().waiting_for_decode(), 0);
}

// A prompt above large_prepare_bytes is prepared on a lane of its own:
// while that lane is held (here: not run at all), small requests are served
// as usual; once the lane runs, the large one is served too.
// An executor that holds what is posted to it until RunHeld (thread-safe:
// the core posts from its request threads, the test runs them).
class HeldExecutor final : public Executor {
 public:
  void Post(std::function<void()> task) override {
    absl::MutexLock lock(&mu_);
    held_.push_back(std::move(task));
  }
  TimerId PostAt(absl::Time, std::function<void()> task) override {
    Post(std::move(task));
    return 0;
  }
  bool CancelTimer(TimerId) override { return false; }
  const Clock& clock() const override { return Clock::Real(); }
  size_t held() const {
    absl::MutexLock lock(&mu_);
    return held_.size();
  }
  int RunHeld() {
    std::vector<std::function<void()>> tasks;
    {
      absl::MutexLock lock(&mu_);
      tasks.swap(held_);
    }
    for (auto& t : tasks) t();
    return static_cast<int>(tasks.size());
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::function<void()>> held_ ABSL_GUARDED_BY(mu_);
};

TEST(PrepareLaneTest, SmallRequestsAreServedWhileALargePromptWaitsForItsLane) {
  HeldExecutor lane;
  HarnessOptions options{.prefill = 0, .decode = 1};
  options.router.large_executor = &lane;
  options.router.large_prepare_bytes = 32;
  RouterHarness h(options);
  ASSERT_TRUE(h.Start().ok());
  v1::GenerateRequest large;
  large.set_text("w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16");  // 43 bytes
  large.set_max_tokens(2);
  Client waiting;
  waiting.Run(h.stub(), large);
  const absl::Time deadline = absl::Now() + kWait;
  while (lane.held() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(lane.held(), 1u);
  v1::GenerateRequest small;
  small.set_text("w5 w6 w7");  // 8 bytes: the core's own executor
  small.set_max_tokens(2);
  for (int i = 0; i < 3; ++i) {
    const Result r = h.Run(small);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens.size(), 2u);
  }
  EXPECT_EQ(h.decode(0).requests().size(), 3u);  // The large one never reached it.
  EXPECT_EQ(lane.RunHeld(), 1);
  waiting.Join();
  ASSERT_TRUE(waiting.result.status.ok()) << waiting.result.status.error_message();
  EXPECT_EQ(waiting.result.tokens.size(), 2u);
  EXPECT_EQ(h.decode(0).requests().size(), 4u);
}

}  // namespace
}  // namespace tandem::router
