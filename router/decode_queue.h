// DecodeQueue: the requests that wait for a decode slot. When every decode
// worker the router can reach refuses a new request as full
// (RESOURCE_EXHAUSTED: its --max_sequences held, or its KV taken), the
// request's driver parks here instead of failing, and tries again when it
// is woken: by the end of any request (a slot may have freed), by the
// admission of the request ahead of it (there may be room for more), and,
// while any request waits, every `retry_interval` (a slot freed between
// a refusal and the park is not missed). Waiters are woken one at a time,
// higher priority first, then in arrival order; a request refused again
// parks at the place it had. The queue only wakes: each driver keeps its
// own deadline (the router's --queue_timeout, or the request's own) and
// leaves when it passes.
//
// Thread-safe. Created with std::make_shared (its timer holds it weakly).
#ifndef TANDEM_ROUTER_DECODE_QUEUE_H_
#define TANDEM_ROUTER_DECODE_QUEUE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/executor.h"

namespace tandem::router {

class DecodeQueue : public std::enable_shared_from_this<DecodeQueue> {
 public:
  // `executor` runs the retry timer; call Stop before it goes.
  DecodeQueue(Executor* executor, absl::Duration retry_interval);
  ~DecodeQueue();
  // Cancels the retry timer and arms no more.
  void Stop();
  DecodeQueue(const DecodeQueue&) = delete;
  DecodeQueue& operator=(const DecodeQueue&) = delete;

  // A request's place in arrival order: taken once, kept across parks.
  uint64_t NextPosition();
  // Parks a request at (priority, position); `wake` runs once, on the
  // thread that wakes it, outside the queue's lock, when it is its turn.
  // Parking a position already parked replaces its wake. The queue keeps
  // what `wake` captures until it runs or is removed (and destroys it
  // outside its lock).
  void Park(int priority, uint64_t position, std::function<void()> wake);
  // Takes a parked request out (it left: cancelled, expired); false if it
  // is not parked.
  bool Remove(uint64_t position);
  // Wakes the first parked request, if any.
  void WakeOne();
  int waiting() const;

 private:
  using Key = std::pair<int, uint64_t>;  // (-priority, position)
  void ArmRetryLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnRetryTimer();

  Executor* const executor_;
  const absl::Duration retry_interval_;
  mutable absl::Mutex mu_;
  uint64_t next_position_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<Key, std::function<void()>> parked_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, int> priority_of_ ABSL_GUARDED_BY(mu_);  // position -> priority
  Executor::TimerId retry_timer_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_DECODE_QUEUE_H_
