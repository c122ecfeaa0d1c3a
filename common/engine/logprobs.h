// Log-probabilities of tokens under the model's raw distribution: the
// log-softmax of a row of logits as the model produced it, before
// temperature, penalties, logit bias or min_tokens (what the OpenAI API
// reports), with the most likely alternatives.
#ifndef TANDEM_COMMON_ENGINE_LOGPROBS_H_
#define TANDEM_COMMON_ENGINE_LOGPROBS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "common/base/limits.h"

namespace tandem {

struct TopLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  friend bool operator==(const TopLogprob&, const TopLogprob&) = default;
};

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  // Most likely first, ties by lower id.
  std::vector<TopLogprob> top;
};

// The log-softmax of `logits` at `token`, and the `top` (clamped to [0,
// kMaxTopLogprobs] and to the row) most likely tokens. `token` must index
// the row. Reads the row twice; no copy of it.
TokenLogprob ComputeLogprob(std::span<const float> logits, int32_t token, int top);

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_LOGPROBS_H_
