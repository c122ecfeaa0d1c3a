#include "router/request_driver.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "router/routing_policy.h"

namespace tandem::router {

RequestDriver::RequestDriver(const DriverEnv& env, GenerateParams params, std::string request_id,
                             std::string worker_request_id, uint64_t fresh_seed, absl::Time arrival,
                             std::shared_ptr<ResponseSink> sink, std::function<void()> on_end)
    : env_(env),
      params_(std::move(params)),
      request_id_(std::move(request_id)),
      worker_request_id_(std::move(worker_request_id)),
      fresh_seed_(fresh_seed),
      arrival_(arrival),
      sink_(std::move(sink)),
      on_end_(std::move(on_end)) {}

void RequestDriver::Post(std::function<void()> step) {
  {
    absl::MutexLock lock(&strand_mu_);
    strand_.push_back(std::move(step));
    if (strand_running_) return;  // The running thread will get to it.
    strand_running_ = true;
  }
  while (true) {
    std::function<void()> next;
    {
      absl::MutexLock lock(&strand_mu_);
      if (strand_.empty()) {
        strand_running_ = false;
        return;
      }
      next = std::move(strand_.front());
      strand_.pop_front();
    }
    next();
  }
}

void RequestDriver::Run() {
  Post([self = shared_from_this()] { self->Begin(); });
}

void RequestDriver::Cancel() {
  if (cancelled_.exchange(true)) return;
  Post([self = shared_from_this()] {
    if (self->phase_ != Phase::kDone) {
      self->Finish(absl::CancelledError("the request was cancelled by the client"));
    }
  });
}

int64_t RequestDriver::SinceArrivalUs() const {
  return std::max<int64_t>(1, absl::ToInt64Microseconds(env_.clock->Now() - arrival_));
}

std::optional<absl::Status> RequestDriver::OwnFault() const {
  if (cancelled_) return absl::CancelledError("the request was cancelled by the client");
  if (client_gone_) return absl::CancelledError("the client went away");
  // gRPC ends calls at the deadline; the margin absorbs clock rounding.
  if (env_.clock->Now() >= deadline_ - absl::Milliseconds(5)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "the request did not finish within its deadline (",
        absl::ToInt64Milliseconds(deadline_ - arrival_),
        " ms); raise timeout_ms, the gRPC deadline or the router's --request_timeout"));
  }
  return std::nullopt;
}

void RequestDriver::Begin() {
  if (phase_ != Phase::kNew) return;  // Cancelled before it began.
  if (absl::Status s = Prepare(); !s.ok()) {
    Finish(s);
    return;
  }
  if (env_.options.prefix_router != nullptr) prompt_blocks_.emplace(req_.prompt);
  phase_ = Phase::kOpening;
  const int burst = env_.options.prefill_burst_queue;
  const PrefillDecision decision = DecidePrefill(
      env_.registry->Snapshot(WorkerRole::kPrefill), static_cast<int>(req_.prompt.size()),
      env_.options.local_prefill_tokens, burst,
      burst > 0 ? env_.registry->Snapshot(WorkerRole::kDecode) : std::vector<WorkerSnapshot>{});
  why_ = decision.reason;
  if (RouterMetrics* m = env_.options.metrics; m != nullptr && decision.burst) {
    m->burst_prefill_requests.Increment();
  }
  if (decision.local) {
    RunLocal();
  } else {
    StartPrefill();
  }
}

