// What the router knows about one worker at an instant: plain data, copied
// out of the WorkerRegistry so that routing decisions are pure functions of
// it (and can run inside a simulator with made-up snapshots).
#ifndef TANDEM_ROUTER_WORKER_SNAPSHOT_H_
#define TANDEM_ROUTER_WORKER_SNAPSHOT_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/worker/worker_stats.h"

namespace tandem::router {

enum class WorkerRole { kPrefill, kDecode };

class WorkerCacheEvents;

// "prefill" or "decode".
inline const char* WorkerRoleName(WorkerRole role) {
  return role == WorkerRole::kPrefill ? "prefill" : "decode";
}

// The worker's last stats (WorkerStatsRecord: zero before the first
// successful poll; `draining`: it finishes its work but takes no more),
// and the router's own view of it.
struct WorkerSnapshot : WorkerStatsRecord {
  // ip:port (or [ipv6]:port) of this one worker.
  std::string address;
  // The target it was resolved from (host:port as given on the command line).
  std::string target;
  WorkerRole role = WorkerRole::kDecode;

  // The last GetStats poll succeeded (and one has succeeded at all).
  bool healthy = false;
  // The worker agrees with its pool on the model and the KV layout (see
  // router/pool_identity.h); false until the registry has checked its
  // latest stats. Made-up snapshots (tests, simulators) default to true.
  bool in_pool = true;
  // Why it is out of the pool ("has kv_dtype bf16, the pool has f32");
  // empty when in the pool or not checked yet.
  std::string disagreement;

  // Router-side view, live (not from stats): requests this router has open
  // on the worker, and KV blocks it has asked the worker to reserve that the
  // last stats poll may not reflect yet.
  int32_t inflight = 0;
  int32_t reserved_blocks = 0;

  // The prefix cache events the worker has reported
  // (router/worker_cache_events.h), shared with the registry, which keeps
  // adding to them; null in made-up snapshots.
  std::shared_ptr<const WorkerCacheEvents> cache_events;

  bool routable() const { return healthy && !draining && in_pool; }
};

// What the routable decode workers say about the model: the vocabulary
// (0 = none reported), the smallest context among them (0 = unknown), and
// the largest KV pool, in blocks of block_size tokens (0 = unknown; the
// workers of a pool agree on the block size).
struct DecodePoolLimits {
  bool any_routable = false;
  int vocab_size = 0;
  int max_context = 0;
  int32_t block_size = 0;
  int32_t max_kv_blocks = 0;
};

inline DecodePoolLimits LimitsOf(const std::vector<WorkerSnapshot>& decode) {
  DecodePoolLimits l;
  for (const WorkerSnapshot& s : decode) {
    if (!s.routable()) continue;
    l.any_routable = true;
    if (s.vocab_size > 0) l.vocab_size = s.vocab_size;
    if (s.block_size > 0 && s.kv_blocks_total > l.max_kv_blocks) {
      l.block_size = s.block_size;
      l.max_kv_blocks = s.kv_blocks_total;
    }
    if (s.max_context > 0) {
      l.max_context = l.max_context == 0 ? s.max_context : std::min(l.max_context, s.max_context);
    }
  }
  return l;
}

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_WORKER_SNAPSHOT_H_
