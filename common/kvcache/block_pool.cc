#include "common/kvcache/block_pool.h"

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace tandem {

BlockPool::BlockPool(int num_blocks, int event_capacity)
    : ref_counts_(num_blocks, 0),
      hash_of_(num_blocks),
      cached_(num_blocks, false),
      prev_(num_blocks, kNone),
      next_(num_blocks, kNone),
      events_(event_capacity) {
  CHECK(num_blocks >= 0) << num_blocks;
  free_.reserve(num_blocks);
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

absl::StatusOr<std::vector<int32_t>> BlockPool::Allocate(int n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", n, " blocks"));
  if (n > num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache full: ", n, " blocks wanted, ",
                                                     num_free(), " of ", num_blocks(), " free"));
  }
  if (!free_sorted_) {
    std::sort(free_.begin(), free_.end(), std::greater<>());
    free_sorted_ = true;
  }
  const int from_free = std::min(n, static_cast<int>(free_.size()));
  std::vector<int32_t> out(free_.end() - from_free, free_.end());
  std::reverse(out.begin(), out.end());
  free_.resize(free_.size() - from_free);
  while (static_cast<int>(out.size()) < n) out.push_back(EvictOne());
  for (int32_t b : out) ref_counts_[b] = 1;
  return out;
}

void BlockPool::Ref(int32_t block) {
  CHECK(block >= 0 && block < num_blocks() && ref_counts_[block] > 0) << "block " << block;
  ++ref_counts_[block];
}

void BlockPool::Release(std::span<const int32_t> blocks) {
  // Last block first: a cached prefix is evicted after its extensions.
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const int32_t b = *it;
    CHECK(b >= 0 && b < num_blocks() && ref_counts_[b] > 0) << "double free of block " << b;
    if (--ref_counts_[b] != 0) continue;
    if (cached_[b]) {
      PushEvictable(b);
    } else {
      if (!free_.empty() && b > free_.back()) free_sorted_ = false;
      free_.push_back(b);
    }
  }
}

bool BlockPool::SetCached(int32_t block, const BlockHash& hash) {
  CHECK(block >= 0 && block < num_blocks() && ref_counts_[block] > 0) << "block " << block;
  if (cached_[block]) return false;
  if (!by_hash_.try_emplace(hash, block).second) return false;
  cached_[block] = true;
  hash_of_[block] = hash;
  events_.Record(CacheEventKind::kStored, hash);
  return true;
}

int32_t BlockPool::Lookup(const BlockHash& hash) const {
  auto it = by_hash_.find(hash);
  return it == by_hash_.end() ? kNone : it->second;
}

void BlockPool::Acquire(int32_t block) {
  CHECK(block >= 0 && block < num_blocks() && cached_[block]) << "block " << block;
  if (ref_counts_[block]++ == 0) Unlink(block);
}

std::vector<int32_t> BlockPool::AcquirePrefix(std::span<const BlockHash> hashes) {
  std::vector<int32_t> blocks;
  for (const BlockHash& h : hashes) {
    const int32_t b = Lookup(h);
    if (b == kNone) break;
    Acquire(b);
    blocks.push_back(b);
  }
  return blocks;
}

int BlockPool::Flush() {
  int flushed = 0;
  while (head_ != kNone) {
    const int32_t b = head_;
    Uncache(b);
    free_.push_back(b);
    free_sorted_ = false;
    ++flushed;
  }
  if (flushed == 0) return 0;
  // One event instead of one per block; the blocks in use stay cached.
  events_.Record(CacheEventKind::kCleared);
  for (const auto& [hash, block] : by_hash_) events_.Record(CacheEventKind::kStored, hash);
  return flushed;
}

void BlockPool::PushEvictable(int32_t b) {
  prev_[b] = tail_;
  next_[b] = kNone;
  if (tail_ != kNone) {
    next_[tail_] = b;
  } else {
    head_ = b;
  }
  tail_ = b;
  ++evictable_;
}

void BlockPool::Unlink(int32_t b) {
  if (prev_[b] != kNone) {
    next_[prev_[b]] = next_[b];
  } else {
    head_ = next_[b];
  }
  if (next_[b] != kNone) {
    prev_[next_[b]] = prev_[b];
  } else {
    tail_ = prev_[b];
  }
  prev_[b] = next_[b] = kNone;
  --evictable_;
}

int32_t BlockPool::EvictOne() {
  const int32_t b = head_;
  CHECK(b != kNone) << "no block to evict";
  if (eviction_hook_) eviction_hook_(b, hash_of_[b]);
  Uncache(b);
  events_.Record(CacheEventKind::kEvicted, hash_of_[b]);
  return b;
}

void BlockPool::Uncache(int32_t b) {
  Unlink(b);
  by_hash_.erase(hash_of_[b]);
  cached_[b] = false;
  ++evictions_;
}

void BlockPool::RecordTierEvent(const CacheEvent& e) {
  CHECK(e.tier != CacheTier::kPool);
  events_.Record(e.kind, e.hash, e.tier);
}

}  // namespace tandem
