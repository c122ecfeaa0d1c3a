#include "common/kvcache/cache_events.h"

#include <algorithm>

#include "common/base/logging.h"

namespace tandem {

CacheEventRing::CacheEventRing(int capacity) : capacity_(capacity) {
  CHECK(capacity > 0) << capacity;
}

CacheEvent& CacheEventRing::slot(uint64_t n) {
  const size_t i = static_cast<size_t>((n - 1) % capacity_);
  if (i >= slots_.size()) slots_.resize(i + 1);
  return slots_[i];
}

void CacheEventRing::Record(CacheEventKind kind, const BlockHash& hash, CacheTier tier) {
  slot(next_) = CacheEvent{kind, hash, tier};
  ++next_;
  if (next_ - first_ > static_cast<uint64_t>(capacity_)) ++first_;
}

CacheEventBatch CacheEventRing::Read(uint64_t after, int max_events) const {
  CacheEventBatch batch;
  batch.next = after;
  if (max_events <= 0) return batch;
  uint64_t from = after + 1;
  if (from < first_ || after > last()) {
    batch.lost = true;
    from = first_;
  }
  const uint64_t n = std::min<uint64_t>(static_cast<uint64_t>(max_events), next_ - from);
  batch.events.reserve(n);
  for (uint64_t i = from; i < from + n; ++i) batch.events.push_back(slot(i));
  batch.next = from + n - 1;
  return batch;
}

void CacheEventRing::CatchUp(const CacheEventRing& source) {
  if (source.last() <= last()) return;
  if (next_ < source.first()) {
    // The events between are gone: what this ring holds cannot be followed
    // by what comes next.
    first_ = next_ = source.first();
  }
  for (uint64_t n = next_; n <= source.last(); ++n) {
    const CacheEvent& e = source.slot(n);
    Record(e.kind, e.hash, e.tier);
  }
}

}  // namespace tandem
