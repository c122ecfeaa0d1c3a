#include "router/prefix_index.h"

#include <utility>

#include "absl/container/flat_hash_set.h"

namespace tandem::router {

void PrefixIndex::Blocks::Clear() {
  lru.clear();
  where.clear();
}

void PrefixIndex::Blocks::Add(const BlockHash& h) {
  auto [it, inserted] = where.try_emplace(h);
  if (!inserted) return;
  lru.push_front(h);
  it->second = lru.begin();
}

void PrefixIndex::Blocks::Touch(const BlockHash& h) {
  auto [it, inserted] = where.try_emplace(h);
  if (inserted) {
    lru.push_front(h);
  } else {
    lru.splice(lru.begin(), lru, it->second);
  }
  it->second = lru.begin();
}

void PrefixIndex::Blocks::Remove(const BlockHash& h) {
  auto it = where.find(h);
  if (it == where.end()) return;
  lru.erase(it->second);
  where.erase(it);
}

void PrefixIndex::Blocks::TrimTo(int64_t n) {
  if (n < 0) n = 0;
  while (static_cast<int64_t>(lru.size()) > n) {
    where.erase(lru.back());
    lru.pop_back();
  }
}

void PrefixIndex::Entries::ReadEvents() {
  if (events == nullptr) return;
  const CacheEventBatch batch = events->Read(event_cursor, WorkerCacheEvents::kCapacity);
  event_cursor = batch.next;
  // Blocks dropped in the events missed may still be listed.
  if (batch.lost) Clear();
  for (const CacheEvent& e : batch.events) {
    Blocks& blocks = e.tier == CacheTier::kPool ? pool : e.tier == CacheTier::kHost ? host : ssd;
    switch (e.kind) {
      case CacheEventKind::kStored:
        if (!cache_off) blocks.Add(e.hash);
        break;
      case CacheEventKind::kEvicted:
        blocks.Remove(e.hash);
        break;
      case CacheEventKind::kCleared:
        blocks.Clear();
        break;
    }
  }
  host.TrimTo(kMaxTierBlocks);
  ssd.TrimTo(kMaxTierBlocks);
}

void PrefixIndex::Sync(const std::vector<WorkerSnapshot>& pool) {
  absl::flat_hash_set<std::string_view> present;
  present.reserve(pool.size());
  absl::MutexLock lock(&mu_);
  for (const WorkerSnapshot& w : pool) {
    present.insert(w.address);
    // No stats yet (never polled): nothing to compare with.
    if (w.block_size <= 0) continue;
    Entries& e = workers_[w.address];
    const BlockHashKey key = HashKeyOf(w);
    const bool reporting = w.cache_events != nullptr && w.cache_events->reporting();
    if (e.synced) {
      const bool restarted =
          w.requests_total < e.requests_total || w.prefix_cache_queried_tokens < e.queried_tokens;
      const int64_t held = e.pool.size();
      const int64_t cached = w.kv_blocks_cached;
      if (restarted || key != e.key) {
        e.Clear();
      } else if (!reporting && cached < e.cached_blocks &&
                 held > cached + cached / 4 + kTrimSlackBlocks) {
        e.pool.TrimTo(cached);
      }
    }
    if (e.events != w.cache_events) {
      // Another worker object at the address (it left and came back): its
      // events are numbered afresh.
      if (e.events != nullptr) e.Clear();
      e.events = w.cache_events;
      e.event_cursor = 0;
    }
    e.synced = true;
    e.key = key;
    e.requests_total = w.requests_total;
    e.queried_tokens = w.prefix_cache_queried_tokens;
    e.cached_blocks = w.kv_blocks_cached;
    e.cache_off =
        w.requests_total > 0 && w.prefix_cache_queried_tokens == 0 && w.kv_blocks_cached == 0;
    if (e.cache_off) e.Clear();
    e.ReadEvents();
    e.capacity = w.kv_blocks_total > 0 ? w.kv_blocks_total : kDefaultCapacityBlocks;
    e.pool.TrimTo(e.capacity);
  }
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (present.contains(it->first)) {
      ++it;
    } else {
      workers_.erase(it++);
    }
  }
}

void PrefixIndex::Insert(const std::string& worker, std::span<const BlockHash> hashes) {
  if (hashes.empty()) return;
  absl::MutexLock lock(&mu_);
  Entries& e = workers_[worker];
  if (e.cache_off || e.capacity <= 0) return;
  // Tail first, so that block 0 ends up the most recently used.
  for (auto h = hashes.rbegin(); h != hashes.rend(); ++h) e.pool.Touch(*h);
  e.pool.TrimTo(e.capacity);
}

PrefixMatch PrefixIndex::MatchTiers(const std::string& worker,
                                    std::span<const BlockHash> hashes) const {
  absl::ReaderMutexLock lock(&mu_);
  PrefixMatch m;
  auto it = workers_.find(worker);
  if (it == workers_.end()) return m;
  const Entries& e = it->second;
  const int n = static_cast<int>(hashes.size());
  while (m.pool < n && e.pool.contains(hashes[m.pool])) ++m.pool;
  // The worker looks its tier up from its pool's first miss on.
  while (m.pool + m.tier < n && e.in_tier(hashes[m.pool + m.tier])) ++m.tier;
  return m;
}

int64_t PrefixIndex::size(const std::string& worker) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = workers_.find(worker);
  return it == workers_.end() ? 0 : it->second.pool.size();
}

int64_t PrefixIndex::tier_size(const std::string& worker) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = workers_.find(worker);
  return it == workers_.end() ? 0 : it->second.host.size() + it->second.ssd.size();
}

std::optional<BlockHashKey> PrefixIndex::KeyOf(const std::string& worker) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = workers_.find(worker);
  if (it == workers_.end() || !it->second.synced) return std::nullopt;
  return it->second.key;
}

}  // namespace tandem::router
