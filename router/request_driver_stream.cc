// RequestDriver's client-facing stream: the tokens of each choice turned
// into text (detokenised against the token before), held back while a
// stop string may be starting, echoed prompts and logprobs, each choice's
// end and the request's.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/base/logging.h"
#include "router/request_driver.h"

namespace tandem::router {

std::vector<TokenLogprob> RequestDriver::Texts(
    const google::protobuf::RepeatedPtrField<v1::TokenLogprob>& in, int32_t prev) const {
  std::vector<TokenLogprob> out;
  out.reserve(in.size());
  auto text = [&](int32_t id) {
    absl::StatusOr<std::string> piece = env_.tokenizer->Decode(prev, id);
    return piece.ok() ? *std::move(piece) : std::string();
  };
  for (const v1::TokenLogprob& l : in) {
    TokenLogprob t{
        .token_id = l.token_id(), .logprob = l.logprob(), .token = text(l.token_id()), .top = {}};
    for (const v1::TopLogprob& a : l.top()) {
      t.top.push_back(
          {.token_id = a.token_id(), .logprob = a.logprob(), .token = text(a.token_id())});
    }
    prev = l.token_id();
    out.push_back(std::move(t));
  }
  return out;
}

void RequestDriver::EmitEcho(const google::protobuf::RepeatedPtrField<v1::TokenLogprob>* logprobs) {
  if (echo_sent_) return;
  echo_sent_ = true;
  GenerateEvent event;
  event.kind = GenerateEvent::Kind::kEcho;
  event.token_ids = req_.prompt;
  if (req_.prompt_text.has_value()) {
    event.text = *req_.prompt_text;
  } else if (env_.tokenizer != nullptr) {
    // The prompt's ids were checked against the vocabulary.
    event.text =
        DetokenizeIds(*env_.tokenizer, req_.prompt, /*skip_leading_bos=*/true).value_or("");
  }
  if (logprobs != nullptr) event.logprobs = Texts(*logprobs, req_.prompt[0]);
  Send(std::move(event));
}

void RequestDriver::Emit(int index, const std::vector<int32_t>& ids,
                         const google::protobuf::RepeatedPtrField<v1::TokenLogprob>* logprobs,
                         bool from_prefill) {
  Choice& c = choices_[index];
  if (c.ended) return;  // Ended by the router; the worker goes on until told.
  NoteProgress();
  if (req_.echo && !echo_sent_) EmitEcho(nullptr);
  GenerateEvent event;
  event.kind = GenerateEvent::Kind::kTokens;
  event.index = index;
  google::protobuf::RepeatedPtrField<v1::TokenLogprob> kept;
  for (size_t k = 0; k < ids.size(); ++k) {
    const int32_t id = ids[k];
    if (c.finish.has_value()) break;
    // Workers never return more than max_tokens; a faulty one is cut here.
    if (c.tokens >= *req_.max_tokens) break;
    if (std::find(req_.stop_token_ids.begin(), req_.stop_token_ids.end(), id) !=
        req_.stop_token_ids.end()) {
      // The prefill worker's first token can be EOS; it is not returned.
      c.finish = FinishReason::kEos;
      break;
    }
    event.token_ids.push_back(id);
    c.ids.push_back(id);
    if (logprobs != nullptr) *kept.Add() = (*logprobs)[static_cast<int>(k)];
    ++c.tokens;
    if (c.detok.has_value()) {
      absl::StatusOr<std::string> piece = c.detok->Push(id);
      if (!piece.ok()) {
        LOG(WARNING) << "request " << request_id_ << ": " << piece.status();
      } else {
        event.text += c.stop->Push(*piece);
        if (c.stop->stopped()) c.finish = FinishReason::kStop;
      }
    }
    if (from_prefill && !c.finish.has_value() && c.tokens >= *req_.max_tokens) {
      c.finish = FinishReason::kLength;
    }
  }
  if (logprobs != nullptr && env_.tokenizer != nullptr) event.logprobs = Texts(kept, c.prev);
  if (!event.token_ids.empty()) c.prev = event.token_ids.back();
  if (!event.token_ids.empty() || !event.text.empty()) {
    if (timeline_.first_token_us == 0) timeline_.first_token_us = SinceArrivalUs();
    if (RouterMetrics* m = env_.options.metrics; m != nullptr && index == 0) {
      const absl::Time now = env_.clock->Now();
      if (last_token_sent_ == absl::Time()) {
        m->time_to_first_token.Observe(metrics::Seconds(now - arrival_));
      } else {
        m->inter_token_latency.Observe(metrics::Seconds(now - last_token_sent_));
      }
      last_token_sent_ = now;
    }
    if (!Send(std::move(event))) return;
  }
  if (c.finish.has_value()) {
    EndChoice(index);
    MaybeComplete();
  }
}

void RequestDriver::EndChoice(int index) {
  Choice& c = choices_[index];
  if (c.ended) return;
  c.ended = true;
  ++ended_choices_;
  GenerateEvent event;
  event.kind = GenerateEvent::Kind::kFinished;
  event.index = index;
  if (c.detok.has_value() && !c.stop->stopped()) {
    event.text = c.stop->Push(c.detok->Flush());
    // A stop string can no longer complete: what was held back is text.
    if (!c.stop->stopped()) event.text += c.stop->Flush();
  }
  if (c.stop->stopped()) c.finish = FinishReason::kStop;
  event.finish_reason = c.finish.value_or(FinishReason::kUnspecified);
  event.prompt_tokens = static_cast<int>(req_.prompt.size());
  event.cached_tokens = cached_tokens_;
  event.completion_tokens = c.tokens;
  timeline_.end_us = SinceArrivalUs();
  event.timeline = timeline_;
  event.prefill_worker = prefill_address_;
  event.decode_worker = decode_address_;
  event.disaggregated = disaggregated_;
  Send(std::move(event));
}

void RequestDriver::MaybeComplete() {
  if (phase_ == Phase::kDone || ended_choices_ < req_.n) return;
  // Choices the router ended (stop strings, EOS from prefill) may still run
  // on the worker: Finish cancels the stream, which frees its blocks.
  Finish(absl::OkStatus());
}

bool RequestDriver::Send(GenerateEvent event) {
  if (client_gone_) return false;
  if (!sink_->OnEvent(std::move(event))) {
    client_gone_ = true;
    Finish(absl::CancelledError("the client went away"));
    return false;
  }
  return true;
}

void RequestDriver::Finish(absl::Status status) {
  if (phase_ == Phase::kDone) return;
  phase_ = Phase::kDone;
  // A stream whose every choice the worker finished ends by itself.
  if (decode_call_ != nullptr && !(status.ok() && worker_finished_ == stream_choices_)) {
    decode_call_->Cancel();
  }
  if (prefill_call_ != nullptr) prefill_call_->Cancel();
  if (start_call_ != nullptr) start_call_->Cancel();
  if (handoff_.has_value()) {
    handoff_->stream->Cancel();
    if (handoff_->call != nullptr) handoff_->call->Cancel();
    handoff_.reset();
  }
  CancelReserveTimer();
  CancelStallTimer();
  LeaveDecodeQueue(/*admitted=*/false);
  decode_watch_.reset();
  if (status.ok() && decode_began_ && prompt_blocks_.has_value()) {
    for (const Choice& c : choices_) {
      env_.options.prefix_router->RecordFinished(decode_address_, *prompt_blocks_, c.ids);
    }
  }
  if (timeline_.end_us == 0) timeline_.end_us = SinceArrivalUs();
  // Counted before the client learns the status, so that a client that
  // scrapes the metrics after its request ended sees it counted.
  Log(status);
  sink_->OnDone(std::move(status));
  if (on_end_) on_end_();
}

}  // namespace tandem::router
