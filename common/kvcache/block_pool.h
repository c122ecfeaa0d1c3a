// A fixed pool of KV-cache blocks with reference counts and a prefix cache.
//
// A block is free, in use (reference count > 0), or cached and unused: a
// block registered under a content hash (SetCached) whose last reference
// went keeps its K/V and stays findable (Lookup) until it is evicted.
// Allocate takes free blocks first, then evicts cached unused blocks, least
// recently released first; a block in use is never evicted. num_free()
// counts both, so admission control sees the cache as free room.
//
// The prefix cache records what enters and leaves it as CacheEvents
// (cache_events.h) in a bounded ring, events(): kStored as a block is
// registered, kEvicted as a cached block is evicted for reuse, and on a
// Flush kCleared followed by kStored for each block still cached (in use).
//
// Thread-compatible: the engine's scheduling thread owns it; callers on other
// threads must synchronise.
#ifndef TANDEM_COMMON_KVCACHE_BLOCK_POOL_H_
#define TANDEM_COMMON_KVCACHE_BLOCK_POOL_H_

#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/kvcache/block_hash.h"
#include "common/kvcache/cache_events.h"

namespace tandem {

class BlockPool {
 public:
  // `event_capacity`: how many of the latest cache events events() keeps.
  explicit BlockPool(int num_blocks, int event_capacity = CacheEventRing::kDefaultCapacity);

  int num_blocks() const { return static_cast<int>(ref_counts_.size()); }
  // Blocks Allocate can hand out: free ones and cached unused ones.
  int num_free() const { return static_cast<int>(free_.size()) + evictable_; }
  int num_used() const { return num_blocks() - num_free(); }
  // Blocks registered in the prefix cache (in use or not), and those of
  // them no sequence uses.
  int num_cached() const { return static_cast<int>(by_hash_.size()); }
  int num_evictable() const { return evictable_; }
  // Cached blocks dropped from the cache (evicted or flushed).
  uint64_t evictions() const { return evictions_; }

  // `n` blocks, each with reference count 1, lowest free ids first so that a
  // sequence's blocks tend to be adjacent (and so transfer as one piece);
  // then evicted cached blocks. All or nothing: RESOURCE_EXHAUSTED when
  // fewer than `n` can be had.
  absl::StatusOr<std::vector<int32_t>> Allocate(int n);

  // Adds a reference to a block in use.
  void Ref(int32_t block);

  // Drops one reference to each block; a block whose count reaches zero is
  // free again, or, when cached, evictable. A sequence releases its blocks
  // in position order; they are queued for eviction last block first, so
  // that a prefix outlives its extensions.
  void Release(std::span<const int32_t> blocks);

  int ref_count(int32_t block) const { return ref_counts_[block]; }

  // Prefix cache.
  //
  // Registers `block` (in use, its K/V complete and never written again)
  // under `hash`. False, and nothing changes, when another block already
  // holds that hash or `block` is already cached.
  bool SetCached(int32_t block, const BlockHash& hash);
  // The block cached under `hash`, or -1.
  int32_t Lookup(const BlockHash& hash) const;
  // Takes a reference on cached `block` (in use or evictable).
  void Acquire(int32_t block);
  // The longest run of hashes[0..] that is cached, each block acquired;
  // the caller owns one reference on each.
  std::vector<int32_t> AcquirePrefix(std::span<const BlockHash> hashes);
  // Frees every cached unused block; returns how many.
  int Flush();

  // The prefix cache's latest events (see above).
  const CacheEventRing& events() const { return events_; }
  // Adds an event of a tier below the pool (`e.tier` is not kPool) to the
  // pool's events, so that their reader sees every tier in one order.
  void RecordTierEvent(const CacheEvent& e);

  // Called with each cached block Allocate evicts, before it is handed out
  // (its K/V still intact), so that a lower tier can keep a copy; Flush
  // calls it for nothing (a flushed cache is meant to be gone). Null: none.
  using EvictionHook = std::function<void(int32_t block, const BlockHash& hash)>;
  void SetEvictionHook(EvictionHook hook) { eviction_hook_ = std::move(hook); }

 private:
  static constexpr int32_t kNone = -1;
  void PushEvictable(int32_t block);
  void Unlink(int32_t block);
  // Evicts the least recently released cached unused block.
  int32_t EvictOne();
  // Takes cached unused `block` out of the cache (no event).
  void Uncache(int32_t block);

  std::vector<int32_t> ref_counts_;
  // Free ids kept sorted descending so that back() is the lowest id.
  std::vector<int32_t> free_;
  bool free_sorted_ = true;

  absl::flat_hash_map<BlockHash, int32_t> by_hash_;
  std::vector<BlockHash> hash_of_;  // Per block; meaningful when cached_[b].
  std::vector<bool> cached_;
  // Cached unused blocks, a doubly linked list by block id: head_ is the
  // next to evict.
  std::vector<int32_t> prev_, next_;
  int32_t head_ = kNone, tail_ = kNone;
  int evictable_ = 0;
  uint64_t evictions_ = 0;
  CacheEventRing events_;
  EvictionHook eviction_hook_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_KVCACHE_BLOCK_POOL_H_
