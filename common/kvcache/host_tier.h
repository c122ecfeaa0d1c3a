// The host-memory tier: KV block records (kv_tier.h) in the worker's own
// memory, bounded in bytes, least recently used evicted first. With a tier
// below it (the SSD tier), what it evicts goes down there, and the loads it
// cannot serve are that tier's: the pool spills into host memory, host
// memory into the disk, and a prompt's blocks come back from whichever
// holds them.
//
// Store copies the block and computes its checksum on the caller's thread
// (the copy has just read it into the caches); Load verifies the checksum
// and copies the record into place on the executor, so that the engine's
// thread never copies a fetched block itself. A record whose bytes no
// longer match their checksum is dropped and its load is the lower tier's,
// or a miss: wrong KV never reaches the pool.
//
// Thread-safe.
#ifndef TANDEM_COMMON_KVCACHE_HOST_TIER_H_
#define TANDEM_COMMON_KVCACHE_HOST_TIER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/base/executor.h"
#include "common/kvcache/kv_tier.h"

namespace tandem {

struct HostTierOptions {
  // The bound on the records' payload bytes.
  uint64_t capacity_bytes = 0;
};

class HostTier final : public KvTier {
 public:
  // A tier for blocks of `identity`; `io` runs the loads and must outlive
  // it; `below` (may be null) takes its evictions and serves its misses.
  // INVALID_ARGUMENT for a bound too small for one record, a layout without
  // bytes, or a `below` of another identity.
  static absl::StatusOr<std::unique_ptr<HostTier>> Create(HostTierOptions options,
                                                          const KvTierIdentity& identity,
                                                          Executor* io,
                                                          std::unique_ptr<KvTier> below = nullptr);
  ~HostTier() override;

  std::string_view name() const override { return "host"; }
  CacheTier level() const override { return CacheTier::kHost; }
  const KvTier* below() const override { return below_.get(); }
  const KvTierIdentity& identity() const override;
  // Held here or below.
  bool Contains(const BlockHash& hash) const override;
  bool Store(const BlockHash& hash, std::span<const std::span<const uint8_t>> layers) override;
  uint64_t Load(const BlockHash& hash, std::span<const std::span<uint8_t>> layers) override;
  LoadState Poll(uint64_t ticket) override;
  void Cancel(uint64_t ticket) override;
  // This tier's own: a load it passed below counts as its miss (kAbsent)
  // and as the lower tier's load.
  KvTierStats stats() const override;
  CacheEventBatch EventsAfter(uint64_t cursor, int max_events) const override;

  // Flips one payload byte of the record of `hash`, as a fault in memory
  // would; false when none is held here (tests).
  bool DamageForTest(const BlockHash& hash);

 private:
  struct State;
  HostTier(std::shared_ptr<State> state, std::unique_ptr<KvTier> below);

  // Shared with the loads on the executor, which may outlive the tier.
  std::shared_ptr<State> state_;
  // Destroyed after the state is closed, so no load reaches it then.
  std::unique_ptr<KvTier> below_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_KVCACHE_HOST_TIER_H_
