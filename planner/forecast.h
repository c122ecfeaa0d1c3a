// Load forecasts for the planner: the request rate some time ahead (about
// as long as a new worker takes to start), from the rates observed so far.
// Each takes samples in time order and is a pure function of them.
#ifndef TANDEM_PLANNER_FORECAST_H_
#define TANDEM_PLANNER_FORECAST_H_

#include <deque>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tandem::planner {

// Thread-compatible: the planner's loop observes and predicts on one thread.
class Forecaster {
 public:
  virtual ~Forecaster() = default;
  // The rate observed over the interval that ended at `at` (req/s).
  virtual void Observe(absl::Time at, double rate) = 0;
  // The rate expected at `at`; 0 before any sample.
  virtual double Predict(absl::Time at) const = 0;
};

// The last rate observed, held.
class ConstantForecaster final : public Forecaster {
 public:
  void Observe(absl::Time, double rate) override { last_ = rate; }
  double Predict(absl::Time) const override { return last_; }

 private:
  double last_ = 0;
};

// The least-squares line through the samples of the last `window`,
// extended to the time asked for (never below zero). With one sample, or
// samples all at one time, the mean.
class TrendForecaster final : public Forecaster {
 public:
  explicit TrendForecaster(absl::Duration window) : window_(window) {}
  void Observe(absl::Time at, double rate) override;
  double Predict(absl::Time at) const override;

 private:
  const absl::Duration window_;
  std::deque<std::pair<absl::Time, double>> samples_;
};

// "constant" or "trend" (over `window`); INVALID_ARGUMENT naming both for
// another name.
absl::StatusOr<std::unique_ptr<Forecaster>> MakeForecaster(absl::string_view name,
                                                           absl::Duration window);

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_FORECAST_H_
