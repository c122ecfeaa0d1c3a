#include "router/router_metrics.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::router {

using metrics::AddCounter;
using metrics::AddGauge;
using metrics::AddHistogram;

namespace {

prometheus::Family<prometheus::Gauge>& WorkersReady(prometheus::Registry& registry) {
  return prometheus::BuildGauge()
      .Name("tandem_router_workers_ready")
      .Help("Workers healthy and in the pool after the last health poll round")
      .Register(registry);
}

}  // namespace

RouterMetrics::RouterMetrics(prometheus::Registry& registry)
    : requests(registry, "tandem_router_requests_total",
               "Client Generate requests by outcome (the gRPC status, snake case; refusals "
               "included)"),
      requests_in_flight(AddGauge(registry, "tandem_router_requests_in_flight",
                                  "Requests being served right now")),
      requests_queued(AddGauge(registry, "tandem_router_requests_queued",
                               "Requests waiting in the router's queue for a serving slot")),
      requests_waiting_decode(
          AddGauge(registry, "tandem_router_requests_waiting_decode",
                   "Admitted requests waiting for a decode worker with room (every one refused "
                   "them as full)")),
      time_to_first_token(AddHistogram(registry, "tandem_router_time_to_first_token_seconds",
                                       "Arrival at the router until the first token was sent",
                                       metrics::LatencyBuckets())),
      time_per_output_token(AddHistogram(
          registry, "tandem_router_time_per_output_token_seconds",
          "(E2E - TTFT) / (completion tokens - 1) of OK requests with at least two tokens",
          metrics::StepBuckets())),
      inter_token_latency(AddHistogram(registry, "tandem_router_inter_token_latency_seconds",
                                       "Time between successive token messages to the client",
                                       metrics::StepBuckets())),
      e2e_request_latency(AddHistogram(registry, "tandem_router_e2e_request_latency_seconds",
                                       "Arrival until the final message, of OK requests",
                                       metrics::LatencyBuckets())),
      prefill_retries(AddCounter(registry, "tandem_router_prefill_retries_total",
                                 "Prefills retried on another prefill worker after a failure")),
      migrations(AddCounter(registry, "tandem_router_migrations_total",
                            "Streams moved to another decode worker after theirs was lost, "
                            "resuming from the tokens already sent")),
      drain_moves(AddCounter(registry, "tandem_router_drain_moves_total",
                             "Streams moved off a draining decode worker at its offer (counted in "
                             "tandem_router_migrations_total too)")),
      kv_handoffs(AddCounter(registry, "tandem_router_kv_handoffs_total",
                             "Moves off a draining decode worker whose K/V it shipped to the new "
                             "worker (nothing recomputed)")),
      kv_handoff_failures(AddCounter(registry, "tandem_router_kv_handoff_failures_total",
                                     "K/V handoffs that failed, after which the new worker "
                                     "recomputed the stream's tokens")),
      disaggregated_requests(AddCounter(registry, "tandem_router_disaggregated_requests_total",
                                        "Requests served by a prefill worker and a decode worker")),
      local_prefill_requests(AddCounter(registry, "tandem_router_local_prefill_requests_total",
                                        "Requests prefilled on their decode worker")),
      burst_prefill_requests(AddCounter(
          registry, "tandem_router_burst_prefill_requests_total",
          "Prompts prefilled on a decode worker because every prefill worker held "
          "--prefill_burst_queue prompts (the planner counts them against the prefill pool)")),
      prompt_tokens(AddCounter(registry, "tandem_router_prompt_tokens_total",
                               "Prompt tokens of requests sent to a decode worker")),
      generation_tokens(AddCounter(registry, "tandem_router_generation_tokens_total",
                                   "Completion tokens sent to clients")),
      prefill_workers_ready(WorkersReady(registry).Add({{"pool", "prefill"}})),
      decode_workers_ready(WorkersReady(registry).Add({{"pool", "decode"}})) {}

absl::StatusOr<std::unique_ptr<RequestLog>> RequestLog::Open(const std::string& path) {
  std::ofstream out(path, std::ios::app);
  if (!out.is_open()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot open request log ", path));
  }
  return std::unique_ptr<RequestLog>(new RequestLog(std::move(out)));
}

void RequestLog::Write(const std::string& line) {
  absl::MutexLock lock(&mu_);
  // Flushed per line, so that a reader (or a crash) sees whole requests.
  out_ << line << '\n';
  out_.flush();
}

}  // namespace tandem::router
