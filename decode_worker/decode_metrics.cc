#include "decode_worker/decode_metrics.h"

#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace tandem::decode {

using metrics::AddCounter;
using metrics::AddGauge;
using metrics::AddHistogram;

// Forwards every event; counts the request's tokens as they stream and its
// outcome when it ends. Loop thread only, like the sink it wraps.
class DecodeMetrics::CountingSink final : public EventSink {
 public:
  CountingSink(DecodeMetrics* metrics, std::shared_ptr<EventSink> inner)
      : metrics_(metrics), inner_(std::move(inner)) {}

  void OnReserved(const Reservation& reservation) override { inner_->OnReserved(reservation); }
  void OnPromptLogprobs(std::span<const TokenLogprob> logprobs) override {
    inner_->OnPromptLogprobs(logprobs);
  }
  void OnTokens(int index, std::span<const int32_t> ids,
                std::span<const TokenLogprob> logprobs) override {
    streamed_[index] += static_cast<int>(ids.size());
    metrics_->generated_tokens_.Increment(static_cast<double>(ids.size()));
    inner_->OnTokens(index, ids, logprobs);
  }
  void OnFinished(const Finished& finished) override {
    // The first token of a remote prefill counts although it is not streamed.
    const int streamed = streamed_[finished.index];
    if (finished.completion_tokens > streamed) {
      metrics_->generated_tokens_.Increment(finished.completion_tokens - streamed);
    }
    if (finished.last) {
      if (finished.kv_wait > absl::ZeroDuration()) {
        metrics_->kv_wait_.Observe(metrics::Seconds(finished.kv_wait));
      }
      metrics_->requests_.Count(absl::StatusCode::kOk);
    }
    inner_->OnFinished(finished);
  }
  void OnMoving(bool ships_kv) override {
    metrics_->moves_offered_.Increment();
    inner_->OnMoving(ships_kv);
  }
  void OnFailed(const absl::Status& status) override {
    metrics_->requests_.Count(status);
    inner_->OnFailed(status);
  }

 private:
  DecodeMetrics* const metrics_;
  const std::shared_ptr<EventSink> inner_;
  // Tokens streamed per choice.
  absl::flat_hash_map<int, int> streamed_;
};

DecodeMetrics::DecodeMetrics(prometheus::Registry& registry)
    : requests_(registry, "tandem_decode_requests_total",
                "Decode requests by outcome (the gRPC status, snake case; refusals included)"),
      running_(AddGauge(registry, "tandem_decode_requests_running",
                        "Sequences in the running batch (batch size)")),
      waiting_(AddGauge(registry, "tandem_decode_requests_waiting",
                        "Requests admitted but not in the batch yet (waiting for their KV "
                        "cache or Start, prefilling locally, or queued)")),
      kv_blocks_used_(
          AddGauge(registry, "tandem_decode_kv_blocks_used", "KV cache blocks held by requests")),
      kv_blocks_free_(AddGauge(registry, "tandem_decode_kv_blocks_free",
                               "Free KV cache blocks (cached blocks no request uses included)")),
      kv_blocks_cached_(AddGauge(registry, "tandem_decode_kv_blocks_cached",
                                 "KV cache blocks in the prefix cache (in use or not)")),
      prefix_cache_queried_tokens_(
          AddCounter(registry, "tandem_decode_prefix_cache_queried_tokens_total",
                     "Prompt tokens looked up in the prefix cache (whole blocks)")),
      prefix_cache_hit_tokens_(
          AddCounter(registry, "tandem_decode_prefix_cache_hit_tokens_total",
                     "Prompt tokens whose KV the prefix cache held (not computed, not shipped)")),
      prefix_cache_evicted_blocks_(
          AddCounter(registry, "tandem_decode_prefix_cache_evicted_blocks_total",
                     "Cached KV blocks dropped from the prefix cache (evicted for reuse, or "
                     "flushed)")),
      preemptions_(AddCounter(registry, "tandem_decode_preemptions_total",
                              "Running requests whose KV blocks were given back for others to "
                              "grow into (recomputed later)")),
      step_(AddHistogram(registry, "tandem_decode_step_seconds",
                         "Engine time of one batched decode step", metrics::StepBuckets())),
      generated_tokens_(AddCounter(
          registry, "tandem_decode_generated_tokens_total",
          "Output tokens of requests on this worker (a remote prefill's first token included)")),
      moves_offered_(
          AddCounter(registry, "tandem_decode_moves_offered_total",
                     "Streams the draining worker offered the router to move elsewhere")),
      kv_transfers_(AddCounter(registry, "tandem_decode_kv_transfers_total",
                               "KV cache transfers received whole")),
      kv_bytes_received_(AddCounter(registry, "tandem_decode_kv_received_bytes_total",
                                    "KV cache bytes received from prefill workers")),
      kv_transfer_failures_(AddCounter(registry, "tandem_decode_kv_transfer_failures_total",
                                       "KV cache transfers that failed (cancellations excluded)")),
      kv_wait_(AddHistogram(registry, "tandem_decode_kv_wait_seconds",
                            "Reservation until every KV byte had arrived (remote prefills that "
                            "finished OK)",
                            metrics::LatencyBuckets())),
      engine_(registry, "tandem_decode") {}

void DecodeMetrics::Publish(const LoopStats& stats) {
  running_.Set(stats.running);
  waiting_.Set(stats.waiting);
  kv_blocks_used_.Set(stats.kv_blocks_total - stats.kv_blocks_free);
  kv_blocks_free_.Set(stats.kv_blocks_free);
  kv_blocks_cached_.Set(stats.kv_blocks_cached);
  metrics::AdvanceTo(prefix_cache_queried_tokens_,
                     static_cast<double>(stats.prefix_cache_queried_tokens));
  metrics::AdvanceTo(prefix_cache_hit_tokens_, static_cast<double>(stats.prefix_cache_hit_tokens));
  metrics::AdvanceTo(prefix_cache_evicted_blocks_,
                     static_cast<double>(stats.prefix_cache_evicted_blocks));
  metrics::AdvanceTo(preemptions_, static_cast<double>(stats.preemptions));
  metrics::AdvanceTo(kv_transfers_, static_cast<double>(stats.kv_transfers));
  metrics::AdvanceTo(kv_bytes_received_, static_cast<double>(stats.kv_transfer_bytes));
  metrics::AdvanceTo(kv_transfer_failures_, static_cast<double>(stats.kv_transfers_failed));
  engine_.Publish(stats.device_memory_total_bytes, stats.kv_cache_bytes,
                  !stats.engine_error.empty());
}

std::shared_ptr<EventSink> DecodeMetrics::Wrap(std::shared_ptr<EventSink> sink) {
  return std::make_shared<CountingSink>(this, std::move(sink));
}

}  // namespace tandem::decode
