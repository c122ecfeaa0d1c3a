#include "common/base/clock.h"

namespace tandem {

const Clock& Clock::Real() {
  static const RealClock* const clock = new RealClock();
  return *clock;
}

}  // namespace tandem