absl::Status RequestDriver::Prepare() {
  ASSIGN_OR_RETURN(req_, ValidateRequest(params_, {.tokenizer = env_.tokenizer,
                                                   .chat_template = env_.chat_template,
                                                   .served_model_name = env_.served_model_name,
                                                   .fresh_seed = fresh_seed_}));
  const absl::Duration timeout =
      params_.timeout > absl::ZeroDuration() ? params_.timeout : env_.options.request_timeout;
  deadline_ = std::min(params_.deadline, env_.clock->Now() + timeout);

  const std::vector<WorkerSnapshot> decode = env_.registry->Snapshot(WorkerRole::kDecode);
  const DecodePoolLimits limits = LimitsOf(decode);
  if (!limits.any_routable) {
    std::vector<std::string> unroutable;
    for (const WorkerSnapshot& s : decode) {
      const std::string why = !s.healthy   ? "unhealthy"
                              : s.draining ? "draining"
                              : s.disagreement.empty()
                                  ? "not yet checked against the pool"
                                  : absl::StrCat("out of the pool: it ", s.disagreement);
      unroutable.push_back(absl::StrCat(s.address, " (", why, ")"));
    }
    return absl::UnavailableError(absl::StrCat(
        "no healthy decode worker to serve the request",
        unroutable.empty() ? "" : absl::StrCat(" (", absl::StrJoin(unroutable, ", "), ")"),
        "; retry later"));
  }
  const int vocab_size = limits.vocab_size > 0       ? limits.vocab_size
                         : env_.tokenizer != nullptr ? env_.tokenizer->vocab_size()
                                                     : 0;
  RETURN_IF_ERROR(
      ResolveMaxTokens(req_, vocab_size, limits.max_context, env_.options.default_max_tokens));
  RETURN_IF_ERROR(
      CheckFitsKvPool(req_, limits.block_size, limits.max_kv_blocks, limits.max_context));
  choices_.resize(req_.n);
  for (Choice& c : choices_) {
    if (env_.tokenizer != nullptr) c.detok.emplace(*env_.tokenizer, req_.prompt.back());
    c.stop.emplace(req_.stop);
    c.prev = req_.prompt.back();
  }
  return absl::OkStatus();
}

std::string RequestDriver::StreamRequestId() const {
  return absl::StrCat(worker_request_id_, ".", decode_streams_opened_ - 1);
}

v1::DecodeRequest RequestDriver::MakeDecodeRequest(bool local) {
  v1::DecodeRequest r;
  ++decode_streams_opened_;
  r.set_request_id(StreamRequestId());
  r.mutable_prompt()->Assign(req_.prompt.begin(), req_.prompt.end());
  *r.mutable_sampling() = req_.sampling;
  r.set_max_tokens(*req_.max_tokens);
  r.set_local_prefill(local);
  r.mutable_stop_token_ids()->Assign(req_.stop_token_ids.begin(), req_.stop_token_ids.end());
  r.set_n(req_.n);
  if (req_.logprobs.has_value()) r.set_logprobs(*req_.logprobs);
  r.set_prompt_logprobs(local && !resuming_ && req_.echo && req_.logprobs.has_value());
  r.set_priority(params_.priority);
  // A draining worker offers the stream (`moving`) only while it can move.
  r.set_movable(migrations_ < env_.options.max_migrations);
  stream_choices_ = req_.n;
  if (resuming_) {
    stream_choices_ = 0;
    for (const Choice& c : choices_) {
      v1::ResumedChoice* resumed = r.add_resume();
      resumed->set_finished(c.finish.has_value() || c.ended);
      if (resumed->finished()) continue;
      resumed->mutable_tokens()->Assign(c.ids.begin(), c.ids.end());
      ++stream_choices_;
    }
  }
  return r;
}

void RequestDriver::RunLocal() {
  local_ = true;
  decode_tried_.clear();
  decode_refusals_.clear();
  decode_all_full_ = true;
  OpenDecode();
}

