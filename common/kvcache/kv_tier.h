// A KV tier below a worker's block pool: blocks kept by their chained hash
// (block_hash.h) in host memory, on SSD or in a cluster store, loaded back
// into pool blocks when a prompt's prefix is found there.
//
// A tier holds each block as one record: every layer's range of the block
// (KvLayout::block_elements(), the scales of int8 among them),
// concatenated in layer order, behind a header that names the layout the
// bytes were written with and an XXH3-64 checksum of them, computed once
// when the record is written. Every load verifies the header and the
// checksum before a byte reaches the pool: a record of another model,
// dtype or block size, a truncated record or one whose bytes changed is a
// miss (the caller recomputes), counted by its reason, never wrong KV.
//
// The interface is polled, as KvTransport is: Load returns a ticket and
// Poll says when it is done, so that the engine's step never waits on a
// read it did not plan for, and a test drives the I/O one task at a time.
#ifndef TANDEM_COMMON_KVCACHE_KV_TIER_H_
#define TANDEM_COMMON_KVCACHE_KV_TIER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/dtype.h"
#include "common/kvcache/block_hash.h"
#include "common/kvcache/cache_events.h"
#include "common/kvcache/kv_layout.h"

namespace tandem {

// What decides a block's bytes, written in every record's header: the salt
// of the worker's block hashes (weights fingerprint, KV dtype, block size:
// BlockHashSalt) and the block's shape.
struct KvTierIdentity {
  BlockHash salt;
  int n_layers = 0;
  int block_size = 0;
  int kv_dim = 0;
  int kv_heads = 0;
  DType dtype = DType::kF32;
  bool latent = false;  // KvLayout::latent

  // From a worker's layout (num_blocks plays no part).
  static KvTierIdentity Of(const BlockHash& salt, const KvLayout& layout);
  // The bytes of one block's record payload: every layer's block range.
  size_t payload_bytes() const;
  // Whether `layers` are one span per layer of one block's bytes each.
  template <typename Span>
  bool Fits(std::span<const Span> layers) const {
    if (n_layers <= 0 || layers.size() != static_cast<size_t>(n_layers)) return false;
    const size_t per_layer = payload_bytes() / static_cast<size_t>(n_layers);
    for (const Span& layer : layers) {
      if (layer.size() != per_layer) return false;
    }
    return true;
  }
  friend bool operator==(const KvTierIdentity&, const KvTierIdentity&) = default;
};

// Why a load gave no block.
enum class TierMiss : uint8_t {
  kAbsent,     // not held (never stored, evicted, or still being written)
  kCorrupt,    // the header's or the payload's checksum does not match
  kTruncated,  // fewer bytes than the header says
  kForeign,    // written for another model, dtype, block size or shape
  kIoError,    // the read itself failed
  kCancelled,  // Cancel was called
};
inline constexpr int kTierMissKinds = 6;
std::string_view TierMissName(TierMiss miss);

// The record format, for tiers and tests alike.
struct TierRecordHeader {
  static constexpr size_t kBytes = 96;
  KvTierIdentity identity;
  BlockHash hash;
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;  // XXH3-64 of the payload
};
// The kBytes of `header`, ending with an XXH3-64 of the bytes before it.
std::array<uint8_t, TierRecordHeader::kBytes> EncodeTierHeader(const TierRecordHeader& header);
// The header in `bytes`; kCorrupt when the magic, version or the header's
// own checksum is wrong, kTruncated when `bytes` is short.
absl::StatusOr<TierRecordHeader> DecodeTierHeader(std::span<const uint8_t> bytes);
uint64_t TierChecksum(std::span<const uint8_t> payload);

// Counters of a tier, cumulative but for the last two.
struct KvTierStats {
  uint64_t stores = 0;          // records accepted by Store
  uint64_t stores_refused = 0;  // Store calls that kept nothing (held, too large, failed)
  uint64_t loads = 0;           // Load calls
  uint64_t hits = 0;            // loads that delivered a verified block
  std::array<uint64_t, kTierMissKinds> misses{};  // by TierMiss
  uint64_t evictions = 0;                         // records dropped to stay within the bound
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;
  uint64_t used_bytes = 0;  // now, records and those being written
  uint64_t records = 0;     // now, readable records
};

// Implementations are thread-safe: the engine's thread looks up, stores and
// loads while the tier's own I/O runs elsewhere.
class KvTier {
 public:
  // The result of Poll.
  struct LoadState {
    bool done = false;                  // false: still in flight, poll again
    bool hit = false;                   // done: the block's layers are in the destination
    TierMiss miss = TierMiss::kAbsent;  // done and not hit: why
  };

  virtual ~KvTier() = default;
  virtual std::string_view name() const = 0;
  // The tag of its cache events in the worker's stream (cache_events.h).
  virtual CacheTier level() const = 0;
  // The tier this one spills into and passes its misses to, if any (its
  // events and stats are its own: TierLink forwards each tier's).
  virtual const KvTier* below() const { return nullptr; }
  virtual const KvTierIdentity& identity() const = 0;

  // Whether a readable record of `hash` is held now (a later load can still
  // miss: it may be evicted or found corrupt by then).
  virtual bool Contains(const BlockHash& hash) const = 0;

  // Stores a block under `hash`: `layers` are its n_layers ranges, in layer
  // order, each block_bytes long. They are copied before Store returns (the
  // pool block may be reused at once); the checksum and the write happen on
  // the tier's own time. False when nothing is kept: the hash is held or
  // being written, or the shape is wrong.
  virtual bool Store(const BlockHash& hash, std::span<const std::span<const uint8_t>> layers) = 0;

  // Starts a load of `hash` into `layers` (n_layers ranges of block_bytes,
  // such as the pool block reserved for it). They are written only with a
  // verified record, and must stay valid until Poll says done or Cancel
  // returns. Returns a ticket for Poll.
  virtual uint64_t Load(const BlockHash& hash, std::span<const std::span<uint8_t>> layers) = 0;
  // Where the load of `ticket` stands; once done, the ticket is forgotten
  // (a further Poll says done, miss kAbsent).
  virtual LoadState Poll(uint64_t ticket) = 0;
  // Gives up the load of `ticket`, done or not: once it returns, the
  // destination is not touched again and the ticket is forgotten.
  virtual void Cancel(uint64_t ticket) = 0;

  virtual KvTierStats stats() const = 0;
  // What entered and left the tier (kStored once a record is readable,
  // kEvicted when it goes), for the router's index of every tier.
  virtual CacheEventBatch EventsAfter(uint64_t cursor, int max_events) const = 0;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_KVCACHE_KV_TIER_H_
