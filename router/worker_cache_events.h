// WorkerCacheEvents: the prefix cache events one worker reported to the
// router's stats polls (worker.proto StatsRequest / WorkerStats), kept in
// order for the PrefixIndex (router/prefix_index.h) to read after its own
// cursor.
//
// The registry's poller asks each worker for the events after the last one
// it received (FillRequest) and hands the reply over (Receive). What the
// router cannot follow becomes a kCleared event in the log, so that a
// reader forgets the worker's blocks: a new worker process (another
// cache_epoch: a restart), events the worker dropped before they were
// asked for (cache_events_lost), or a malformed reply.
//
// Thread-safe; the log keeps the latest kCapacity events (a reader further
// behind sees `lost` and clears in the same way): 384 KiB per worker at
// most, for a reader that syncs at every routed request.
#ifndef TANDEM_ROUTER_WORKER_CACHE_EVENTS_H_
#define TANDEM_ROUTER_WORKER_CACHE_EVENTS_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/kvcache/cache_events.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::router {

class WorkerCacheEvents {
 public:
  // Events asked for per poll (the worker caps it too).
  static constexpr int kMaxPerPoll = 8192;
  static constexpr int kCapacity = 2 * kMaxPerPoll;

  WorkerCacheEvents() = default;
  WorkerCacheEvents(const WorkerCacheEvents&) = delete;
  WorkerCacheEvents& operator=(const WorkerCacheEvents&) = delete;

  // Sets the cursor fields of the next poll's request.
  void FillRequest(v1::StatsRequest* request) const;
  // `reply` answered `request`. A reply without an epoch (a worker that
  // reports no events) changes nothing, nor does a late one (to a request
  // whose cursor is no longer the current one).
  void Receive(const v1::StatsRequest& request, const v1::WorkerStats& reply);

  // The worker has reported events (a reply with an epoch has arrived).
  bool reporting() const;
  CacheEventBatch Read(uint64_t after, int max_events) const;

 private:
  mutable absl::Mutex mu_;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t cursor_ ABSL_GUARDED_BY(mu_) = 0;
  CacheEventRing log_ ABSL_GUARDED_BY(mu_) = CacheEventRing(kCapacity);
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_WORKER_CACHE_EVENTS_H_
