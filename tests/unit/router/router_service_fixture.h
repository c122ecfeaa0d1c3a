// What the RouterService tests share: starting a RouterHarness (fake prefill
// and decode workers over real gRPC) and waiting for the router. The tests are
// in router_service_test.cc (routing over the workers and their failures) and
// router_service_request_test.cc (what a client's request does).
#ifndef TANDEM_TESTS_UNIT_ROUTER_ROUTER_SERVICE_FIXTURE_H_
#define TANDEM_TESTS_UNIT_ROUTER_ROUTER_SERVICE_FIXTURE_H_

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/router/router_harness.h"

namespace tandem::router::testing {

inline constexpr absl::Duration kWait = absl::Seconds(10);

inline std::unique_ptr<RouterHarness> StartHarness(HarnessOptions options = {}) {
  auto h = std::make_unique<RouterHarness>(std::move(options));
  const absl::Status s = h->Start();
  EXPECT_OK(s);
  return s.ok() ? std::move(h) : nullptr;
}

// Waits until the router has no request in flight.
inline bool WaitForRouterIdle(RouterHarness& h) { return h.core().WaitForIdle(kWait); }

}  // namespace tandem::router::testing

#endif  // TANDEM_TESTS_UNIT_ROUTER_ROUTER_SERVICE_FIXTURE_H_
