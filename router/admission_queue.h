// AdmissionQueue: which requests the router serves now and which wait.
//
// Up to `max_running` requests run at once. Beyond that, up to `max_queued`
// wait, ordered by priority (a larger value first) and then by arrival;
// a request that has waited `timeout` leaves the queue (Expire). Only a full
// queue refuses a request at once. Pure bookkeeping over ids and times (no
// threads, no clock of its own), so it is tested on made-up times.
//
// Thread-compatible.
#ifndef TANDEM_ROUTER_ADMISSION_QUEUE_H_
#define TANDEM_ROUTER_ADMISSION_QUEUE_H_

#include <cstdint>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

namespace tandem::router {

class AdmissionQueue {
 public:
  enum class Decision {
    kRun,     // counted as running: start it now
    kQueued,  // waits for a running request to end
    kFull,    // refused: the queue is full
  };

  AdmissionQueue(int max_running, int max_queued, absl::Duration timeout);

  Decision Arrive(uint64_t id, int priority, absl::Time now);
  // A running request ended. The queued request to start in its place, if
  // any (then counted as running).
  std::optional<uint64_t> Finish();
  // Takes a queued request out (its client went away); false if it is not
  // queued.
  bool Remove(uint64_t id);
  // The queued requests that have waited `timeout` by `now`, taken out.
  std::vector<uint64_t> Expire(absl::Time now);

  int running() const { return running_; }
  int queued() const { return static_cast<int>(order_.size()); }
  // When the next queued request expires; InfiniteFuture when none waits.
  absl::Time next_expiry() const;

 private:
  // (-priority, arrival sequence): the set's first is the next to run.
  using Key = std::tuple<int, uint64_t>;
  struct Entry {
    Key key;
    absl::Time expires;
  };

  const int max_running_;
  const int max_queued_;
  const absl::Duration timeout_;
  int running_ = 0;
  uint64_t sequence_ = 0;
  std::set<std::pair<Key, uint64_t>> order_;
  std::set<std::pair<absl::Time, uint64_t>> expiries_;
  absl::flat_hash_map<uint64_t, Entry> entries_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_ADMISSION_QUEUE_H_
