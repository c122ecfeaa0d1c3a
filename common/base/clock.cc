#include "common/base/clock.h"

#include "absl/time/clock.h"

namespace tandem {

const Clock& Clock::Real() {
  static const RealClock* const clock = new RealClock();
  return *clock;
}

absl::Time FromRealTime(absl::Time real, const Clock& clock) {
  if (real == absl::InfiniteFuture() || real == absl::InfinitePast()) return real;
  if (&clock == &Clock::Real()) return real;
  return clock.Now() + (real - absl::Now());
}

absl::Time ToRealTime(absl::Time on_clock, const Clock& clock) {
  if (on_clock == absl::InfiniteFuture() || on_clock == absl::InfinitePast()) return on_clock;
  if (&clock == &Clock::Real()) return on_clock;
  return absl::Now() + (on_clock - clock.Now());
}

}  // namespace tandem
