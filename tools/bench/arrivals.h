// When requests are sent: Poisson or gamma inter-arrival times, as vLLM's
// `bench serve` draws them.
#ifndef TANDEM_TOOLS_BENCH_ARRIVALS_H_
#define TANDEM_TOOLS_BENCH_ARRIVALS_H_

#include <cstdint>
#include <random>

namespace tandem::bench {

// Draws gaps from a gamma distribution with shape `burstiness` and mean
// 1 / rate. burstiness 1 is a Poisson process; below 1 is burstier (more
// variance), above 1 more regular. A rate of 0 or infinity means "all at
// once" (every gap 0).
//
// Thread-compatible: one generator per schedule, drawn from one thread.
class ArrivalGenerator {
 public:
  ArrivalGenerator(double rate, double burstiness, uint64_t seed);

  // Seconds until the next request.
  double NextGap();

 private:
  bool instant_;
  std::mt19937_64 rng_;
  std::gamma_distribution<double> gamma_;
};

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_ARRIVALS_H_
