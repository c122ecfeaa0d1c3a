#include "router/worker_cache_events.h"

#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/logging.h"
#include "common/worker/cache_events_proto.h"

namespace tandem::router {

void WorkerCacheEvents::FillRequest(v1::StatsRequest* request) const {
  absl::MutexLock lock(&mu_);
  request->set_cache_epoch(epoch_);
  request->set_cache_events_after(cursor_);
  request->set_max_cache_events(kMaxPerPoll);
}

void WorkerCacheEvents::Receive(const v1::StatsRequest& request, const v1::WorkerStats& reply) {
  if (reply.cache_epoch() == 0) return;
  absl::StatusOr<std::vector<CacheEvent>> events = CacheEventsFromProto(reply);
  absl::MutexLock lock(&mu_);
  if (request.cache_epoch() != epoch_ || request.cache_events_after() != cursor_) return;
  if (reply.cache_epoch() != epoch_ || reply.cache_events_lost() || !events.ok()) {
    if (!events.ok()) LOG(WARNING) << "ignoring a worker's cache events: " << events.status();
    // Nothing known of the worker holds: every tier is cleared.
    for (CacheTier tier : kCacheTiers) log_.Record(CacheEventKind::kCleared, {}, tier);
  }
  epoch_ = reply.cache_epoch();
  cursor_ = reply.cache_events_next();
  if (!events.ok()) return;
  for (const CacheEvent& e : *events) log_.Record(e.kind, e.hash, e.tier);
}

bool WorkerCacheEvents::reporting() const {
  absl::MutexLock lock(&mu_);
  return epoch_ != 0;
}

CacheEventBatch WorkerCacheEvents::Read(uint64_t after, int max_events) const {
  absl::MutexLock lock(&mu_);
  return log_.Read(after, max_events);
}

}  // namespace tandem::router
