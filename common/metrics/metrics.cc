#include "common/metrics/metrics.h"

#include <cstddef>

namespace tandem::metrics {

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* const kBuckets = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5,
      0.75,  1,      2.5,   5,    7.5,   10,   20,    30,  60,   120};
  return *kBuckets;
}

const prometheus::Histogram::BucketBoundaries& StepBuckets() {
  static const auto* const kBuckets = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02,
      0.03,   0.04,    0.05,   0.075, 0.1,    0.25,  0.5,    1,    2.5,   10};
  return *kBuckets;
}

prometheus::Counter& AddCounter(prometheus::Registry& registry, const std::string& name,
                                const std::string& help, const prometheus::Labels& labels) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add(labels);
}

prometheus::Gauge& AddGauge(prometheus::Registry& registry, const std::string& name,
                            const std::string& help, const prometheus::Labels& labels) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add(labels);
}

EngineGauges::EngineGauges(prometheus::Registry& registry, const std::string& prefix)
    : device_memory_(AddGauge(registry, prefix + "_device_memory_total_bytes",
                              "Memory of the device the engine computes on (0: host memory)")),
      kv_cache_bytes_(
          AddGauge(registry, prefix + "_kv_cache_bytes", "Bytes of the engine's KV cache")),
      engine_failed_(AddGauge(registry, prefix + "_engine_failed",
                              "1 once the engine's backend failed (the worker serves no more)")),
      expert_tokens_(prometheus::BuildCounter()
                         .Name(prefix + "_moe_expert_tokens_total")
                         .Help("Tokens routed to each expert of each mixture-of-experts layer "
                               "(layer and expert from 0; a token counts once per expert it "
                               "chose)")
                         .Register(registry)) {}

void EngineGauges::PublishExpertLoad(const std::vector<std::vector<uint64_t>>& load) {
  if (expert_counters_.empty()) {
    expert_counters_.resize(load.size());
    for (size_t l = 0; l < load.size(); ++l) {
      for (size_t e = 0; e < load[l].size(); ++e) {
        expert_counters_[l].push_back(
            &expert_tokens_.Add({{"layer", std::to_string(l)}, {"expert", std::to_string(e)}}));
      }
    }
  }
  if (load.size() != expert_counters_.size()) return;
  for (size_t l = 0; l < load.size(); ++l) {
    if (load[l].size() != expert_counters_[l].size()) continue;
    for (size_t e = 0; e < load[l].size(); ++e) {
      AdvanceTo(*expert_counters_[l][e], static_cast<double>(load[l][e]));
    }
  }
}

void EngineGauges::Publish(uint64_t device_memory, uint64_t kv_cache_bytes, bool failed) {
  device_memory_.Set(static_cast<double>(device_memory));
  kv_cache_bytes_.Set(static_cast<double>(kv_cache_bytes));
  engine_failed_.Set(failed ? 1 : 0);
}

prometheus::Histogram& AddHistogram(prometheus::Registry& registry, const std::string& name,
                                    const std::string& help,
                                    const prometheus::Histogram::BucketBoundaries& buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add({}, buckets);
}

void AdvanceTo(prometheus::Counter& counter, double total) {
  const double now = counter.Value();
  if (total > now) counter.Increment(total - now);
}

std::string_view OutcomeLabel(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return "ok";
    case absl::StatusCode::kInvalidArgument:
      return "invalid_argument";
    case absl::StatusCode::kNotFound:
      return "not_found";
    case absl::StatusCode::kResourceExhausted:
      return "resource_exhausted";
    case absl::StatusCode::kUnavailable:
      return "unavailable";
    case absl::StatusCode::kCancelled:
      return "cancelled";
    case absl::StatusCode::kDeadlineExceeded:
      return "deadline_exceeded";
    default:
      return "error";
  }
}

OutcomeCounter::OutcomeCounter(prometheus::Registry& registry, const std::string& name,
                               const std::string& help) {
  auto& family = prometheus::BuildCounter().Name(name).Help(help).Register(registry);
  for (size_t i = 0; i < kOutcomes.size(); ++i) {
    counters_[i] = &family.Add({{"outcome", std::string(kOutcomes[i])}});
  }
}

prometheus::Counter& OutcomeCounter::Get(absl::StatusCode code) {
  const std::string_view label = OutcomeLabel(code);
  for (size_t i = 0; i < kOutcomes.size(); ++i) {
    if (kOutcomes[i] == label) return *counters_[i];
  }
  return *counters_.back();
}

}  // namespace tandem::metrics
