// A stream whose decode worker stops sending its tokens, while the worker
// answers health polls and other streams' tokens keep coming, moves to
// another decode worker after --decode_stall_timeout; with nothing else
// progressing it stays (the router itself, or every worker, may be the one
// that paused). Real timers run these, as the hung-reservation tests do.
#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/router/router_harness.h"

namespace tandem::router::testing {
namespace {

using ::testing::ElementsAre;

constexpr absl::Duration kStall = absl::Seconds(1);

HarnessOptions TwoDecodeWorkers() {
  HarnessOptions options{.prefill = 1, .decode = 2};
  options.router.driver.decode_stall_timeout = kStall;
  return options;
}

TEST(StalledStreamTest, MovesWhileOtherStreamsProgress) {
  RouterHarness h(TwoDecodeWorkers());
  ASSERT_OK(h.Start());
  const int stuck = h.FirstDecode();
  // The stuck worker's stream stops after 3 tokens of its own; the other
  // worker decodes a token every 50 ms.
  h.decode(stuck).SetBehaviour({.hold_after = 3});
  h.decode(1 - stuck).SetBehaviour({.token_interval = absl::Milliseconds(50)});

  Result stalled;
  std::thread first([&] { stalled = h.Run(TokenRequest({1, 5, 6}, 10)); });
  // The second request goes to the other worker once the first holds one
  // stream on the stuck worker; it streams for about 3 s.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (h.decode(stuck).requests().empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  const Result steady = h.Run(TokenRequest({1, 7, 8}, 60));
  first.join();

  ASSERT_TRUE(steady.status.ok()) << steady.status.error_message();
  EXPECT_EQ(steady.finished.decode_worker(), h.decode_address(1 - stuck));
  ASSERT_TRUE(stalled.status.ok()) << stalled.status.error_message();
  // Every token once, as an unfaulted run gives them.
  EXPECT_THAT(stalled.tokens, ElementsAre(40, 20, 21, 22, 23, 24, 25, 26, 27, 28));
  EXPECT_EQ(stalled.finished.decode_worker(), h.decode_address(1 - stuck));
  // The stuck stream was cancelled, so its worker holds nothing.
  EXPECT_TRUE(h.decode(stuck).WaitForCancelled(1, absl::Seconds(10)));
  EXPECT_TRUE(h.decode(stuck).WaitForNoStreams(absl::Seconds(10)));
  EXPECT_TRUE(h.core().WaitForIdle(absl::Seconds(10)));
}

// Alone, a stalled stream is not moved: it ends at its deadline where it is.
TEST(StalledStreamTest, StaysWhenNothingElseProgresses) {
  RouterHarness h(TwoDecodeWorkers());
  ASSERT_OK(h.Start());
  const int stuck = h.FirstDecode();
  h.decode(stuck).SetBehaviour({.hold_after = 3});
  v1::GenerateRequest request = TokenRequest({1, 5, 6}, 10);
  request.set_timeout_ms(3000);  // three stall deadlines
  const Result r = h.Run(request);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << r.status.error_message();
  EXPECT_TRUE(h.decode(1 - stuck).requests().empty());
  EXPECT_TRUE(h.core().WaitForIdle(absl::Seconds(10)));
}

}  // namespace
}  // namespace tandem::router::testing
