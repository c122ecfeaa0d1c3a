// Helpers over prometheus-cpp so that services declare their metrics in one
// line each and share bucket layouts and outcome labels.
//
// Names follow the Prometheus conventions: tandem_<component>_<what>_<unit>,
// base units (seconds, bytes), counters end in _total.
#ifndef TANDEM_COMMON_METRICS_METRICS_H_
#define TANDEM_COMMON_METRICS_METRICS_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/labels.h"
#include "prometheus/registry.h"

namespace tandem::metrics {

// Request-level latencies (TTFT, end-to-end): 1 ms .. 120 s.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets();
// Per-token and per-step latencies (TPOT, ITL, engine steps, KV transfers):
// 100 us .. 10 s.
const prometheus::Histogram::BucketBoundaries& StepBuckets();

// One-series families. The registry owns the metric; the reference lives as
// long as the registry.
prometheus::Counter& AddCounter(prometheus::Registry& registry, const std::string& name,
                                const std::string& help, const prometheus::Labels& labels = {});
prometheus::Gauge& AddGauge(prometheus::Registry& registry, const std::string& name,
                            const std::string& help, const prometheus::Labels& labels = {});
prometheus::Histogram& AddHistogram(prometheus::Registry& registry, const std::string& name,
                                    const std::string& help,
                                    const prometheus::Histogram::BucketBoundaries& buckets);

inline double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// Moves a counter that mirrors a monotonic total kept elsewhere (a stats
// snapshot) up to `total`. Call it from one thread only.
void AdvanceTo(prometheus::Counter& counter, double total);

// A worker's gauges of its engine: `PREFIX_device_memory_total_bytes`,
// `PREFIX_kv_cache_bytes` and `PREFIX_engine_failed` (PREFIX e.g.
// "tandem_decode"), and of a mixture of experts the tokens each expert of
// each layer computed, `PREFIX_moe_expert_tokens_total{layer,expert}`, so
// that a skewed router shows (max over avg of the rates by layer).
class EngineGauges {
 public:
  EngineGauges(prometheus::Registry& registry, const std::string& prefix);
  // `device_memory` is 0 on host memory; `failed` once the backend failed.
  void Publish(uint64_t device_memory, uint64_t kv_cache_bytes, bool failed);
  // Engine::expert_load(): tokens per expert per layer since the start
  // (a dense layer's list is empty). The series are made on the first call
  // that has them; a later load of other dimensions is ignored. One thread.
  void PublishExpertLoad(const std::vector<std::vector<uint64_t>>& load);

 private:
  prometheus::Gauge& device_memory_;
  prometheus::Gauge& kv_cache_bytes_;
  prometheus::Gauge& engine_failed_;
  prometheus::Family<prometheus::Counter>& expert_tokens_;
  std::vector<std::vector<prometheus::Counter*>> expert_counters_;
};

// The `outcome` label of a request that ended with `code`: "ok",
// "invalid_argument", "not_found" (a model not served: the client's
// mistake, not the server's), "resource_exhausted", "unavailable",
// "cancelled", "deadline_exceeded"; every other code is "error".
std::string_view OutcomeLabel(absl::StatusCode code);

// A counter family with one series per outcome, all created up front so that
// every outcome renders (as 0) from the first scrape. Thread-safe.
class OutcomeCounter {
 public:
  OutcomeCounter(prometheus::Registry& registry, const std::string& name, const std::string& help);
  void Count(absl::StatusCode code) { Get(code).Increment(); }
  void Count(const absl::Status& status) { Count(status.code()); }
  prometheus::Counter& Get(absl::StatusCode code);

  static constexpr std::array<std::string_view, 8> kOutcomes = {
      "ok",          "invalid_argument", "not_found",         "resource_exhausted",
      "unavailable", "cancelled",        "deadline_exceeded", "error"};

 private:
  std::array<prometheus::Counter*, kOutcomes.size()> counters_{};
};

}  // namespace tandem::metrics

#endif  // TANDEM_COMMON_METRICS_METRICS_H_
