#include "prefill_worker/prefill_proto.h"

#include "common/engine/engine_proto.h"
#include "common/worker/worker_stats_proto.h"

namespace tandem::prefill {

PrefillJob JobFromProto(const v1::PrefillRequest& request) {
  PrefillJob job;
  job.request_id = request.request_id();
  job.tokens.assign(request.tokens().begin(), request.tokens().end());
  job.sampling = SamplingFromProto(request.sampling());
  job.kv_descriptor = request.kv_descriptor();
  job.n = request.n() == 0 ? 1 : request.n();
  if (request.has_logprobs()) job.logprobs = request.logprobs();
  job.prompt_logprobs = request.prompt_logprobs();
  job.stop_token_ids.assign(request.stop_token_ids().begin(), request.stop_token_ids().end());
  return job;
}

void ResultToProto(const PrefillResult& result, v1::PrefillResponse* response) {
  response->set_first_token(result.first_token);
  response->mutable_extra_first_tokens()->Assign(result.extra_first_tokens.begin(),
                                                 result.extra_first_tokens.end());
  response->mutable_sampler_draws()->Assign(result.sampler_draws.begin(),
                                            result.sampler_draws.end());
  for (const TokenLogprob& lp : result.first_logprobs) {
    LogprobToProto(lp, response->add_first_logprobs());
  }
  for (const TokenLogprob& lp : result.prompt_logprobs) {
    LogprobToProto(lp, response->add_prompt_logprobs());
  }
  response->set_queue_us(result.queue_us);
  response->set_prefill_us(result.prefill_us);
  response->set_kv_transfer_us(result.kv_transfer_us);
  response->set_kv_bytes(result.kv_bytes);
  response->set_cached_tokens(result.cached_tokens);
  response->set_tier_tokens(result.tier_tokens);
}

v1::WorkerStats StatsToProto(const PrefillStats& stats) {
  v1::WorkerStats w;
  WorkerStatsToProto(stats, "prefill", &w);
  return w;
}

}  // namespace tandem::prefill
