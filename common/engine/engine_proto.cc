#include "common/engine/engine_proto.h"

#include <algorithm>

namespace tandem {

SamplingParams SamplingFromProto(const v1::SamplingParams& proto) {
  SamplingParams params;
  params.temperature = proto.temperature();
  params.top_k = proto.top_k();
  params.top_p = proto.has_top_p() ? proto.top_p() : 1.0f;
  params.min_p = proto.min_p();
  params.seed = proto.seed();
  params.presence_penalty = proto.presence_penalty();
  params.frequency_penalty = proto.frequency_penalty();
  params.repetition_penalty = proto.has_repetition_penalty() ? proto.repetition_penalty() : 1.0f;
  params.logit_bias.assign(proto.logit_bias().begin(), proto.logit_bias().end());
  std::sort(params.logit_bias.begin(), params.logit_bias.end());
  params.min_tokens = proto.min_tokens();
  return params;
}

void LogprobToProto(const TokenLogprob& logprob, v1::TokenLogprob* proto) {
  proto->set_token_id(logprob.token_id);
  proto->set_logprob(logprob.logprob);
  for (const TopLogprob& top : logprob.top) {
    v1::TopLogprob* t = proto->add_top();
    t->set_token_id(top.token_id);
    t->set_logprob(top.logprob);
  }
}

}  // namespace tandem
