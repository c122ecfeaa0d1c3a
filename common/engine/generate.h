// Generation of one sequence on an engine: prefill, then decode token by
// token until max tokens, the end of the context, or end-of-sequence.
// Continuous batching of many sequences is the scheduler's job; this is the
// single-stream path that tandem-generate and the exactness tests use.
#ifndef TANDEM_COMMON_ENGINE_GENERATE_H_
#define TANDEM_COMMON_ENGINE_GENERATE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/finish_reason.h"
#include "common/engine/engine.h"
#include "common/engine/sampler.h"

namespace tandem {

struct GenerateRequest {
  std::vector<int32_t> prompt;  // at least one token (BOS for an empty text prompt)
  int max_new_tokens = 16;
  SamplingParams sampling;
  // Generation stops (without emitting the token) at any of these ids; the
  // sampler masks them until sampling.min_tokens tokens were generated.
  std::vector<int32_t> eos_ids;
  int prefill_chunk = 0;  // tokens per prefill step; 0 = the whole prompt at once
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated tokens, EOS excluded
  FinishReason finish = FinishReason::kLength;
  absl::Duration ttft;     // start to the first sampled token
  absl::Duration prefill;  // prompt forward passes
  absl::Duration decode;   // forward passes of generated tokens
};

// Called with each new token; returning false stops generation
// (FinishReason::kStop), e.g. when the reader went away.
using TokenSink = std::function<bool(int32_t token)>;

// Runs `request` on a fresh sequence of `engine` and releases its blocks on
// every path. INVALID_ARGUMENT for an empty prompt, a prompt at or past the
// context, bad sampling parameters or token ids; RESOURCE_EXHAUSTED when the
// KV pool is too small.
absl::StatusOr<GenerateResult> Generate(Engine& engine, const GenerateRequest& request,
                                        const TokenSink& sink = nullptr);

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_GENERATE_H_
