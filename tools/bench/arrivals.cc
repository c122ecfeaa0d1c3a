#include "tools/bench/arrivals.h"

#include <cmath>

namespace tandem::bench {

ArrivalGenerator::ArrivalGenerator(double rate, double burstiness, uint64_t seed)
    : instant_(!(rate > 0) || std::isinf(rate)),
      rng_(seed),
      // theta = 1 / (rate * burstiness) keeps the mean gap at 1 / rate.
      gamma_(burstiness > 0 ? burstiness : 1.0,
             instant_ ? 1.0 : 1.0 / (rate * (burstiness > 0 ? burstiness : 1.0))) {}

double ArrivalGenerator::NextGap() { return instant_ ? 0.0 : gamma_(rng_); }

}  // namespace tandem::bench
