// Prefix cache events: what entered and left a BlockPool's prefix cache, in
// order, for an index of what a worker caches kept elsewhere (the router's
// PrefixIndex, router/prefix_index.h).
//
// Events are numbered from 1. A reader keeps a cursor (the number of the
// last event it has seen) and asks for the events after it; a ring keeps
// only the latest `capacity` events, so a reader that falls behind learns
// that it lost some and must forget what it knew (the cache may have
// dropped blocks it never heard of) and start again from the events left.
#ifndef TANDEM_COMMON_KVCACHE_CACHE_EVENTS_H_
#define TANDEM_COMMON_KVCACHE_CACHE_EVENTS_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/kvcache/block_hash.h"

namespace tandem {

enum class CacheEventKind : uint8_t {
  // A block was registered in the cache under `hash` (SetCached).
  kStored,
  // The cached block of `hash` left the cache (evicted for reuse).
  kEvicted,
  // Forget every block known before (a flush); no hash. The blocks still
  // cached after it (in use) follow as kStored.
  kCleared,
};

// Where an event happened: the worker's block pool, or a tier below it.
enum class CacheTier : uint8_t {
  kPool,
  kSsd,
  kHost,
};
inline constexpr CacheTier kCacheTiers[] = {CacheTier::kPool, CacheTier::kSsd, CacheTier::kHost};

struct CacheEvent {
  CacheEventKind kind = CacheEventKind::kStored;
  BlockHash hash;
  CacheTier tier = CacheTier::kPool;

  friend bool operator==(const CacheEvent&, const CacheEvent&) = default;
};

// The answer to a read after a cursor.
struct CacheEventBatch {
  // In order; the first is numbered `next - events.size() + 1`.
  std::vector<CacheEvent> events;
  // The cursor to read after next: the number of the last event returned,
  // or the cursor given when there is nothing new.
  uint64_t next = 0;
  // Events after the cursor were dropped before they were read (or the
  // cursor is past the newest event, of another numbering): `events` start
  // at the oldest one kept, and the reader must forget what it knew first.
  bool lost = false;
};

// The latest `capacity` events, O(1) per event and O(events returned) per
// read. Thread-compatible.
class CacheEventRing {
 public:
  static constexpr int kDefaultCapacity = 65536;

  explicit CacheEventRing(int capacity = kDefaultCapacity);

  int capacity() const { return capacity_; }
  // The number of the newest event (0 before the first) and of the oldest
  // kept (last() + 1 when none is).
  uint64_t last() const { return next_ - 1; }
  uint64_t first() const { return first_; }

  void Record(CacheEventKind kind, const BlockHash& hash = {}, CacheTier tier = CacheTier::kPool);

  // At most `max_events` (none when <= 0) of the events after `after`.
  CacheEventBatch Read(uint64_t after, int max_events) const;

  // Records the events of `source` after last() with their numbers (this
  // ring copies a ring that numbered every event it holds). When some of
  // them are gone from `source`, drops everything it keeps and goes on from
  // source.first(): its readers then see `lost`.
  void CatchUp(const CacheEventRing& source);

 private:
  CacheEvent& slot(uint64_t n);
  const CacheEvent& slot(uint64_t n) const { return slots_[(n - 1) % capacity_]; }

  int capacity_;
  // Event n is at (n - 1) % capacity_; grown as events come.
  std::vector<CacheEvent> slots_;
  // Kept: the events numbered [first_, next_).
  uint64_t first_ = 1;
  uint64_t next_ = 1;
};

// A CacheEventRing shared between threads: one writes, others read.
class CacheEventLog {
 public:
  explicit CacheEventLog(int capacity = CacheEventRing::kDefaultCapacity) : ring_(capacity) {}
  CacheEventLog(const CacheEventLog&) = delete;
  CacheEventLog& operator=(const CacheEventLog&) = delete;

  void Record(CacheEventKind kind, const BlockHash& hash = {}, CacheTier tier = CacheTier::kPool) {
    absl::MutexLock lock(&mu_);
    ring_.Record(kind, hash, tier);
  }
  void CatchUp(const CacheEventRing& source) {
    absl::MutexLock lock(&mu_);
    ring_.CatchUp(source);
  }
  CacheEventBatch Read(uint64_t after, int max_events) const {
    absl::MutexLock lock(&mu_);
    return ring_.Read(after, max_events);
  }
  uint64_t last() const {
    absl::MutexLock lock(&mu_);
    return ring_.last();
  }

 private:
  mutable absl::Mutex mu_;
  CacheEventRing ring_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem

#endif  // TANDEM_COMMON_KVCACHE_CACHE_EVENTS_H_
