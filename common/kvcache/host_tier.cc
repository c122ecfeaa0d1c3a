#include "common/kvcache/host_tier.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace tandem {

struct HostTier::State {
  State(HostTierOptions o, const KvTierIdentity& id, Executor* executor, KvTier* lower)
      : options(o), identity(id), payload_bytes(id.payload_bytes()), io(executor), below(lower) {}

  // A record never changes once made (DamageForTest aside); a load holds it
  // while it reads, so an eviction meanwhile only drops the index's hold.
  struct Record {
    std::unique_ptr<uint8_t[]> bytes;
    uint64_t checksum = 0;
    uint64_t seq = 0;  // its key in lru
  };
  struct Job {
    std::vector<std::span<uint8_t>> dst;
    std::shared_ptr<const Record> record;
    BlockHash hash;
    bool below = false;  // passed to the lower tier, as below_ticket
    uint64_t below_ticket = 0;
    bool done = false;
    bool hit = false;
    TierMiss miss = TierMiss::kAbsent;
  };

  // Drops the record of `hash`; returns it.
  std::shared_ptr<Record> Remove(const BlockHash& hash) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = entries.find(hash);
    if (it == entries.end()) return nullptr;
    std::shared_ptr<Record> record = std::move(it->second);
    entries.erase(it);
    lru.erase(record->seq);
    stats.used_bytes -= payload_bytes;
    --stats.records;
    events.Record(CacheEventKind::kEvicted, hash);
    return record;
  }

  void Finish(Job& job, bool hit, TierMiss miss) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    job.done = true;
    job.hit = hit;
    job.miss = miss;
    job.dst.clear();
    job.record.reset();
    if (hit) {
      ++stats.hits;
    } else {
      ++stats.misses[static_cast<int>(miss)];
    }
  }

  // Passes `job` to the lower tier when it holds the block; false when
  // there is none or it does not.
  bool PassDown(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (below == nullptr || !below->Contains(job.hash)) return false;
    job.below = true;
    job.below_ticket = below->Load(job.hash, job.dst);
    job.record.reset();
    return true;
  }

  // Verifies the record of load `ticket` (of `hash`) and copies it into
  // place, on the executor.
  void Read(uint64_t ticket, const BlockHash& hash);

  const HostTierOptions options;
  const KvTierIdentity identity;
  const size_t payload_bytes;
  Executor* const io;
  KvTier* const below;

  mutable absl::Mutex mu;
  bool closed ABSL_GUARDED_BY(mu) = false;
  absl::flat_hash_map<BlockHash, std::shared_ptr<Record>> entries ABSL_GUARDED_BY(mu);
  std::map<uint64_t, BlockHash> lru ABSL_GUARDED_BY(mu);  // seq -> hash, oldest first
  uint64_t next_seq ABSL_GUARDED_BY(mu) = 1;
  absl::flat_hash_map<uint64_t, Job> loads ABSL_GUARDED_BY(mu);
  uint64_t next_ticket ABSL_GUARDED_BY(mu) = 1;
  KvTierStats stats ABSL_GUARDED_BY(mu);
  CacheEventLog events;
};

void HostTier::State::Read(uint64_t ticket, const BlockHash& hash) {
  std::shared_ptr<const Record> record;
  {
    absl::MutexLock lock(&mu);
    auto it = loads.find(ticket);
    if (closed || it == loads.end() || it->second.done || it->second.below) return;
    record = it->second.record;
  }
  const bool verified = TierChecksum({record->bytes.get(), payload_bytes}) == record->checksum;
  absl::MutexLock lock(&mu);
  if (closed) return;
  if (!verified) {
    // Dropped, so that the router stops counting on it.
    auto e = entries.find(hash);
    if (e != entries.end() && e->second == record) Remove(hash);
  }
  auto it = loads.find(ticket);
  if (it == loads.end()) return;  // cancelled while verifying
  Job& job = it->second;
  if (!verified) {
    if (PassDown(job)) {
      ++stats.misses[static_cast<int>(TierMiss::kCorrupt)];
    } else {
      Finish(job, false, TierMiss::kCorrupt);
    }
    return;
  }
  // Under the lock, so that a Cancel returns only once the copy is over.
  const uint8_t* from = record->bytes.get();
  for (std::span<uint8_t> layer : job.dst) {
    std::memcpy(layer.data(), from, layer.size());
    from += layer.size();
  }
  stats.bytes_read += payload_bytes;
  Finish(job, true, TierMiss::kAbsent);
}

absl::StatusOr<std::unique_ptr<HostTier>> HostTier::Create(HostTierOptions options,
                                                           const KvTierIdentity& identity,
                                                           Executor* io,
                                                           std::unique_ptr<KvTier> below) {
  if (io == nullptr) return absl::InvalidArgumentError("the host tier needs an executor");
  if (identity.n_layers <= 0 || identity.payload_bytes() == 0) {
    return absl::InvalidArgumentError("the host tier's layout has no bytes");
  }
  if (options.capacity_bytes < identity.payload_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the host tier's bound (", options.capacity_bytes, " bytes) does not hold one block of ",
        identity.payload_bytes(), " bytes; give it more (--kv_host_tier_gib)"));
  }
  if (below != nullptr && !(below->identity() == identity)) {
    return absl::InvalidArgumentError("the tier below the host tier holds another layout");
  }
  auto state = std::make_shared<State>(options, identity, io, below.get());
  return std::unique_ptr<HostTier>(new HostTier(std::move(state), std::move(below)));
}

