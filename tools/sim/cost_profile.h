// Cost models for the simulator from measured step times. A profile times
// one step of each shape of a grid (prompt chunks of several lengths;
// decode batches of several sizes at several context lengths) on a step
// executor, and fits LinearStepCost to the times: the coefficients, each at
// least zero, that minimise the squared relative error over the grid, with
// decode rows' tokens and keys apart from prompt tokens' (a decode row
// reads its whole context and the weights as a matrix-vector product; a
// prompt chunk shares both across its tokens). The
// profile, its fit and the fit's error go to a small JSON file that
// tandem-sim reads (--profile), refusing one made for another model shape.
#ifndef TANDEM_TOOLS_SIM_COST_PROFILE_H_
#define TANDEM_TOOLS_SIM_COST_PROFILE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/engine/engine.h"
#include "common/engine/simulated_executor.h"
#include "common/model/model_config.h"
#include "nlohmann/json.hpp"

namespace tandem::sim {

struct ProfileGrid {
  std::vector<int> prompt_tokens = {16, 64, 256, 512};
  std::vector<int> decode_batches = {1, 4, 16, 32};
  std::vector<int> decode_contexts = {64, 256, 1024};
  // Each shape is timed this many times after one untimed run; the
  // median counts.
  int repeats = 3;
};

struct ProfilePoint {
  StepShape shape;
  double seconds = 0;
};

struct CostProfile {
  // What it was measured on, for the reader.
  std::string backend;
  int threads = 0;
  std::string weights_dtype;
  ModelConfig config;
  std::vector<ProfilePoint> points;
  LinearStepCost fit;
  // |fitted - measured| / measured over the points.
  double median_error = 0;
  double max_error = 0;
};

// The non-negative coefficients that minimise the squared relative error
// of LinearStepCost over `points` (every subset of the six coefficients
// is solved by least squares; the best whose coefficients are all >= 0
// wins). INVALID_ARGUMENT with no points or a non-positive time.
absl::StatusOr<LinearStepCost> FitLinear(const std::vector<ProfilePoint>& points);

// Times `grid` on `executor` (which steps sequences of `engine`'s block
// pool), reading time on `clock`, and fits the model. The grid's contexts
// and chunks must fit the model's context and the pool; INVALID_ARGUMENT
// naming what does not; the executor's errors.
absl::StatusOr<CostProfile> MeasureProfile(StepExecutor& executor, Engine& engine,
                                           const Clock& clock, const ProfileGrid& grid);

// Blocks `grid` needs at once in a pool of `block_size`-token blocks.
int ProfileBlocks(const ProfileGrid& grid, int block_size);

nlohmann::json ProfileJson(const CostProfile& profile);
// INVALID_ARGUMENT naming the field for a malformed profile.
absl::StatusOr<CostProfile> ParseProfile(const nlohmann::json& json);
// INVALID_ARGUMENT when `profile` was measured on a model of another shape
// than `config` (layers, widths, heads, vocabulary).
absl::Status CheckProfileShape(const CostProfile& profile, const ModelConfig& config);

// `cost` with every step's time multiplied by `scale` (a profile brought to
// what a serving worker takes); INVALID_ARGUMENT unless 0 < scale <= 100.
absl::StatusOr<StepCostFn> ScaleCost(StepCostFn cost, double scale);

}  // namespace tandem::sim

#endif  // TANDEM_TOOLS_SIM_COST_PROFILE_H_
