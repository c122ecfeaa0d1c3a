// What the planner reads from the router: its Prometheus text (/metrics),
// parsed into the few series a decision needs, and the observation over
// the interval between two readings (request rate, TTFT and TPOT at a
// quantile, the workers ready in each pool).
#ifndef TANDEM_PLANNER_ROUTER_SCRAPE_H_
#define TANDEM_PLANNER_ROUTER_SCRAPE_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "planner/planner_core.h"

namespace tandem::planner {

struct RouterScrape {
  absl::Time at;
  double requests = 0;  // tandem_router_requests_total, every outcome
  // Of those, the ones turned away or failed for want of capacity
  // (resource_exhausted, unavailable, deadline_exceeded).
  double refused = 0;
  // Prompts prefilled on decode workers because every prefill worker was
  // full (tandem_router_burst_prefill_requests_total; 0 from a router
  // without it).
  double burst_prefills = 0;
  // Cumulative buckets (upper bound, count), increasing bounds, +Inf last.
  std::vector<std::pair<double, double>> ttft_buckets;
  std::vector<std::pair<double, double>> tpot_buckets;
  int prefill_ready = 0;
  int decode_ready = 0;
};

// Parses the router's exposition text (read at `at`). INVALID_ARGUMENT
// naming the line for a malformed sample, or naming the series when the
// requests counter or the ready-workers gauges are missing (a router too
// old, or not a router).
absl::StatusOr<RouterScrape> ParseRouterMetrics(absl::string_view text, absl::Time at);

// The value at `q` (0..1) of a histogram's growth between two readings of
// its cumulative buckets, interpolated within the bucket it falls in as
// Prometheus's histogram_quantile does (the +Inf bucket gives the largest
// finite bound); nullopt when nothing was observed between them.
std::optional<double> QuantileOfGrowth(const std::vector<std::pair<double, double>>& before,
                                       const std::vector<std::pair<double, double>>& after,
                                       double q);

// The observation over [before.at, after.at]: requests per second, the
// shares of them refused and prefilled on decode workers in a burst, TTFT and TPOT at `q`, and
// `after`'s ready workers. A counter that went down (the router restarted) gives no rate.
Observation Between(const RouterScrape& before, const RouterScrape& after, double q = 0.99);

// One reading per router replica, keyed by the address it was read at.
using RouterScrapes = std::map<std::string, RouterScrape>;

// The observation over routers that share the pools (the replicas of one
// router Deployment): their request rates added, their histograms' growth
// added bound by bound before the quantile is taken, the ready workers the
// most any of them reports (each sees the same pools; one that has not yet
// resolved a new worker reports fewer). A router read only the second time
// (new, or back from a failed read) and one whose counters went down
// (restarted) add nothing this time.
Observation BetweenRouters(const RouterScrapes& before, const RouterScrapes& after,
                           double q = 0.99);

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_ROUTER_SCRAPE_H_
