// Conversions between the workers' protos (tandem.v1) and the engine's
// sampling and logprob types, shared by the prefill and decode services.
#ifndef TANDEM_COMMON_ENGINE_ENGINE_PROTO_H_
#define TANDEM_COMMON_ENGINE_ENGINE_PROTO_H_

#include "common/engine/logprobs.h"
#include "common/engine/sampler.h"
#include "tandem/v1/generate.pb.h"

namespace tandem {

// Unset top_p means 1, unset repetition_penalty 1, an unset seed 0. The map
// of logit_bias becomes a list sorted by id (deterministic order).
SamplingParams SamplingFromProto(const v1::SamplingParams& proto);

void LogprobToProto(const TokenLogprob& logprob, v1::TokenLogprob* proto);

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_ENGINE_PROTO_H_
