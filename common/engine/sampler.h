// Token sampling from logits: greedy, temperature, top-k, top-p, with a
// per-request seed so that the same seed gives the same tokens.
#ifndef TANDEM_COMMON_ENGINE_SAMPLER_H_
#define TANDEM_COMMON_ENGINE_SAMPLER_H_

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  int top_k = 0;             // 0 = no limit
  float top_p = 1.0f;        // 1 = no nucleus cut
  uint64_t seed = 0;

  // INVALID_ARGUMENT saying which parameter to change.
  absl::Status Validate() const;
};

// One request's sampler. Not thread-safe; cheap to create.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  int32_t Sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;  // fully specified by the standard: same stream everywhere
  std::vector<std::pair<float, int32_t>> candidates_;
};

// Index of the largest logit (the lowest index among equals).
int32_t Argmax(std::span<const float> logits);

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_SAMPLER_H_
