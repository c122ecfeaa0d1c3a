#include "router/prefix_index.h"

#include <utility>

#include "absl/container/flat_hash_set.h"

namespace tandem::router {

void PrefixIndex::Entries::Clear() {
  lru.clear();
  where.clear();
}

void PrefixIndex::Entries::Add(const BlockHash& h) {
  auto [it, inserted] = where.try_emplace(h);
  if (!inserted) return;
  lru.push_front(h);
  it->second = lru.begin();
}

void PrefixIndex::Entries::Remove(const BlockHash& h) {
  auto it = where.find(h);
  if (it == where.end()) return;
  lru.erase(it->second);
  where.erase(it);
}

void PrefixIndex::Entries::ReadEvents() {
  if (events == nullptr) return;
  const CacheEventBatch batch = events->Read(event_cursor, WorkerCacheEvents::kCapacity);
  event_cursor = batch.next;
  // Blocks dropped in the events missed may still be listed.
  if (batch.lost) Clear();
  for (const CacheEvent& e : batch.events) {
    switch (e.kind) {
      case CacheEventKind::kStored:
        if (!cache_off) Add(e.hash);
        break;
      case CacheEventKind::kEvicted:
        Remove(e.hash);
        break;
      case CacheEventKind::kCleared:
        Clear();
        break;
    }
  }
}

void PrefixIndex::Entries::TrimTo(int64_t n) {
  if (n < 0) n = 0;
  while (static_cast<int64_t>(lru.size()) > n) {
    where.erase(lru.back());
    lru.pop_back();
  }
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
      const int64_t held = static_cast<int64_t>(e.lru.size());
      const int64_t cached = w.kv_blocks_cached;
      if (restarted || key != e.key) {
        e.Clear();
      } else if (!reporting && cached < e.cached_blocks &&
                 held > cached + cached / 4 + kTrimSlackBlocks) {
        e.TrimTo(cached);
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
    e.TrimTo(e.capacity);
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
  for (auto h = hashes.rbegin(); h != hashes.rend(); ++h) {
    auto [it, inserted] = e.where.try_emplace(*h);
    if (inserted) {
      e.lru.push_front(*h);
    } else {
      e.lru.splice(e.lru.begin(), e.lru, it->second);
    }
    it->second = e.lru.begin();
  }
  e.TrimTo(e.capacity);
}

int PrefixIndex::Match(const std::string& worker, std::span<const BlockHash> hashes) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = workers_.find(worker);
  if (it == workers_.end()) return 0;
  int n = 0;
  for (const BlockHash& h : hashes) {
    if (!it->second.where.contains(h)) break;
    ++n;
  }
  return n;
}

int64_t PrefixIndex::size(const std::string& worker) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = workers_.find(worker);
  return it == workers_.end() ? 0 : static_cast<int64_t>(it->second.lru.size());
}

std::optional<BlockHashKey> PrefixIndex::KeyOf(const std::string& worker) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = workers_.find(worker);
  if (it == workers_.end() || !it->second.synced) return std::nullopt;
  return it->second.key;
}

}  // namespace tandem::router