void RequestDriver::OpenDecode() {
  if (JoinDecodeQueue()) return;
  std::optional<Pick> pick;
  std::shared_ptr<Worker> worker;
  PrefixRouter* const prefix = env_.options.prefix_router.get();
  while (decode_tried_.size() < 2) {
    const std::vector<WorkerSnapshot> pool = env_.registry->Snapshot(WorkerRole::kDecode);
    absl::flat_hash_set<std::string> exclude = decode_tried_;
    if (!decode_avoid_.empty()) exclude.insert(decode_avoid_);
    pick = prefix != nullptr ? prefix->PickDecode(pool, *prompt_blocks_, *req_.max_tokens, exclude)
                             : PickDecodeWorker(pool, static_cast<int>(req_.prompt.size()),
                                                *req_.max_tokens, exclude);
    if (!pick.has_value() && !decode_avoid_.empty()) {
      // No other worker: the one avoided may serve after all.
      decode_avoid_.clear();
      continue;
    }
    if (!pick.has_value()) break;
    worker = env_.registry->Find(WorkerRole::kDecode, pick->address);
    if (worker != nullptr) break;
    decode_tried_.insert(pick->address);
    decode_refusals_.push_back(absl::StrCat(pick->address, " left the pool"));
    pick.reset();
  }
  if (!pick.has_value()) {
    if (decode_refusals_.empty()) {
      Finish(absl::UnavailableError("no healthy decode worker to serve the request; retry later"));
      return;
    }
    absl::Status refusal(
        decode_all_full_ ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kUnavailable,
        absl::StrJoin(decode_refusals_, "; "));
    if (decode_all_full_ && CanWaitForDecode()) {
      WaitForDecode(std::move(refusal));
      return;
    }
    Finish(std::move(refusal));
    return;
  }
  absl::StrAppend(&why_, "; ", pick->reason);
  decode_watch_.reset();  // Before the worker it watches may go.
  decode_worker_ = std::move(worker);
  decode_address_ = decode_worker_->address();
  if (prefix != nullptr) {
    prefix->RecordPrompt(WorkerRole::kDecode, decode_address_, *prompt_blocks_);
  }
  decode_load_ = decode_worker_->StartRequest();
  const int64_t tokens = static_cast<int64_t>(req_.prompt.size()) + *req_.max_tokens;
  decode_load_->ReserveBlocks(
      req_.n * static_cast<int>(BlocksFor(std::min<int64_t>(tokens, INT32_MAX / kMaxChoices),
                                          decode_worker_->Snapshot().block_size)));
  if (timeline_.router_queue_us == 0) timeline_.router_queue_us = SinceArrivalUs();
  reserve_sent_us_ = SinceArrivalUs();
  const int stream = ++stream_;
  awaiting_first_ = true;
  worker_finished_ = 0;
  auto self = shared_from_this();
  CancelReserveTimer();  // An earlier stream's.
  if (!local_) {
    // The reservation gets its own deadline: a hung worker answers nothing,
    // and a transport notices only after its keepalive timeout. The timer
    // holds the driver weakly, or the two would keep each other.
    reserve_timer_ =
        env_.executor->PostAt(std::min(deadline_, env_.clock->Now() + env_.options.reserve_timeout),
                              [weak = weak_from_this(), stream] {
                                if (std::shared_ptr<RequestDriver> self = weak.lock()) {
                                  self->Post([self, stream] { self->OnReserveTimer(stream); });
                                }
                              });
  }
  // A worker that stops answering its health polls (hung, or cut off)
  // holds its streams until gRPC's keepalive notices; the stream moves on
  // as soon as the registry does.
  decode_watch_ =
      decode_worker_->WatchUnresponsive([weak = weak_from_this(), stream](const absl::Status& why) {
        if (std::shared_ptr<RequestDriver> self = weak.lock()) {
          self->Post([self, stream, why] { self->OnDecodeWorkerUnresponsive(stream, why); });
        }
      });
  decode_call_ = decode_worker_->channel().Generate(
      MakeDecodeRequest(local_), deadline_,
      [self, stream](v1::DecodeEvent event) {
        self->Post([self, stream, event = std::move(event)]() mutable {
          self->OnDecodeEvent(stream, std::move(event));
        });
      },
      [self, stream](absl::Status status) {
        self->Post(
            [self, stream, status = std::move(status)] { self->OnDecodeDone(stream, status); });
      });
}

void RequestDriver::CancelReserveTimer() {
  if (reserve_timer_ != 0) env_.executor->CancelTimer(reserve_timer_);
  reserve_timer_ = 0;
}

