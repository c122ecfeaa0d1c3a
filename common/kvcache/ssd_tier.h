// The SSD tier: KV block records (kv_tier.h) as files under a directory,
// one per block (HASH.kvb, 32 hex digits), bounded in bytes, least
// recently used evicted first.
//
// Every disk operation runs on the executor given to Open (a pool of I/O
// threads in a worker; a ManualExecutor in tests): Store only copies the
// block and queues it, Load only queues, so the engine's thread never
// makes a file system call. A record is written to a temporary name and
// renamed into place, so a reader never opens half a record; nothing is
// synced, since a record torn by a crash fails its checksum and is a miss.
//
// The tier survives a restart: Open indexes the directory from the
// records' headers, oldest modification first in the eviction order. A
// record of another model, dtype, block size or shape, one with a damaged
// or truncated header, and the temporary files of an interrupted write are
// removed then, and counted in open_report(); the payload checksums are
// verified on each load, not at Open (that would read the whole disk).
//
// Thread-safe.
#ifndef TANDEM_COMMON_KVCACHE_SSD_TIER_H_
#define TANDEM_COMMON_KVCACHE_SSD_TIER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/base/executor.h"
#include "common/kvcache/kv_tier.h"

namespace tandem {

struct SsdTierOptions {
  // The tier's own directory, created when missing.
  std::string dir;
  // The bound on the records' bytes (headers included), over every record
  // written and being written.
  uint64_t capacity_bytes = 0;
  // Records copied by Store and not yet written, at most: a disk slower
  // than the evictions that feed it refuses further stores instead of
  // holding ever more memory.
  int max_pending_writes = 64;
};

// What Open found in the directory.
struct SsdTierOpenReport {
  uint64_t kept = 0;  // records of this identity, now indexed
  uint64_t kept_bytes = 0;
  uint64_t removed_foreign = 0;        // another model, dtype, block size or shape
  uint64_t removed_damaged = 0;        // a header that does not decode, or a size that disagrees
  uint64_t removed_partial = 0;        // temporary files of writes never finished
  uint64_t evicted_over_capacity = 0;  // kept records beyond a smaller bound
};

class SsdTier final : public KvTier {
 public:
  // Opens the tier in options.dir for blocks of `identity`; `io` runs its
  // disk operations and must outlive it. INVALID_ARGUMENT for a bound too
  // small for one record or a layout without bytes, the file system's
  // error when the directory cannot be made or read.
  static absl::StatusOr<std::unique_ptr<SsdTier>> Open(SsdTierOptions options,
                                                       const KvTierIdentity& identity,
                                                       Executor* io);
  ~SsdTier() override;

  std::string_view name() const override { return "ssd"; }
  CacheTier level() const override { return CacheTier::kSsd; }
  const KvTierIdentity& identity() const override;
  bool Contains(const BlockHash& hash) const override;
  bool Store(const BlockHash& hash, std::span<const std::span<const uint8_t>> layers) override;
  uint64_t Load(const BlockHash& hash, std::span<const std::span<uint8_t>> layers) override;
  LoadState Poll(uint64_t ticket) override;
  void Cancel(uint64_t ticket) override;
  KvTierStats stats() const override;
  CacheEventBatch EventsAfter(uint64_t cursor, int max_events) const override;

  const SsdTierOpenReport& open_report() const { return report_; }
  // The path of the record of `hash` (tests corrupt it).
  std::string RecordPath(const BlockHash& hash) const;

 private:
  struct State;
  SsdTier(std::shared_ptr<State> state, SsdTierOpenReport report);

  // Shared with the tasks on the executor, which may outlive the tier.
  std::shared_ptr<State> state_;
  SsdTierOpenReport report_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_KVCACHE_SSD_TIER_H_
