#include "decode_worker/decode_proto.h"

#include <utility>

#include "absl/time/time.h"
#include "common/engine/engine_proto.h"
#include "common/worker/finish_reason_proto.h"
#include "common/worker/worker_stats_proto.h"

namespace tandem::decode {
Request FromProto(const v1::DecodeRequest& request) {
  Request r;
  r.request_id = request.request_id();
  r.prompt.assign(request.prompt().begin(), request.prompt().end());
  r.sampling = SamplingFromProto(request.sampling());
  r.max_tokens = request.max_tokens();
  r.local_prefill = request.local_prefill();
  r.stop_token_ids.assign(request.stop_token_ids().begin(), request.stop_token_ids().end());
  r.n = request.n() == 0 ? 1 : request.n();
  if (request.has_logprobs()) r.logprobs = request.logprobs();
  r.prompt_logprobs = request.prompt_logprobs();
  r.priority = request.priority();
  r.movable = request.movable();
  for (const v1::ResumedChoice& c : request.resume()) {
    r.resume.push_back(
        {.tokens = {c.tokens().begin(), c.tokens().end()}, .finished = c.finished()});
  }
  return r;
}

v1::DecodeFinished ToProto(const Finished& finished) {
  v1::DecodeFinished f;
  f.set_reason(FinishReasonToProto(finished.reason));
  f.set_completion_tokens(finished.completion_tokens);
  f.set_decode_queue_us(absl::ToInt64Microseconds(finished.decode_queue));
  f.set_prefill_us(absl::ToInt64Microseconds(finished.prefill));
  f.set_kv_wait_us(absl::ToInt64Microseconds(finished.kv_wait));
  f.set_index(finished.index);
  f.set_cached_tokens(finished.cached_tokens);
  return f;
}

v1::WorkerStats ToProto(const LoopStats& s) {
  v1::WorkerStats w;
  WorkerStatsToProto(s, "decode", &w);
  return w;
}

void ProtoEventSink::OnReserved(const Reservation& reservation) {
  v1::DecodeEvent event;
  event.mutable_reserved()->set_kv_descriptor(reservation.kv_descriptor);
  event.mutable_reserved()->set_generation(reservation.generation);
  event.mutable_reserved()->set_cached_tokens(reservation.cached_tokens);
  write_(std::move(event));
}

void ProtoEventSink::OnPromptLogprobs(std::span<const TokenLogprob> logprobs) {
  v1::DecodeEvent event;
  for (const TokenLogprob& lp : logprobs) {
    LogprobToProto(lp, event.mutable_prompt_logprobs()->add_logprobs());
  }
  write_(std::move(event));
}

void ProtoEventSink::OnTokens(int index, std::span<const int32_t> ids,
                              std::span<const TokenLogprob> logprobs) {
  v1::DecodeEvent event;
  v1::DecodeTokens* tokens = event.mutable_tokens();
  tokens->set_index(index);
  tokens->mutable_ids()->Add(ids.begin(), ids.end());
  for (const TokenLogprob& lp : logprobs) LogprobToProto(lp, tokens->add_logprobs());
  write_(std::move(event));
}

void ProtoEventSink::OnMoving(bool ships_kv) {
  v1::DecodeEvent event;
  event.mutable_moving()->set_ships_kv(ships_kv);
  write_(std::move(event));
}

void ProtoEventSink::OnFinished(const Finished& finished) {
  v1::DecodeEvent event;
  *event.mutable_finished() = ToProto(finished);
  write_(std::move(event));
  if (finished.last) finish_(absl::OkStatus());
}

}  // namespace tandem::decode
