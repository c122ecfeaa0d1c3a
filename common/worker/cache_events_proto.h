// A worker's prefix cache events (common/kvcache/cache_events.h) in
// worker.proto's form: what GetStats serves to the router after the cursor
// it asks for, and what the router reads back.
#ifndef TANDEM_COMMON_WORKER_CACHE_EVENTS_PROTO_H_
#define TANDEM_COMMON_WORKER_CACHE_EVENTS_PROTO_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kvcache/cache_events.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

// The most events one GetStats reply carries, whatever the caller asks
// (8192 hashes: 128 KiB); a caller that is behind asks again.
inline constexpr int kMaxCacheEventsPerReply = 8192;

// A random, nonzero cache_epoch for a worker process: a restarted worker
// has another.
uint64_t NewCacheEpoch();

// Sets `reply`'s cache_epoch (`epoch`), cache_events, cache_events_next and
// cache_events_lost for `request` (see worker.proto) from `log`: the
// worker's BlockPool events, which its scheduling thread copies into the
// log where it publishes its stats (CacheEventLog::CatchUp), so that
// GetStats reads them on a gRPC thread without waiting for that thread.
void CacheEventsReply(const CacheEventLog& log, uint64_t epoch, const v1::StatsRequest& request,
                      v1::WorkerStats* reply);

// Appends `events` to `reply`'s cache_events, a run of one kind per
// CacheEvent.
void CacheEventsToProto(std::span<const CacheEvent> events, v1::WorkerStats* reply);
// The events of `reply` in order; INVALID_ARGUMENT for a malformed one (an
// unknown kind, hashes on CLEARED, halves of unequal counts).
absl::StatusOr<std::vector<CacheEvent>> CacheEventsFromProto(const v1::WorkerStats& reply);

}  // namespace tandem

#endif  // TANDEM_COMMON_WORKER_CACHE_EVENTS_PROTO_H_
