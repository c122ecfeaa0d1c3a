// Where time comes from. Deadlines, schedulers and routers read a Clock, never
// the wall clock, so that tests advance time by hand (FakeClock) and the same
// code can later run inside a discrete-event simulator.
#ifndef TANDEM_COMMON_BASE_CLOCK_H_
#define TANDEM_COMMON_BASE_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem {

// Thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // The process-wide real clock; never destroyed.
  static const Clock& Real();
};

// absl::Now().
class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

// Time stands still until Advance or Set. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(1)) : now_(start) {}

  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  void Set(absl::Time t) {
    absl::MutexLock lock(&mu_);
    now_ = t;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

// A deadline read on the wall clock (a transport's) as a time on `clock`,
// and back: the same time left. Infinite times stay infinite. Only the
// adapters between a transport and a core on another clock use them.
absl::Time FromRealTime(absl::Time real, const Clock& clock);
absl::Time ToRealTime(absl::Time on_clock, const Clock& clock);

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_CLOCK_H_
