#include "common/worker/cache_events_proto.h"

#include <algorithm>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

v1::CacheEvent::Kind KindToProto(CacheEventKind kind) {
  switch (kind) {
    case CacheEventKind::kStored:
      return v1::CacheEvent::STORED;
    case CacheEventKind::kEvicted:
      return v1::CacheEvent::EVICTED;
    case CacheEventKind::kCleared:
      return v1::CacheEvent::CLEARED;
  }
  return v1::CacheEvent::KIND_UNSPECIFIED;
}

v1::CacheEvent::Tier TierToProto(CacheTier tier) {
  switch (tier) {
    case CacheTier::kPool:
      return v1::CacheEvent::TIER_POOL;
    case CacheTier::kSsd:
      return v1::CacheEvent::TIER_SSD;
    case CacheTier::kHost:
      return v1::CacheEvent::TIER_HOST;
  }
  return v1::CacheEvent::TIER_POOL;
}

}  // namespace

uint64_t NewCacheEpoch() {
  absl::BitGen gen;
  uint64_t epoch = 0;
  while (epoch == 0) epoch = absl::Uniform<uint64_t>(gen);
  return epoch;
}

void CacheEventsReply(const CacheEventLog& log, uint64_t epoch, const v1::StatsRequest& request,
                      v1::WorkerStats* reply) {
  reply->set_cache_epoch(epoch);
  // A cursor of another process means nothing here.
  const uint64_t after = request.cache_epoch() == epoch ? request.cache_events_after() : 0;
  const int max_events = std::min(request.max_cache_events(), kMaxCacheEventsPerReply);
  const CacheEventBatch batch = log.Read(after, max_events);
  CacheEventsToProto(batch.events, reply);
  reply->set_cache_events_next(batch.next);
  reply->set_cache_events_lost(batch.lost);
}

void CacheEventsToProto(std::span<const CacheEvent> events, v1::WorkerStats* reply) {
  v1::CacheEvent* run = nullptr;
  for (const CacheEvent& e : events) {
    const v1::CacheEvent::Kind kind = KindToProto(e.kind);
    const v1::CacheEvent::Tier tier = TierToProto(e.tier);
    if (run == nullptr || run->kind() != kind || run->tier() != tier ||
        kind == v1::CacheEvent::CLEARED) {
      run = reply->add_cache_events();
      run->set_kind(kind);
      run->set_tier(tier);
    }
    if (kind == v1::CacheEvent::CLEARED) continue;
    run->add_hashes_high(e.hash.high);
    run->add_hashes_low(e.hash.low);
  }
}

absl::StatusOr<std::vector<CacheEvent>> CacheEventsFromProto(const v1::WorkerStats& reply) {
  std::vector<CacheEvent> events;
  for (int i = 0; i < reply.cache_events_size(); ++i) {
    const v1::CacheEvent& run = reply.cache_events(i);
    if (run.hashes_high_size() != run.hashes_low_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cache event ", i, " has ", run.hashes_high_size(), " high and ",
                       run.hashes_low_size(), " low hash halves; they must pair up"));
    }
    CacheTier tier;
    switch (run.tier()) {
      case v1::CacheEvent::TIER_POOL:
        tier = CacheTier::kPool;
        break;
      case v1::CacheEvent::TIER_SSD:
        tier = CacheTier::kSsd;
        break;
      case v1::CacheEvent::TIER_HOST:
        tier = CacheTier::kHost;
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("cache event ", i, " has unknown tier ", static_cast<int>(run.tier())));
    }
    CacheEventKind kind;
    switch (run.kind()) {
      case v1::CacheEvent::STORED:
        kind = CacheEventKind::kStored;
        break;
      case v1::CacheEvent::EVICTED:
        kind = CacheEventKind::kEvicted;
        break;
      case v1::CacheEvent::CLEARED:
        if (run.hashes_high_size() != 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("cache event ", i, " is CLEARED but names hashes"));
        }
        events.push_back(CacheEvent{CacheEventKind::kCleared, {}, tier});
        continue;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("cache event ", i, " has unknown kind ", static_cast<int>(run.kind())));
    }
    for (int j = 0; j < run.hashes_high_size(); ++j) {
      events.push_back(CacheEvent{kind, BlockHash{run.hashes_high(j), run.hashes_low(j)}, tier});
    }
  }
  return events;
}

}  // namespace tandem
