#include "prefill_worker/prefill_metrics.h"

#include "prefill_worker/prefill_loop.h"

namespace tandem::prefill {

using metrics::AddCounter;
using metrics::AddGauge;
using metrics::AddHistogram;

PrefillMetrics::PrefillMetrics(prometheus::Registry& registry)
    : requests_(registry, "tandem_prefill_requests_total",
                "Prefill jobs by outcome (the gRPC status, snake case; refusals included)"),
      waiting_(AddGauge(registry, "tandem_prefill_requests_waiting",
                        "Jobs queued for KV blocks (queue depth)")),
      running_(
          AddGauge(registry, "tandem_prefill_requests_running", "Jobs in compute or KV transfer")),
      kv_blocks_used_(
          AddGauge(registry, "tandem_prefill_kv_blocks_used", "KV cache blocks held by jobs")),
      kv_blocks_free_(AddGauge(registry, "tandem_prefill_kv_blocks_free",
                               "Free KV cache blocks (unused cached blocks included)")),
      step_(AddHistogram(registry, "tandem_prefill_step_seconds",
                         "Engine time of one scheduling round (a batched prefill step)",
                         metrics::StepBuckets())),
      steps_(AddCounter(registry, "tandem_prefill_steps_total", "Engine steps run")),
      kv_transfers_(AddCounter(registry, "tandem_prefill_kv_transfers_total",
                               "KV cache transfers to decode workers that completed")),
      kv_transfer_bytes_(AddCounter(registry, "tandem_prefill_kv_transfer_bytes_total",
                                    "KV cache bytes sent to decode workers")),
      kv_transfer_failures_(AddCounter(registry, "tandem_prefill_kv_transfer_failures_total",
                                       "KV cache transfers that failed")),
      kv_transfer_latency_(AddHistogram(
          registry, "tandem_prefill_kv_transfer_seconds",
          "Last prefill layer done until the decode worker confirmed every KV byte (OK jobs)",
          metrics::StepBuckets())),
      prefix_cache_queried_tokens_(
          AddCounter(registry, "tandem_prefill_prefix_cache_queried_tokens_total",
                     "Prompt tokens looked up in the prefix cache (whole blocks, all but the "
                     "last token of a prompt)")),
      prefix_cache_hit_tokens_(AddCounter(
          registry, "tandem_prefill_prefix_cache_hit_tokens_total",
          "Prompt tokens whose KV came from the prefix cache instead of being computed")),
      prefix_cache_evicted_blocks_(
          AddCounter(registry, "tandem_prefill_prefix_cache_evicted_blocks_total",
                     "Cached KV blocks dropped from the prefix cache (evicted for reuse, or "
                     "flushed)")),
      kv_blocks_cached_(AddGauge(registry, "tandem_prefill_kv_blocks_cached",
                                 "KV cache blocks in the prefix cache (in use or evictable)")),
      kv_connections_(AddGauge(registry, "tandem_prefill_kv_connections",
                               "Connections to decode workers the KV sender keeps in its pool")),
      kv_peers_(AddGauge(registry, "tandem_prefill_kv_peers",
                         "Connection records the KV transport holds (open ones, and closed "
                         "ones not yet released)")),
      engine_(registry, "tandem_prefill"),
      tier_(registry, "tandem_prefill") {}

void PrefillMetrics::Publish(const PrefillStats& stats) {
  waiting_.Set(stats.waiting);
  running_.Set(stats.running);
  kv_blocks_used_.Set(stats.kv_blocks_total - stats.kv_blocks_free);
  kv_blocks_free_.Set(stats.kv_blocks_free);
  metrics::AdvanceTo(steps_, static_cast<double>(stats.steps));
  metrics::AdvanceTo(kv_transfers_, static_cast<double>(stats.kv_transfers));
  metrics::AdvanceTo(kv_transfer_bytes_, static_cast<double>(stats.kv_transfer_bytes));
  metrics::AdvanceTo(kv_transfer_failures_, static_cast<double>(stats.kv_transfers_failed));
  metrics::AdvanceTo(prefix_cache_queried_tokens_,
                     static_cast<double>(stats.prefix_cache_queried_tokens));
  metrics::AdvanceTo(prefix_cache_hit_tokens_, static_cast<double>(stats.prefix_cache_hit_tokens));
  metrics::AdvanceTo(prefix_cache_evicted_blocks_,
                     static_cast<double>(stats.prefix_cache_evicted_blocks));
  kv_blocks_cached_.Set(stats.kv_blocks_cached);
  kv_connections_.Set(static_cast<double>(stats.kv_connections));
  kv_peers_.Set(static_cast<double>(stats.kv_peers));
  engine_.Publish(stats.device_memory_total_bytes, stats.kv_cache_bytes,
                  !stats.engine_error.empty());
  if (stats.kv_tier) {
    tier_.Publish(stats.tiers, stats.tier_link, stats.tier_queried_tokens, stats.tier_hit_tokens);
  }
}

void PrefillMetrics::OnReply(const absl::StatusOr<PrefillResult>& result) {
  requests_.Count(result.status());
  if (result.ok()) kv_transfer_latency_.Observe(static_cast<double>(result->kv_transfer_us) / 1e6);
}

}  // namespace tandem::prefill
