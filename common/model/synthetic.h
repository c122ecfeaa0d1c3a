// Models with deterministic random weights, for tests and benchmarks of any
// shape. Weights are scaled (uniform, variance 1/fan_in; norms near 1) so
// that activations stay in a sane range through many layers.
#ifndef TANDEM_COMMON_MODEL_SYNTHETIC_H_
#define TANDEM_COMMON_MODEL_SYNTHETIC_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"

namespace tandem {

// Same config and seed give the same weights on every machine.
absl::StatusOr<std::unique_ptr<ModelWeights>> MakeSyntheticModel(const ModelConfig& config,
                                                                  uint64_t seed);

// Shapes of the TinyStories checkpoints, used by benchmarks.
ModelConfig Stories15MShape();
ModelConfig Stories110MShape();

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_SYNTHETIC_H_
