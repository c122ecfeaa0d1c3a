#include "planner/forecast.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem::planner {

void TrendForecaster::Observe(absl::Time at, double rate) {
  samples_.emplace_back(at, rate);
  while (!samples_.empty() && samples_.front().first < at - window_) samples_.pop_front();
}

double TrendForecaster::Predict(absl::Time at) const {
  if (samples_.empty()) return 0;
  // Times in seconds from the first sample, so the sums stay small.
  const absl::Time origin = samples_.front().first;
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [t, y] : samples_) {
    const double x = absl::ToDoubleSeconds(t - origin);
    n += 1;
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const double mean = sy / n;
  const double spread = n * sxx - sx * sx;
  if (spread <= 1e-12) return std::max(0.0, mean);
  const double slope = (n * sxy - sx * sy) / spread;
  const double intercept = (sy - slope * sx) / n;
  return std::max(0.0, intercept + slope * absl::ToDoubleSeconds(at - origin));
}

absl::StatusOr<std::unique_ptr<Forecaster>> MakeForecaster(absl::string_view name,
                                                           absl::Duration window) {
  if (name == "constant") return std::make_unique<ConstantForecaster>();
  if (name == "trend") {
    if (window <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("the trend's window must be positive, e.g. 5m");
    }
    return std::make_unique<TrendForecaster>(window);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("the forecast is '", name, "'; give constant or trend"));
}

}  // namespace tandem::planner
