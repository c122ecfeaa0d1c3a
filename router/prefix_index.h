// PrefixIndex: the router's approximate view of which KV blocks each worker
// of one pool holds in its prefix cache. Blocks are named by their chained
// hashes (common/kvcache/block_hash.h), so the leading blocks of a prompt
// that a worker holds are found by walking the prompt's chain until the
// first miss.
//
// The view is learned two ways:
//   - from the router's own routing history (Insert), at once: a prompt
//     sent to a worker will leave its full blocks cached there, and a
//     finished decode sequence the blocks it wrote;
//   - from the cache events the workers report to the stats polls
//     (router/worker_cache_events.h, read at every Sync): a block stored
//     is added, a block evicted is removed, so entries the workers have
//     dropped stop matching within a poll interval, and blocks cached by
//     requests of other routers are learned. A kCleared event (a flush, a
//     worker restart seen as a new cache epoch, events lost because the
//     router fell behind) clears the worker's entries; the events after it
//     rebuild them.
//   - a worker with KV tiers below its pool (host memory, an SSD) reports
//     their events too, tagged with the tier: the index keeps the blocks
//     of each tier apart (a block can be in several), a tier's kCleared
//     clears that tier only, and MatchTiers says how many of a prompt's
//     blocks the worker holds in its pool and how many more it would load
//     from its tiers. The routing history (Insert) fills the pool's entries only.
//
// The view is also kept in bounds and near the truth with the workers'
// stats (Sync, with the pool's latest snapshots):
//   - at most kv_blocks_total entries per worker (kDefaultCapacityBlocks
//     before its first stats), evicting its least recently used first; a
//     prompt's chain is recorded tail first, so a worker's shared prefixes
//     outlive the prompt-specific blocks after them, as in the worker's own
//     cache;
//   - a worker's entries are cleared when it restarted (requests_total or
//     prefix_cache_queried_tokens went down), changed model or KV layout,
//     or left the pool;
//   - for a worker that reports no cache events (an older one), when its
//     kv_blocks_cached drops well below what the index holds for it (its
//     cache was flushed, or evicted for running sequences), its least
//     recently used entries are trimmed to kv_blocks_cached;
//   - a worker that has served requests but never looked a prompt up (its
//     prefix cache is off) has no entries.
//
// Thread-safe; every call is O(blocks given + workers in the pool), plus
// O(new events) for Sync.
#ifndef TANDEM_ROUTER_PREFIX_INDEX_H_
#define TANDEM_ROUTER_PREFIX_INDEX_H_

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/kvcache/block_hash.h"
#include "common/kvcache/cache_events.h"
#include "router/worker_cache_events.h"
#include "router/worker_snapshot.h"

namespace tandem::router {

// What a worker's block hashes depend on: its salt's inputs.
struct BlockHashKey {
  std::string weights_fingerprint;
  std::string kv_dtype;
  int32_t block_size = 0;

  bool operator==(const BlockHashKey&) const = default;
};

inline BlockHashKey HashKeyOf(const WorkerSnapshot& w) {
  return {w.weights_fingerprint, w.kv_dtype, w.block_size};
}

// A prompt's leading blocks as a worker holds them: `pool` in its block
// pool, then `tier` more in the tier below it (the worker loads those
// instead of computing them).
struct PrefixMatch {
  int pool = 0;
  int tier = 0;
};

class PrefixIndex {
 public:
  // Entries per worker before its stats say how many KV blocks it has.
  static constexpr int kDefaultCapacityBlocks = 4096;
  // Entries kept per tier and worker (the stats do not say a tier's size):
  // least recently stored dropped first. 256Ki blocks is 4Mi tokens of 16.
  static constexpr int kMaxTierBlocks = 1 << 18;
  // A drop of kv_blocks_cached trims the index only when it holds more
  // than kv_blocks_cached * 5/4 + this many blocks for the worker (recent
  // requests may not be counted in the stats yet).
  static constexpr int kTrimSlackBlocks = 16;

  PrefixIndex() = default;
  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  // Brings the index in line with the pool's latest snapshots (every worker
  // of the pool, as WorkerRegistry::Snapshot lists them): see above.
  void Sync(const std::vector<WorkerSnapshot>& pool);

  // Records that `worker` holds the chain `hashes` (block 0 first); they
  // become its most recently used entries.
  void Insert(const std::string& worker, std::span<const BlockHash> hashes);

  // How many leading blocks of `hashes` the index says `worker` holds in
  // its pool.
  int Match(const std::string& worker, std::span<const BlockHash> hashes) const {
    return MatchTiers(worker, hashes).pool;
  }
  // The same, and how many of the blocks after those its tiers hold.
  PrefixMatch MatchTiers(const std::string& worker, std::span<const BlockHash> hashes) const;

  // The pool entries held for `worker` (0 when unknown).
  int64_t size(const std::string& worker) const;
  // The tier entries held for `worker`, every tier's (0 when unknown).
  int64_t tier_size(const std::string& worker) const;

  // The hash inputs of `worker` per its last synced snapshot; nullopt when
  // it has none yet (no stats, or not synced).
  std::optional<BlockHashKey> KeyOf(const std::string& worker) const;

 private:
  // Hashes in recency order, most recent first.
  struct Blocks {
    std::list<BlockHash> lru;
    absl::flat_hash_map<BlockHash, std::list<BlockHash>::iterator> where;

    void Clear();
    // Evicts least recently used entries until at most `n` are left.
    void TrimTo(int64_t n);
    // Adds `h` as the most recently used entry unless it is there.
    void Add(const BlockHash& h);
    // Makes `h` the most recently used entry, adding it when absent.
    void Touch(const BlockHash& h);
    void Remove(const BlockHash& h);
    bool contains(const BlockHash& h) const { return where.contains(h); }
    int64_t size() const { return static_cast<int64_t>(lru.size()); }
  };

  struct Entries {
    Blocks pool;
    // The tiers below the pool, each apart: a block moving from host memory
    // to the SSD is stored in one and evicted from the other, in either order.
    Blocks host;
    Blocks ssd;
    int64_t capacity = kDefaultCapacityBlocks;
    // The last snapshot's stats, to see restarts and drops.
    bool synced = false;
    BlockHashKey key;
    uint64_t requests_total = 0;
    uint64_t queried_tokens = 0;
    int32_t cached_blocks = 0;
    // Its prefix cache is off: nothing is recorded.
    bool cache_off = false;
    // Its cache events, read up to `event_cursor`.
    std::shared_ptr<const WorkerCacheEvents> events;
    uint64_t event_cursor = 0;

    void Clear() {
      pool.Clear();
      host.Clear();
      ssd.Clear();
    }
    bool in_tier(const BlockHash& h) const { return host.contains(h) || ssd.contains(h); }
    // Applies the events after event_cursor.
    void ReadEvents();
  };

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entries> workers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_PREFIX_INDEX_H_