void RequestDriver::OnDecodeEvent(int stream, v1::DecodeEvent event) {
  if (phase_ == Phase::kDone || stream != stream_) return;
  if (awaiting_first_) {
    // The worker admitted the request and holds its blocks.
    awaiting_first_ = false;
    CancelReserveTimer();
    decode_load_->ConfirmReservation();
    LeaveDecodeQueue(/*admitted=*/true);
    if (!local_) {
      if (!event.has_reserved()) {
        Finish(absl::InternalError(
            absl::StrCat("decode worker ", decode_address_, " sent event ", event.event_case(),
                         " before `reserved`; is it a tandem decode worker of this version?")));
        return;
      }
      reserved_ = event.reserved();
      timeline_.reserve_us += SinceArrivalUs() - reserve_sent_us_;
      decode_held_tokens_ = reserved_.cached_tokens();
      if (handoff_.has_value()) {
        SendHandoff();
        return;
      }
      SendPrefill();
      return;
    }
    phase_ = Phase::kStreaming;
    decode_began_ = true;
  }
  HandleStreamEvent(event);
}

void RequestDriver::HandleStreamEvent(const v1::DecodeEvent& event) {
  if (event.has_moving()) {
    OnDecodeWorkerDraining(event.moving().ships_kv());
    return;
  }
  if (event.has_prompt_logprobs()) {
    if (!echo_sent_ && req_.echo) EmitEcho(&event.prompt_logprobs().logprobs());
    return;
  }
  if (event.has_tokens()) {
    const v1::DecodeTokens& t = event.tokens();
    if (t.index() < 0 || t.index() >= req_.n ||
        (t.logprobs_size() > 0 && t.logprobs_size() != t.ids_size())) {
      Finish(absl::InternalError(
          absl::StrCat("decode worker ", decode_address_, " sent a malformed tokens event")));
      return;
    }
    const std::vector<int32_t> ids(t.ids().begin(), t.ids().end());
    Emit(t.index(), ids, t.logprobs_size() > 0 ? &t.logprobs() : nullptr, false);
    return;
  }
  if (event.has_finished()) {
    const v1::DecodeFinished& f = event.finished();
    if (f.index() < 0 || f.index() >= req_.n) {
      Finish(absl::InternalError(absl::StrCat("decode worker ", decode_address_,
                                              " finished an unknown choice ", f.index())));
      return;
    }
    ++worker_finished_;
    timeline_.decode_queue_us = f.decode_queue_us();
    if (!disaggregated_ && !resuming_) {
      timeline_.prefill_us = f.prefill_us();
      cached_tokens_ = f.cached_tokens();
    }
    Choice& c = choices_[f.index()];
    if (!c.finish.has_value()) c.finish = FinishReasonFromProto(f.reason());
    if (!c.ended) EndChoice(f.index());
    MaybeComplete();
    return;
  }
  Finish(absl::InternalError(
      absl::StrCat("decode worker ", decode_address_, " sent an unexpected event mid-stream")));
}

