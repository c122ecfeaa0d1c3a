#include "common/worker/worker_stats_proto.h"

namespace tandem {

void WorkerStatsToProto(const WorkerStatsRecord& s, const char* role, v1::WorkerStats* proto) {
  proto->set_role(role);
  proto->set_model(s.model);
  proto->set_weights_fingerprint(s.weights_fingerprint);
  proto->set_model_shape(s.model_shape);
  proto->set_kv_dtype(s.kv_dtype);
  proto->set_vocab_size(s.vocab_size);
  proto->set_max_context(s.max_context);
  proto->set_block_size(s.block_size);
  proto->set_kv_blocks_total(s.kv_blocks_total);
  proto->set_kv_blocks_free(s.kv_blocks_free);
  proto->set_kv_blocks_cached(s.kv_blocks_cached);
  proto->set_running(s.running);
  proto->set_waiting(s.waiting);
  proto->set_draining(s.draining);
  proto->set_requests_total(s.requests_total);
  proto->set_requests_failed(s.requests_failed);
  proto->set_kv_transfers(s.kv_transfers);
  proto->set_kv_transfer_bytes(s.kv_transfer_bytes);
  proto->set_kv_transfers_failed(s.kv_transfers_failed);
  proto->set_prefix_cache_queried_tokens(s.prefix_cache_queried_tokens);
  proto->set_prefix_cache_hit_tokens(s.prefix_cache_hit_tokens);
  proto->set_prefix_cache_evicted_blocks(s.prefix_cache_evicted_blocks);
  proto->set_preemptions(s.preemptions);
  proto->set_device_memory_total_bytes(s.device_memory_total_bytes);
  proto->set_kv_cache_bytes(s.kv_cache_bytes);
  proto->set_engine_error(s.engine_error);
}

WorkerStatsRecord WorkerStatsFromProto(const v1::WorkerStats& p) {
  return WorkerStatsRecord{.model = p.model(),
                           .weights_fingerprint = p.weights_fingerprint(),
                           .model_shape = p.model_shape(),
                           .kv_dtype = p.kv_dtype(),
                           .vocab_size = p.vocab_size(),
                           .max_context = p.max_context(),
                           .block_size = p.block_size(),
                           .kv_blocks_total = p.kv_blocks_total(),
                           .kv_blocks_free = p.kv_blocks_free(),
                           .kv_blocks_cached = p.kv_blocks_cached(),
                           .running = p.running(),
                           .waiting = p.waiting(),
                           .draining = p.draining(),
                           .requests_total = p.requests_total(),
                           .requests_failed = p.requests_failed(),
                           .kv_transfers = p.kv_transfers(),
                           .kv_transfer_bytes = p.kv_transfer_bytes(),
                           .kv_transfers_failed = p.kv_transfers_failed(),
                           .prefix_cache_queried_tokens = p.prefix_cache_queried_tokens(),
                           .prefix_cache_hit_tokens = p.prefix_cache_hit_tokens(),
                           .prefix_cache_evicted_blocks = p.prefix_cache_evicted_blocks(),
                           .preemptions = p.preemptions(),
                           .device_memory_total_bytes = p.device_memory_total_bytes(),
                           .kv_cache_bytes = p.kv_cache_bytes(),
                           .engine_error = p.engine_error()};
}

}  // namespace tandem
