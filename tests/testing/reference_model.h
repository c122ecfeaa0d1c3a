// A plain float64 Llama forward pass, written for clarity rather than speed:
// no paging, no batching, no fused weights. Tests compare the engine with it.
#ifndef TANDEM_TESTS_TESTING_REFERENCE_MODEL_H_
#define TANDEM_TESTS_TESTING_REFERENCE_MODEL_H_

#include <cstdint>
#include <span>
#include <vector>

#include "common/model/model_weights.h"

namespace tandem::testing {

// Logits after each token of `tokens` (positions 0..n-1), [n][vocab].
std::vector<std::vector<double>> ReferenceLogits(const ModelWeights& weights,
                                                 std::span<const int32_t> tokens);

// max_i |actual_i - expected_i| / max_i |expected_i|: the error relative to
// the scale of the logits (per-element relative error is meaningless for
// logits near zero).
double MaxRelativeError(std::span<const float> actual, std::span<const double> expected);

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_TESTING_REFERENCE_MODEL_H_