void RequestDriver::OnDecodeDone(int stream, absl::Status status) {
  if (phase_ == Phase::kDone || stream != stream_) return;
  decode_watch_.reset();
  decode_call_.reset();
  decode_load_.reset();
  if (std::optional<absl::Status> own = OwnFault()) {
    Finish(*own);
    return;
  }
  if (handoff_.has_value()) {
    // The worker the stream moves to refused or failed before it started.
    if (status.code() == absl::StatusCode::kUnavailable) decode_worker_->MarkUnavailable(status);
    HandoffFailed(absl::Status(status.code(), absl::StrCat("decode worker ", decode_address_, ": ",
                                                           status.message())),
                  /*avoid_new=*/true);
    return;
  }
  if (awaiting_first_) {
    OnDecodeRefused(status);
    return;
  }
  if (status.ok() && ended_choices_ == req_.n) {
    MaybeComplete();
    return;
  }
  const absl::Status cause =
      status.ok() ? absl::InternalError("the stream ended without a finished event") : status;
  int tokens = 0;
  for (const Choice& c : choices_) tokens += c.tokens;
  if (phase_ == Phase::kPrefilling && tokens == 0 &&
      (cause.code() == absl::StatusCode::kUnavailable ||
       cause.code() == absl::StatusCode::kDataLoss)) {
    // The KV transfer failed (typically the prefill worker was lost while
    // sending, or a chunk's checksum did not match) and nothing reached the
    // client: the request starts over, its KV recomputed, on another
    // prefill worker.
    if (prefill_call_ != nullptr) prefill_call_->Cancel();
    prefill_call_.reset();
    prefill_load_.reset();
    OnPrefillFailed(absl::UnavailableError(absl::StrCat(
        "the KV transfer to decode worker ", decode_address_, " failed: ", cause.message())));
    return;
  }
  if (cause.code() == absl::StatusCode::kUnavailable) decode_worker_->MarkUnavailable(cause);
  if (CanMigrate(cause)) {
    Migrate(cause);
    return;
  }
  if (tokens > 0 || phase_ == Phase::kPrefilling) {
    Finish(absl::UnavailableError(absl::StrCat("decode worker ", decode_address_,
                                               " was lost mid-stream after ", tokens,
                                               " tokens: ", cause.ToString())));
    return;
  }
  Finish(absl::Status(cause.code(), absl::StrCat("decode worker ", decode_address_,
                                                 " failed the request: ", cause.message())));
}

void RequestDriver::OnDecodeRefused(absl::Status status) {
  if (std::optional<absl::Status> own = OwnFault()) {
    Finish(*own);
    return;
  }
  const std::string message = absl::StrCat(
      "decode worker ", decode_address_,
      " did not admit the request: ", status.ok() ? "its stream ended at once" : status.ToString());
  // The router did not cancel the call (OwnFault): a CANCELLED stream is
  // the worker's server shutting down with the call not yet in its hands
  // (a worker stopped by SIGTERM before the router saw it draining).
  const bool gone = status.code() == absl::StatusCode::kUnavailable ||
                    status.code() == absl::StatusCode::kCancelled;
  if (!gone && status.code() != absl::StatusCode::kResourceExhausted) {
    Finish(absl::Status(status.ok() ? absl::StatusCode::kInternal : status.code(), message));
    return;
  }
  // Gone, draining or full (its stats lag behind the router's other
  // requests): another decode worker can take the request.
  if (gone) {
    decode_worker_->MarkUnavailable(status);
    decode_all_full_ = false;
  }
  decode_tried_.insert(decode_address_);
  decode_refusals_.push_back(message);
  // A full worker is routine under load (the request waits for room, and
  // tandem_router_requests_waiting_decode counts it): not worth a line each.
  if (gone || !CanWaitForDecode()) {
    LOG(WARNING) << "request " << request_id_ << ": " << message
                 << (decode_tried_.size() < 2 ? "; trying another decode worker" : "");
  }
  OpenDecode();
}

void RequestDriver::OnReserveTimer(int stream) {
  if (phase_ == Phase::kDone || stream != stream_ || !awaiting_first_) return;
  reserve_timer_ = 0;
  // Cancelling the stream makes the worker free the reservation whenever
  // it gets to it; the stream's end is stale from here on.
  decode_call_->Cancel();
  decode_call_.reset();
  decode_load_.reset();
  ++stream_;
  const absl::Status why = absl::UnavailableError(
      absl::StrCat("no reservation within ", absl::FormatDuration(env_.options.reserve_timeout),
                   " (--reserve_timeout); the worker may be hung"));
  if (handoff_.has_value()) {
    // The move recomputes instead, elsewhere if it can: that worker may
    // only be busy, so it is not marked unavailable.
    HandoffFailed(absl::Status(why.code(), absl::StrCat("decode worker ", decode_address_, ": ",
                                                        why.message())),
                  /*avoid_new=*/true);
    return;
  }
  OnDecodeRefused(why);
}

}  // namespace tandem::router
