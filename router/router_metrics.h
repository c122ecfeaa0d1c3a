// The router's Prometheus metrics (tandem_router_*) and its per-request
// trace log. Both are optional: services and drivers take null pointers.
#ifndef TANDEM_ROUTER_ROUTER_METRICS_H_
#define TANDEM_ROUTER_ROUTER_METRICS_H_

#include <fstream>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/metrics.h"
#include "prometheus/registry.h"

namespace tandem::router {

// Thread-safe (prometheus-cpp metrics are).
struct RouterMetrics {
  explicit RouterMetrics(prometheus::Registry& registry);

  // Every client request, by how it ended (refusals included).
  metrics::OutcomeCounter requests;
  prometheus::Gauge& requests_in_flight;
  prometheus::Gauge& requests_queued;
  // Requests that every decode worker refused as full, waiting for a slot.
  prometheus::Gauge& requests_waiting_decode;
  // Latencies as vLLM defines them, seen by the router: TTFT and ITL as
  // tokens are sent; TPOT and E2E for requests that ended OK.
  prometheus::Histogram& time_to_first_token;
  prometheus::Histogram& time_per_output_token;
  prometheus::Histogram& inter_token_latency;
  prometheus::Histogram& e2e_request_latency;
  prometheus::Counter& prefill_retries;
  // Streams moved to another decode worker after theirs was lost.
  prometheus::Counter& migrations;
  prometheus::Counter& drain_moves;
  prometheus::Counter& kv_handoffs;
  prometheus::Counter& kv_handoff_failures;
  prometheus::Counter& disaggregated_requests;
  prometheus::Counter& local_prefill_requests;
  prometheus::Counter& burst_prefill_requests;
  prometheus::Counter& prompt_tokens;
  prometheus::Counter& generation_tokens;
  // Workers healthy and in each pool after the last health poll round
  // (what a planner sizes the pools against).
  prometheus::Gauge& prefill_workers_ready;
  prometheus::Gauge& decode_workers_ready;
};

// Appends one line per finished request (JSON, see RequestDriver) to a file.
// Thread-safe.
class RequestLog {
 public:
  // Opens `path` for appending.
  static absl::StatusOr<std::unique_ptr<RequestLog>> Open(const std::string& path);
  void Write(const std::string& line);

 private:
  explicit RequestLog(std::ofstream out) : out_(std::move(out)) {}
  absl::Mutex mu_;
  std::ofstream out_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_ROUTER_METRICS_H_
