// hf_reference.py, an independent numpy reference of the hub architectures,
// run from the engine tests.
#ifndef TANDEM_TESTS_UNIT_ENGINE_NUMPY_REFERENCE_H_
#define TANDEM_TESTS_UNIT_ENGINE_NUMPY_REFERENCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::testing {

// The logits hf_reference.py (numpy, run by Debian's python3) computes for
// `tokens` on the f32/f16/bf16 hub folder `dir`, single-file safetensors:
// [position][vocab].
absl::StatusOr<std::vector<std::vector<double>>> NumpyReferenceLogits(
    const std::string& dir, const std::vector<int32_t>& tokens);

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UNIT_ENGINE_NUMPY_REFERENCE_H_
