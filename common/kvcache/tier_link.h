// The link between a worker's block pool and a KV tier below it
// (kv_tier.h): cached blocks the pool evicts spill down into the tier, and
// the blocks of a prompt that the pool lacks but the tier holds are
// fetched back into blocks reserved for them.
//
// Spilling happens at eviction (write-back), not as each block is cached
// (write-through): a block that is reused from the pool before it is
// evicted never costs a copy, and a block is copied only once, when its
// room is wanted. The copy is n_layers memcpys on the pool's thread (the
// tier writes it on its own time); a tier whose writes fall behind refuses
// the block, which is then simply gone, as without a tier.
//
// A fetch starts one load per block of a run of hashes, all at once, into
// the caller's blocks. Only its leading run of verified blocks is of use
// (a prompt is computed from its first missing block on), so the loads
// after the first miss are cancelled. A fetch is over when every load is
// done or its deadline has passed, when the loads still out are cancelled:
// the caller computes what did not arrive and never waits longer.
//
// The cache events of the tier and of every tier below it (KvTier::below,
// such as the SSD under host memory) reach the pool's event stream (and
// through it the router) when the pool's thread calls ForwardEvents, each
// tagged with its tier. When a tier dropped events before they were
// forwarded, a kCleared of that tier goes first: the router forgets what it knew of the
// tier and learns it again from the blocks stored after.
//
// Thread-compatible: the pool's thread drives it.
#ifndef TANDEM_COMMON_KVCACHE_TIER_LINK_H_
#define TANDEM_COMMON_KVCACHE_TIER_LINK_H_

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/kvcache/block_hash.h"
#include "common/kvcache/block_pool.h"
#include "common/kvcache/kv_layout.h"
#include "common/kvcache/kv_tier.h"

namespace tandem {

// Cumulative counters of a link, for the worker's stats.
struct TierLinkStats {
  uint64_t spilled = 0;          // evicted blocks the tier took
  uint64_t spills_refused = 0;   // evicted blocks the tier did not take
  uint64_t fetches = 0;          // Start calls with at least one block
  uint64_t blocks_fetched = 0;   // loads started
  uint64_t blocks_loaded = 0;    // verified blocks at the head of a fetch
  uint64_t blocks_missed = 0;    // loads that gave no block
  uint64_t blocks_late = 0;      // loads cancelled at a fetch's deadline
  uint64_t blocks_unneeded = 0;  // loads cancelled after an earlier miss
};

class TierLink {
 public:
  // One fetch; movable, and empty (over, nothing loaded) when made by default.
  class Fetch {
   public:
    Fetch() = default;
    // Whether loads are still out (Poll has not said it is over).
    bool active() const { return active_; }
    // Leading blocks verified and in place, once over.
    int loaded() const { return loaded_; }

   private:
    friend class TierLink;
    enum class Slot : uint8_t { kPending, kHit, kMiss, kUnneeded, kLate };
    std::vector<uint64_t> tickets_;
    std::vector<Slot> slots_;
    absl::Time deadline_ = absl::InfiniteFuture();
    bool active_ = false;
    int loaded_ = 0;
  };

  // `kv`: the host memory of the cache `layout` describes; `tier` and `kv`
  // must outlive the link.
  TierLink(KvTier* tier, const KvLayout& layout, uint8_t* kv);

  // Makes `pool` spill its evicted cached blocks through this link, and
  // ForwardEvents add the tier's events to its events. `pool` must outlive
  // the link.
  void Attach(BlockPool& pool);
  // Adds the tier's events not yet forwarded to the attached pool's events
  // (nothing before Attach).
  void ForwardEvents();
  // Copies `block`'s layers into the tier under `hash`.
  void Spill(int32_t block, const BlockHash& hash);

  // How many of the leading `hashes` the tier holds now.
  int Probe(std::span<const BlockHash> hashes) const;
  // Starts loading hashes[i] into blocks[i] (equal lengths); the blocks
  // must stay the caller's until the fetch is over or cancelled.
  Fetch Start(std::span<const BlockHash> hashes, std::span<const int32_t> blocks,
              absl::Time deadline);
  // Advances `fetch`; true once it is over (then loaded() is final).
  bool Poll(Fetch& fetch, absl::Time now);
  // Ends `fetch` now: once it returns the blocks are not written again,
  // and loaded() counts the leading blocks that had arrived.
  void Cancel(Fetch& fetch);

  KvTier& tier() { return *tier_; }
  const TierLinkStats& stats() const { return stats_; }

 private:
  template <typename Span>
  std::vector<Span> Layers(int32_t block) const;
  // Cancels every load still pending from slot `from` on, counted as `why`
  // (kUnneeded or kLate).
  void CancelFrom(Fetch& fetch, size_t from, Fetch::Slot why);
  void End(Fetch& fetch);

  KvTier* const tier_;
  BlockPool* pool_ = nullptr;
  // The tier and those below it, each with the cursor of its events.
  std::vector<std::pair<const KvTier*, uint64_t>> chain_;
  const KvLayout layout_;
  uint8_t* const kv_;
  TierLinkStats stats_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_KVCACHE_TIER_LINK_H_