HostTier::HostTier(std::shared_ptr<State> state, std::unique_ptr<KvTier> below)
    : state_(std::move(state)), below_(std::move(below)) {}

HostTier::~HostTier() {
  absl::MutexLock lock(&state_->mu);
  state_->closed = true;
  state_->loads.clear();
}

const KvTierIdentity& HostTier::identity() const { return state_->identity; }

bool HostTier::Contains(const BlockHash& hash) const {
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->entries.contains(hash)) return true;
  }
  return below_ != nullptr && below_->Contains(hash);
}

bool HostTier::Store(const BlockHash& hash, std::span<const std::span<const uint8_t>> layers) {
  State& s = *state_;
  if (!s.identity.Fits(layers)) {
    absl::MutexLock lock(&s.mu);
    ++s.stats.stores_refused;
    return false;
  }
  auto record = std::make_shared<State::Record>();
  record->bytes = std::make_unique_for_overwrite<uint8_t[]>(s.payload_bytes);
  uint8_t* to = record->bytes.get();
  for (const auto& layer : layers) {
    std::memcpy(to, layer.data(), layer.size());
    to += layer.size();
  }
  record->checksum = TierChecksum({record->bytes.get(), s.payload_bytes});
  std::vector<std::pair<BlockHash, std::shared_ptr<State::Record>>> evicted;
  {
    absl::MutexLock lock(&s.mu);
    if (s.closed || s.entries.contains(hash)) {
      ++s.stats.stores_refused;
      return false;
    }
    record->seq = s.next_seq++;
    s.lru.emplace(record->seq, hash);
    s.entries.emplace(hash, record);
    s.stats.used_bytes += s.payload_bytes;
    ++s.stats.records;
    ++s.stats.stores;
    s.stats.bytes_written += s.payload_bytes;
    s.events.Record(CacheEventKind::kStored, hash);
    while (s.stats.used_bytes > s.options.capacity_bytes) {
      const BlockHash oldest = s.lru.begin()->second;
      evicted.emplace_back(oldest, s.Remove(oldest));
      ++s.stats.evictions;
    }
  }
  // Down to the next tier, outside the lock (it copies the bytes again).
  if (below_ != nullptr) {
    const size_t per_layer = s.payload_bytes / static_cast<size_t>(s.identity.n_layers);
    std::vector<std::span<const uint8_t>> spans(s.identity.n_layers);
    for (const auto& [old_hash, old] : evicted) {
      for (int l = 0; l < s.identity.n_layers; ++l) {
        spans[l] = {old->bytes.get() + l * per_layer, per_layer};
      }
      below_->Store(old_hash, spans);
    }
  }
  return true;
}

uint64_t HostTier::Load(const BlockHash& hash, std::span<const std::span<uint8_t>> layers) {
  State& s = *state_;
  const bool shaped = s.identity.Fits(layers);
  absl::MutexLock lock(&s.mu);
  const uint64_t ticket = s.next_ticket++;
  ++s.stats.loads;
  State::Job& job = s.loads[ticket];
  job.hash = hash;
  if (!shaped) {
    s.Finish(job, false, TierMiss::kAbsent);
    return ticket;
  }
  job.dst.assign(layers.begin(), layers.end());
  auto it = s.entries.find(hash);
  if (it == s.entries.end()) {
    if (s.PassDown(job)) {
      ++s.stats.misses[static_cast<int>(TierMiss::kAbsent)];
    } else {
      s.Finish(job, false, TierMiss::kAbsent);
    }
    return ticket;
  }
  State::Record& record = *it->second;
  s.lru.erase(record.seq);
  record.seq = s.next_seq++;
  s.lru.emplace(record.seq, hash);
  job.record = it->second;
  s.io->Post([state = state_, ticket, hash] { state->Read(ticket, hash); });
  return ticket;
}

KvTier::LoadState HostTier::Poll(uint64_t ticket) {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->loads.find(ticket);
  if (it == state_->loads.end()) return {.done = true, .hit = false, .miss = TierMiss::kAbsent};
  State::Job& job = it->second;
  if (job.below) {
    const LoadState below = state_->below->Poll(job.below_ticket);
    if (below.done) state_->loads.erase(it);
    return below;
  }
  if (!job.done) return {};
  const LoadState out{.done = true, .hit = job.hit, .miss = job.miss};
  state_->loads.erase(it);
  return out;
}

void HostTier::Cancel(uint64_t ticket) {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->loads.find(ticket);
  if (it == state_->loads.end()) return;
  if (it->second.below) {
    state_->below->Cancel(it->second.below_ticket);
  } else if (!it->second.done) {
    ++state_->stats.misses[static_cast<int>(TierMiss::kCancelled)];
  }
  state_->loads.erase(it);
}

KvTierStats HostTier::stats() const {
  absl::MutexLock lock(&state_->mu);
  return state_->stats;
}

CacheEventBatch HostTier::EventsAfter(uint64_t cursor, int max_events) const {
  return state_->events.Read(cursor, max_events);
}

bool HostTier::DamageForTest(const BlockHash& hash) {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->entries.find(hash);
  if (it == state_->entries.end()) return false;
  it->second->bytes[state_->payload_bytes / 2] ^= 0x5a;
  return true;
}

}  // namespace tandem
