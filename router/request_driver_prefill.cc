// RequestDriver's disaggregated path, in the order it runs: choosing a
// prefill worker and reserving on a decode worker (StartPrefill), the
// Prefill sent once the reservation is answered (SendPrefill), its answer
// and the Start that hands the first tokens to the decode worker
// (OnPrefillDone), and what happens when prefill fails.
#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "router/request_driver.h"
#include "router/routing_policy.h"

namespace tandem::router {
namespace {

// What the client sees when every prefill attempt failed: overload and
// deadlines keep their meaning; anything else means no prefill worker could
// serve the request.
absl::StatusCode PrefillFailureCode(absl::StatusCode worker_code) {
  switch (worker_code) {
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kDeadlineExceeded:
      return worker_code;
    default:
      return absl::StatusCode::kUnavailable;
  }
}

}  // namespace

absl::Duration PrefillAnswerBudget(absl::Duration per_unit, int prompt_tokens, int ahead) {
  const int prompt_units = std::max(1, (prompt_tokens + 1023) / 1024);
  return per_unit * (prompt_units + std::max(0, ahead));
}

void RequestDriver::FallBackToLocal(const std::string& detail) {
  const std::string failures =
      absl::StrCat("prefill failed on ", absl::StrJoin(prefill_errors_, "; and on "), detail);
  // A prefill worker lost (or its KV transfer) says nothing about the
  // request: the decode worker computes the prompt itself, and nothing has
  // reached the client yet. Overload, deadlines and refusals end it.
  if (last_prefill_code_ != absl::StatusCode::kUnavailable &&
      last_prefill_code_ != absl::StatusCode::kAborted &&
      last_prefill_code_ != absl::StatusCode::kDataLoss) {
    Finish(absl::Status(PrefillFailureCode(last_prefill_code_), failures));
    return;
  }
  LOG(WARNING) << "request " << request_id_ << ": " << failures
               << "; computing the prompt on the decode worker";
  absl::StrAppend(&why_, "; ", failures, ": local prefill");
  phase_ = Phase::kOpening;
  RunLocal();
}

void RequestDriver::StartPrefill() {
  PrefixRouter* const prefix = env_.options.prefix_router.get();
  prefill_watch_.reset();  // Before the worker it watches may go.
  while (true) {
    const std::vector<WorkerSnapshot> pool = env_.registry->Snapshot(WorkerRole::kPrefill);
    std::optional<Pick> pick = prefix != nullptr
                                   ? prefix->PickPrefill(pool, *prompt_blocks_, prefill_tried_)
                                   : PickPrefillWorker(pool, prefill_tried_);
    if (!pick.has_value()) {
      if (prefill_attempt_ == 0) {
        // The pool emptied since the decision: the decode worker can serve.
        absl::StrAppend(&why_, "; no prefill worker left, local prefill");
        RunLocal();
        return;
      }
      FallBackToLocal(" (no other healthy prefill worker to retry on)");
      return;
    }
    prefill_worker_ = env_.registry->Find(WorkerRole::kPrefill, pick->address);
    if (prefill_worker_ != nullptr) {
      absl::StrAppend(&why_, "; ", pick->reason);
      if (prefix != nullptr) {
        prefix->RecordPrompt(WorkerRole::kPrefill, pick->address, *prompt_blocks_);
      }
      break;
    }
    prefill_tried_.insert(pick->address);
  }
  std::weak_ptr<RequestDriver> weak = weak_from_this();
  prefill_watch_ = prefill_worker_->WatchUnresponsive(
      [weak, attempt = prefill_attempt_](const absl::Status& why) {
        if (std::shared_ptr<RequestDriver> self = weak.lock()) {
          self->Post([self, attempt, why] { self->OnPrefillWorkerUnresponsive(attempt, why); });
        }
      });
  local_ = false;
  decode_tried_.clear();
  decode_refusals_.clear();
  decode_all_full_ = true;
  // 1. Reserve KV blocks on a decode worker; its `reserved` sends the prefill.
  OpenDecode();
}

void RequestDriver::SendPrefill() {
  // 2. Prefill, shipping the KV cache to the reservation.
  phase_ = Phase::kPrefilling;
  v1::PrefillRequest request;
  request.set_request_id(StreamRequestId());
  request.mutable_tokens()->Assign(req_.prompt.begin(), req_.prompt.end());
  *request.mutable_sampling() = req_.sampling;
  request.set_kv_descriptor(reserved_.kv_descriptor());
  request.set_n(req_.n);
  if (req_.logprobs.has_value()) request.set_logprobs(*req_.logprobs);
  request.set_prompt_logprobs(req_.echo && req_.logprobs.has_value());
  request.mutable_stop_token_ids()->Assign(req_.stop_token_ids.begin(), req_.stop_token_ids.end());
  prefill_budget_ =
      PrefillAnswerBudget(env_.options.prefill_answer_timeout, static_cast<int>(req_.prompt.size()),
                          prefill_worker_->Snapshot().inflight);
  prefill_load_ = prefill_worker_->StartRequest();
  auto self = shared_from_this();
  const int attempt = prefill_attempt_;
  prefill_sent_us_ = SinceArrivalUs();
  prefill_call_ = prefill_worker_->channel().Prefill(
      std::move(request), std::min(deadline_, env_.clock->Now() + prefill_budget_),
      [self, attempt](absl::StatusOr<v1::PrefillResponse> response) {
        self->Post([self, attempt, response = std::move(response)]() mutable {
          self->OnPrefillDone(attempt, std::move(response));
        });
      });
}

void RequestDriver::OnPrefillDone(int attempt, absl::StatusOr<v1::PrefillResponse> response) {
  if (phase_ == Phase::kDone || attempt != prefill_attempt_) return;
  prefill_call_.reset();
  prefill_load_.reset();
  prefill_watch_.reset();
  if (!response.ok()) {
    if (response.status().code() == absl::StatusCode::kDeadlineExceeded && !OwnFault()) {
      // The answer budget ran out, not the request's deadline: the worker
      // is hung or far behind, and the request goes elsewhere, and so do
      // the others waiting on it.
      const absl::Status status = absl::UnavailableError(absl::StrCat(
          "no answer within ", absl::FormatDuration(prefill_budget_),
          " (--prefill_answer_timeout per 1024 prompt tokens and per request ahead); the "
          "worker may be hung"));
      prefill_worker_->MarkUnresponsive(
          absl::UnavailableError(absl::StrCat("request ", request_id_, " got ", status.message())));
      OnPrefillFailed(status);
      return;
    }
    OnPrefillFailed(response.status());
    return;
  }
  timeline_.prefill_call_us = SinceArrivalUs() - prefill_sent_us_;
  const v1::PrefillResponse& r = *response;
  if (r.extra_first_tokens_size() != req_.n - 1 || r.sampler_draws_size() != req_.n ||
      (req_.logprobs.has_value() && r.first_logprobs_size() != req_.n)) {
    Finish(absl::InternalError(
        absl::StrCat("prefill worker ", prefill_worker_->address(), " answered with ",
                     r.extra_first_tokens_size() + 1, " first tokens for ", req_.n,
                     " choices; is it a tandem prefill worker of this version?")));
    return;
  }
  disaggregated_ = true;
  prefill_address_ = prefill_worker_->address();
  timeline_.prefill_queue_us = r.queue_us();
  timeline_.prefill_us = r.prefill_us();
  timeline_.kv_transfer_us = r.kv_transfer_us();
  cached_tokens_ = r.cached_tokens();
  tier_tokens_ = r.tier_tokens();
  kv_bytes_ = r.kv_bytes();
  phase_ = Phase::kStreaming;
  if (req_.echo) EmitEcho(req_.logprobs.has_value() ? &r.prompt_logprobs() : nullptr);
  // The first tokens go to the client at once; then decoding starts.
  for (int i = 0; i < req_.n && phase_ != Phase::kDone; ++i) {
    const int32_t token = i == 0 ? r.first_token() : r.extra_first_tokens(i - 1);
    google::protobuf::RepeatedPtrField<v1::TokenLogprob> one;
    if (req_.logprobs.has_value()) *one.Add() = r.first_logprobs(i);
    Emit(i, {token}, req_.logprobs.has_value() ? &one : nullptr, /*from_prefill=*/true);
  }
  if (phase_ == Phase::kDone) return;
  if (ended_choices_ == req_.n) {
    // Every choice ended on its first token: the decode reservation goes.
    MaybeComplete();
    return;
  }
  // 3. The decode worker decodes from the first tokens on.
  v1::StartRequest start;
  start.set_first_token(r.first_token());
  start.mutable_extra_first_tokens()->CopyFrom(r.extra_first_tokens());
  start.mutable_sampler_draws()->CopyFrom(r.sampler_draws());
  SendStart(std::move(start));
}

void RequestDriver::SendStart(v1::StartRequest start) {
  decode_began_ = true;
  start.set_request_id(StreamRequestId());
  start.set_generation(reserved_.generation());
  auto self = shared_from_this();
  const int stream = stream_;
  start_call_ = decode_worker_->channel().Start(
      std::move(start), deadline_, [self, stream](absl::StatusOr<v1::StartResponse> response) {
        self->Post(
            [self, stream, status = response.status()] { self->OnStartDone(stream, status); });
      });
}

void RequestDriver::OnStartDone(int stream, absl::Status status) {
  if (phase_ == Phase::kDone || stream != stream_) return;
  start_call_.reset();
  if (status.ok()) return;
  if (std::optional<absl::Status> own = OwnFault()) {
    Finish(*own);
    return;
  }
  if (status.code() == absl::StatusCode::kUnavailable) decode_worker_->MarkUnavailable(status);
  // A moved stream whose new worker failed its Start: the client has its
  // tokens, so it moves once more when it can.
  const absl::Status cause = absl::UnavailableError(
      absl::StrCat("decode worker ", decode_address_,
                   " failed the Start of a moved stream: ", status.message()));
  if (resuming_ && CanMigrate(cause)) {
    AbandonAndMigrate(cause);
    return;
  }
  int tokens = 0;
  for (const Choice& c : choices_) tokens += c.tokens;
  Finish(absl::UnavailableError(absl::StrCat("decode worker ", decode_address_,
                                             " was lost mid-stream after ", tokens,
                                             " tokens: Start failed: ", status.ToString())));
}

void RequestDriver::OnPrefillWorkerUnresponsive(int attempt, const absl::Status& why) {
  if (phase_ != Phase::kPrefilling || attempt != prefill_attempt_ || prefill_call_ == nullptr) {
    return;
  }
  // The call's own end comes later, for an attempt that is over: ignored.
  prefill_call_->Cancel();
  prefill_call_.reset();
  prefill_load_.reset();
  prefill_watch_.reset();
  OnPrefillFailed(
      absl::UnavailableError(absl::StrCat("abandoned, the worker looks hung: ", why.message())));
}

void RequestDriver::OnPrefillFailed(const absl::Status& status) {
  decode_avoid_ = decode_address_;
  // Cancelling the decode stream frees the reservation; its end is stale.
  if (decode_call_ != nullptr) decode_call_->Cancel();
  decode_call_.reset();
  decode_load_.reset();
  ++stream_;
  if (std::optional<absl::Status> own = OwnFault()) {
    Finish(*own);
    return;
  }
  if (status.code() == absl::StatusCode::kUnavailable) prefill_worker_->MarkUnavailable(status);
  prefill_errors_.push_back(
      absl::StrCat("prefill worker ", prefill_worker_->address(), ": ", status.ToString()));
  LOG(WARNING) << "request " << request_id_ << ": prefill on " << prefill_worker_->address()
               << " failed: " << status
               << (prefill_attempt_ == 0 ? "; retrying on another prefill worker" : "");
  last_prefill_code_ = status.code();
  prefill_tried_.insert(prefill_worker_->address());
  if (++prefill_attempt_ >= 2) {
    FallBackToLocal("");
    return;
  }
  if (env_.options.metrics != nullptr) env_.options.metrics->prefill_retries.Increment();
  phase_ = Phase::kOpening;
  StartPrefill();
}

}  // namespace tandem::router
