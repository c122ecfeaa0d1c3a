#include "common/kvcache/tier_link.h"

#include "common/base/logging.h"

namespace tandem {

TierLink::TierLink(KvTier* tier, const KvLayout& layout, uint8_t* kv)
    : tier_(tier), layout_(layout), kv_(kv) {
  CHECK(tier_ != nullptr && kv_ != nullptr);
  for (const KvTier* t = tier_; t != nullptr; t = t->below()) chain_.push_back({t, 0});
}

void TierLink::Attach(BlockPool& pool) {
  pool_ = &pool;
  pool.SetEvictionHook([this](int32_t block, const BlockHash& hash) { Spill(block, hash); });
}

void TierLink::ForwardEvents() {
  if (pool_ == nullptr) return;
  // The pool keeps 64Ki events: a reader behind by more is told it lost
  // some anyway, so one read per call bounds the work.
  constexpr int kMaxPerCall = 8192;
  for (auto& [tier, cursor] : chain_) {
    const CacheEventBatch batch = tier->EventsAfter(cursor, kMaxPerCall);
    if (batch.lost && cursor != 0) {
      pool_->RecordTierEvent(CacheEvent{CacheEventKind::kCleared, {}, tier->level()});
    }
    for (CacheEvent e : batch.events) {
      e.tier = tier->level();
      pool_->RecordTierEvent(e);
    }
    cursor = batch.next;
  }
}

template <typename Span>
std::vector<Span> TierLink::Layers(int32_t block) const {
  std::vector<Span> layers;
  layers.reserve(layout_.n_layers);
  const size_t element = layout_.element_bytes();
  for (int l = 0; l < layout_.n_layers; ++l) {
    layers.emplace_back(kv_ + layout_.BlockOffset(l, block) * element, layout_.block_bytes());
  }
  return layers;
}

void TierLink::Spill(int32_t block, const BlockHash& hash) {
  const std::vector<std::span<const uint8_t>> layers = Layers<std::span<const uint8_t>>(block);
  if (tier_->Store(hash, layers)) {
    ++stats_.spilled;
  } else {
    ++stats_.spills_refused;
  }
}

int TierLink::Probe(std::span<const BlockHash> hashes) const {
  int n = 0;
  while (n < static_cast<int>(hashes.size()) && tier_->Contains(hashes[n])) ++n;
  return n;
}

TierLink::Fetch TierLink::Start(std::span<const BlockHash> hashes, std::span<const int32_t> blocks,
                                absl::Time deadline) {
  CHECK(hashes.size() == blocks.size()) << hashes.size() << " hashes, " << blocks.size();
  Fetch fetch;
  if (hashes.empty()) return fetch;
  ++stats_.fetches;
  fetch.deadline_ = deadline;
  fetch.active_ = true;
  for (size_t i = 0; i < hashes.size(); ++i) {
    const std::vector<std::span<uint8_t>> layers = Layers<std::span<uint8_t>>(blocks[i]);
    fetch.tickets_.push_back(tier_->Load(hashes[i], layers));
    fetch.slots_.push_back(Fetch::Slot::kPending);
    ++stats_.blocks_fetched;
  }
  return fetch;
}

bool TierLink::Poll(Fetch& fetch, absl::Time now) {
  if (!fetch.active_) return true;
  for (size_t i = 0; i < fetch.slots_.size(); ++i) {
    if (fetch.slots_[i] != Fetch::Slot::kPending) continue;
    const KvTier::LoadState state = tier_->Poll(fetch.tickets_[i]);
    if (!state.done) continue;
    if (state.hit) {
      fetch.slots_[i] = Fetch::Slot::kHit;
      continue;
    }
    fetch.slots_[i] = Fetch::Slot::kMiss;
    ++stats_.blocks_missed;
    // The blocks after a miss are computed anyway.
    CancelFrom(fetch, i + 1, Fetch::Slot::kUnneeded);
    break;
  }
  // Over when no load that could still count is out: every slot before
  // the first non-hit is a hit, and that one is not pending.
  bool over = true;
  for (Fetch::Slot slot : fetch.slots_) {
    if (slot == Fetch::Slot::kHit) continue;
    over = slot != Fetch::Slot::kPending;
    break;
  }
  if (!over && now < fetch.deadline_) return false;
  End(fetch);
  return true;
}

void TierLink::Cancel(Fetch& fetch) {
  if (fetch.active_) End(fetch);
}

void TierLink::CancelFrom(Fetch& fetch, size_t from, Fetch::Slot why) {
  for (size_t i = from; i < fetch.slots_.size(); ++i) {
    if (fetch.slots_[i] != Fetch::Slot::kPending) continue;
    tier_->Cancel(fetch.tickets_[i]);
    fetch.slots_[i] = why;
    ++(why == Fetch::Slot::kUnneeded ? stats_.blocks_unneeded : stats_.blocks_late);
  }
}

void TierLink::End(Fetch& fetch) {
  // A load that finished before its cancel still counts: Poll it first.
  for (size_t i = 0; i < fetch.slots_.size(); ++i) {
    if (fetch.slots_[i] != Fetch::Slot::kPending) continue;
    const KvTier::LoadState state = tier_->Poll(fetch.tickets_[i]);
    if (!state.done) break;
    fetch.slots_[i] = state.hit ? Fetch::Slot::kHit : Fetch::Slot::kMiss;
    if (!state.hit) {
      ++stats_.blocks_missed;
      CancelFrom(fetch, i + 1, Fetch::Slot::kUnneeded);
      break;
    }
  }
  CancelFrom(fetch, 0, Fetch::Slot::kLate);
  int loaded = 0;
  while (loaded < static_cast<int>(fetch.slots_.size()) &&
         fetch.slots_[loaded] == Fetch::Slot::kHit) {
    ++loaded;
  }
  fetch.loaded_ = loaded;
  stats_.blocks_loaded += loaded;
  fetch.active_ = false;
}

}  // namespace tandem
