// The runner's clock in the bench tests: time moves only when the runner
// waits (it jumps to the time waited for) or a target says a request took
// time.
#ifndef TANDEM_TESTS_UNIT_BENCH_FAKE_RUN_CLOCK_H_
#define TANDEM_TESTS_UNIT_BENCH_FAKE_RUN_CLOCK_H_

#include <algorithm>
#include <mutex>

#include "tools/bench/runner.h"

namespace tandem::bench {

class FakeRunClock final : public RunClock {
 public:
  double Now() override {
    std::lock_guard lock(mu_);
    return now_;
  }
  void SleepUntil(double t) override {
    std::lock_guard lock(mu_);
    now_ = std::max(now_, t);
  }
  void Advance(double seconds) {
    std::lock_guard lock(mu_);
    now_ += seconds;
  }

 private:
  std::mutex mu_;
  double now_ = 1000;
};

}  // namespace tandem::bench

#endif  // TANDEM_TESTS_UNIT_BENCH_FAKE_RUN_CLOCK_H_
