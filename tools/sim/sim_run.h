// A tandem-bench run against a simulated cluster: the same dataset, the
// same arrival schedule (gamma gaps at --request_rate, --burstiness, seeded
// alike) and concurrency limit, and the same records and metrics, but every
// time is the cluster's simulated time. The requests go into the production
// router core of a SimCluster; each stream is timed as tandem-bench times a
// gRPC stream: its first token-carrying message, the gaps between messages,
// its end.
#ifndef TANDEM_TOOLS_SIM_SIM_RUN_H_
#define TANDEM_TOOLS_SIM_SIM_RUN_H_

#include "absl/status/statusor.h"
#include "tools/bench/dataset.h"
#include "tools/bench/runner.h"
#include "tools/sim/sim_cluster.h"

namespace tandem::sim {

// The router's own CPU: `threads` servers, each request taking
// `per_request` of one before it reaches the router core (parsing,
// tokenizing, routing) and each token-carrying message `per_token` per
// token before it reaches its client, first come first served. Zero costs
// (the default): the router takes no time. tandem-router-bench measures
// what a stream costs the router.
//
// `hop_latency` is the time of the client's and the workers' gRPC hops a
// request crosses on its way in and its first token on its way out, in
// which nothing queues (scripts/bench-cluster.sh measures about 3 ms on
// loopback): a request reaches the core that long after it is sent, before
// its CPU work. It moves every time of a stream alike.
struct RouterCpuModel {
  absl::Duration per_request = absl::ZeroDuration();
  absl::Duration per_token = absl::ZeroDuration();
  int threads = 1;
  absl::Duration hop_latency = absl::ZeroDuration();
};

// Sends options.num_requests requests of `dataset` (which must carry token
// ids) into `cluster` and runs it until each has ended. A multi_turn
// dataset's conversations start on the schedule and send each later turn
// its think time after the previous one ended (a failed turn ends its
// conversation; a conversation holds one max_concurrency slot). Honours
// request_rate, burstiness, max_concurrency, seed and slo; refuses what
// only a real client does (waves, duration_s) with INVALID_ARGUMENT. A
// request that fails counts as failed, as in tandem-bench; INTERNAL if the
// cluster went idle with requests still open (a stall). `router_cpu` delays
// what passes through the router by its CPU time.
absl::StatusOr<bench::RunResult> RunSimulated(SimCluster& cluster, const bench::Dataset& dataset,
                                              const bench::RunOptions& options,
                                              const RouterCpuModel& router_cpu = {});

}  // namespace tandem::sim

#endif  // TANDEM_TOOLS_SIM_SIM_RUN_H_
