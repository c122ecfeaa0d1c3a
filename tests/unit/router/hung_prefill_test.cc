// Requests piled up on a hung prefill worker (sent before the router knew)
// all leave it when the first of them runs out of its answer budget, not
// each at the end of its own budget, which grows with the requests ahead.
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/router/router_harness.h"

namespace tandem::router::testing {
namespace {

TEST(HungPrefillTest, RequestsPiledOnAHungWorkerLeaveWithTheFirstTimeout) {
  constexpr absl::Duration kUnit = absl::Seconds(1);
  constexpr int kRequests = 8;
  HarnessOptions options{.prefill = 1, .decode = 1};
  options.router.driver.prefill_answer_timeout = kUnit;
  RouterHarness h(std::move(options));
  ASSERT_OK(h.Start());
  h.prefill(0).SetBehaviour({.hold = true});

  // All sent at once: the k-th has k-1 ahead on the worker, so a budget of
  // k seconds of its own (8 s for the last).
  const absl::Time start = absl::Now();
  std::vector<Result> results(kRequests);
  std::vector<absl::Duration> took(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      results[i] = h.Run(TokenRequest({1, 5, 6, i + 7}, 3));
      took[i] = absl::Now() - start;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    // The decode worker computed the prompt: there is no other prefill worker.
    EXPECT_FALSE(results[i].finished.disaggregated());
    // One budget unit, not i + 1 of them (3 s of margin for a loaded machine).
    EXPECT_LT(took[i], kUnit + absl::Seconds(3)) << "request " << i;
  }
  EXPECT_EQ(h.prefill(0).requests().size(), static_cast<size_t>(kRequests));
  EXPECT_TRUE(h.prefill(0).WaitForCancelled(kRequests, absl::Seconds(10)));
  EXPECT_TRUE(h.core().WaitForIdle(absl::Seconds(10)));
}

}  // namespace
}  // namespace tandem::router::testing
