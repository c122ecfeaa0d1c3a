// WorkerStatsRecord: what a prefill or decode worker reports about itself
// (worker.proto WorkerStats), as plain data. Both workers fill one, both
// services send it with WorkerStatsToProto, and the router's view of a
// worker (WorkerSnapshot) starts from the one WorkerStatsFromProto reads
// back (worker_stats_proto.h).
#ifndef TANDEM_COMMON_WORKER_WORKER_STATS_H_
#define TANDEM_COMMON_WORKER_WORKER_STATS_H_

#include <cstdint>
#include <string>

namespace tandem {

struct WorkerStatsRecord {
  // The served model and its KV layout: every worker of a pool must agree.
  std::string model;
  std::string weights_fingerprint;
  std::string model_shape;  // ModelConfig::ShapeString()
  std::string kv_dtype;     // DTypeName of the KV cache's element type
  int32_t vocab_size = 0;
  int32_t max_context = 0;
  int32_t block_size = 0;
  // The KV pool: unused blocks of the prefix cache count as free.
  int32_t kv_blocks_total = 0;
  int32_t kv_blocks_free = 0;
  int32_t kv_blocks_cached = 0;
  // Decode: choices in the batch and those waiting for it. Prefill: jobs in
  // compute or transfer and jobs queued for blocks.
  int32_t running = 0;
  int32_t waiting = 0;
  bool draining = false;
  // Counters since the worker started (a drop means it restarted).
  uint64_t requests_total = 0;
  uint64_t requests_failed = 0;  // client cancellations excluded
  uint64_t kv_transfers = 0;     // decode: received; prefill: sent
  uint64_t kv_transfer_bytes = 0;
  uint64_t kv_transfers_failed = 0;
  // Prompt tokens looked up in the prefix cache (whole blocks) and found.
  uint64_t prefix_cache_queried_tokens = 0;
  uint64_t prefix_cache_hit_tokens = 0;
  // Cached blocks dropped from the prefix cache (evicted or flushed).
  uint64_t prefix_cache_evicted_blocks = 0;
  // Decode: running requests preempted (blocks given back, recomputed later).
  uint64_t preemptions = 0;
  // The engine's device memory (0 for a backend in host memory) and KV cache.
  uint64_t device_memory_total_bytes = 0;
  uint64_t kv_cache_bytes = 0;
  // Why the engine computes no more (its backend failed); empty while it
  // works. The worker refuses new requests and reports NOT_SERVING then.
  std::string engine_error;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_WORKER_WORKER_STATS_H_
