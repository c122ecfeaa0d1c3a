// RequestDriver: a decode stream lost mid-stream moves to another decode
// worker (migration), and the stall deadline that finds a stream its
// worker no longer decodes.
#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/base/logging.h"
#include "router/request_driver.h"
#include "router/routing_policy.h"

namespace tandem::router {

bool RequestDriver::CanMigrate(const absl::Status& cause) const {
  if (migrations_ >= env_.options.max_migrations ||
      (cause.code() != absl::StatusCode::kUnavailable &&
       cause.code() != absl::StatusCode::kCancelled)) {
    return false;
  }
  int tokens = 0;
  for (const Choice& c : choices_) {
    // Every choice of a stream gets its first token at once; one without
    // is a stream that cannot be resumed.
    if (!c.finish.has_value() && !c.ended && c.ids.empty()) return false;
    tokens += c.tokens;
  }
  if (tokens == 0) return false;
  // Somewhere to go: a routable decode worker other than the lost one.
  return PickDecodeWorker(env_.registry->Snapshot(WorkerRole::kDecode),
                          static_cast<int>(req_.prompt.size()), *req_.max_tokens, {decode_address_})
      .has_value();
}

void RequestDriver::Migrate(const absl::Status& cause, bool planned) {
  for (Choice& c : choices_) {
    // Its last token came but not its end: it is over.
    if (!c.finish.has_value() && !c.ended && c.tokens >= *req_.max_tokens) {
      c.finish = FinishReason::kLength;
    }
  }
  for (int i = 0; i < req_.n; ++i) {
    if (choices_[i].finish.has_value() && !choices_[i].ended) EndChoice(i);
  }
  if (phase_ == Phase::kDone) return;
  if (ended_choices_ == req_.n) {
    MaybeComplete();
    return;
  }
  ++migrations_;
  migrated_from_.push_back(decode_address_);
  // The next stream's tokens set their own pace.
  CancelStallTimer();
  token_gap_ = absl::ZeroDuration();
  stream_tokens_ = 0;
  if (planned) ++drain_moves_;
  if (RouterMetrics* m = env_.options.metrics; m != nullptr) {
    m->migrations.Increment();
    if (planned) m->drain_moves.Increment();
  }
  if (planned) {
    LOG(INFO) << "request " << request_id_ << ": " << cause.message()
              << "; resuming on another decode worker (migration " << migrations_ << " of at most "
              << env_.options.max_migrations << ")";
  } else {
    LOG(WARNING) << "request " << request_id_ << ": decode worker " << decode_address_
                 << " was lost mid-stream (" << cause.ToString()
                 << "); resuming on another decode worker (migration " << migrations_
                 << " of at most " << env_.options.max_migrations << ")";
  }
  // A Start still in flight went to the lost worker.
  if (start_call_ != nullptr) start_call_->Cancel();
  start_call_.reset();
  phase_ = Phase::kStreaming;
  // With a K/V handoff the new worker leases the tokens' K/V; without, it
  // computes them.
  local_ = !handoff_.has_value();
  resuming_ = true;
  decode_tried_ = {decode_address_};
  decode_avoid_.clear();
  decode_refusals_.clear();
  decode_all_full_ = true;
  OpenDecode();
}

void RequestDriver::OnDecodeWorkerUnresponsive(int stream, const absl::Status& why) {
  if (phase_ == Phase::kDone || stream != stream_ || awaiting_first_) return;
  const absl::Status cause = absl::UnavailableError(
      absl::StrCat("decode worker ", decode_address_, " stopped answering: ", why.message()));
  if (handoff_.has_value()) {
    // The worker the K/V was to go to: the move recomputes elsewhere.
    HandoffFailed(cause, /*avoid_new=*/true);
    return;
  }
  // Before any token the reservation's and the prefill's own deadlines
  // apply; with nowhere to go the stream waits for the worker.
  if (!CanMigrate(cause)) return;
  AbandonAndMigrate(cause);
}

void RequestDriver::AbandonAndMigrate(const absl::Status& cause, bool planned) {
  decode_watch_.reset();
  if (decode_call_ != nullptr) decode_call_->Cancel();
  decode_call_.reset();
  decode_load_.reset();
  ++stream_;
  Migrate(cause, planned);
}

void RequestDriver::OnDecodeWorkerDraining(bool ships_kv) {
  const absl::Status cause =
      absl::UnavailableError(absl::StrCat("decode worker ", decode_address_, " is draining"));
  // With nowhere to go, or no moves left, the stream ends where it is, as
  // a drain always let it.
  if (phase_ != Phase::kStreaming || !CanMigrate(cause)) {
    LOG(INFO) << "request " << request_id_ << ": " << cause.message()
              << "; the stream stays there (no other decode worker, or no migrations left)";
    return;
  }
  if (!env_.options.kv_handoff || !ships_kv || req_.n != 1) {
    AbandonAndMigrate(cause, /*planned=*/true);
    return;
  }
  // The old stream stays open (its worker holds the K/V) until the handoff
  // ends; its events are stale from here on.
  handoff_ = PendingHandoff{.from = decode_worker_,
                            .stream = std::move(decode_call_),
                            .request_id = StreamRequestId(),
                            .call = nullptr,
                            .began = env_.clock->Now()};
  decode_watch_.reset();
  decode_load_.reset();
  ++stream_;
  Migrate(cause, /*planned=*/true);
}

void RequestDriver::SendHandoff() {
  v1::HandoffRequest request;
  request.set_request_id(handoff_->request_id);
  request.set_kv_descriptor(reserved_.kv_descriptor());
  request.mutable_tokens()->Assign(choices_[0].ids.begin(), choices_[0].ids.end());
  auto self = shared_from_this();
  const int stream = stream_;
  handoff_->call = handoff_->from->channel().Handoff(
      std::move(request), std::min(deadline_, env_.clock->Now() + env_.options.handoff_timeout),
      [self, stream](absl::StatusOr<v1::HandoffResponse> response) {
        self->Post([self, stream, response = std::move(response)]() mutable {
          self->OnHandoffDone(stream, std::move(response));
        });
      });
}

void RequestDriver::OnHandoffDone(int stream, absl::StatusOr<v1::HandoffResponse> response) {
  if (phase_ == Phase::kDone || stream != stream_ || !handoff_.has_value()) return;
  if (std::optional<absl::Status> own = OwnFault()) {
    Finish(*own);
    return;
  }
  if (!response.ok()) {
    HandoffFailed(absl::Status(
        response.status().code(),
        absl::StrCat("decode worker ", handoff_->from->address(),
                     " did not ship the stream's K/V: ", response.status().message())));
    return;
  }
  // The old worker lets go of the stream's blocks.
  handoff_->stream->Cancel();
  const absl::Duration took = env_.clock->Now() - handoff_->began;
  handoff_.reset();
  ++kv_handoffs_;
  kv_bytes_ += response->kv_bytes();
  if (RouterMetrics* m = env_.options.metrics; m != nullptr) m->kv_handoffs.Increment();
  LOG(INFO) << "request " << request_id_ << ": " << response->kv_bytes()
            << " bytes of K/V handed off to decode worker " << decode_address_ << " in "
            << absl::FormatDuration(took);
  // The new worker replayed the tokens' sampling: no draws to skip.
  v1::StartRequest start;
  start.set_first_token(choices_[0].ids.back());
  SendStart(std::move(start));
}

void RequestDriver::HandoffFailed(const absl::Status& why, bool avoid_new) {
  LOG(WARNING) << "request " << request_id_ << ": the K/V handoff failed (" << why
               << "); recomputing the stream's tokens on a decode worker instead";
  if (RouterMetrics* m = env_.options.metrics; m != nullptr) m->kv_handoff_failures.Increment();
  const std::string from = handoff_->from->address();
  if (avoid_new) decode_avoid_ = decode_address_;
  handoff_->stream->Cancel();
  if (handoff_->call != nullptr) handoff_->call->Cancel();
  handoff_.reset();
  // The reservation on the new worker goes too (if it still stands).
  CancelReserveTimer();
  decode_watch_.reset();
  if (decode_call_ != nullptr) decode_call_->Cancel();
  decode_call_.reset();
  decode_load_.reset();
  ++stream_;
  local_ = true;
  resuming_ = true;
  decode_tried_ = {from};
  decode_refusals_.clear();
  decode_all_full_ = true;
  OpenDecode();
}

void RequestDriver::NoteProgress() {
  const absl::Time now = env_.clock->Now();
  // The gap is the current stream's own: the first token of a stream (or
  // of a migrated one) may follow a prefill or a recompute.
  if (stream_tokens_++ > 0) {
    const absl::Duration gap = now - last_token_at_;
    token_gap_ = token_gap_ == absl::ZeroDuration() ? gap : (3 * token_gap_ + gap) / 4;
  }
  last_token_at_ = now;
  if (env_.progress == nullptr || env_.options.decode_stall_timeout <= absl::ZeroDuration()) return;
  env_.progress->last_token_unix_us.store(absl::ToUnixMicros(now), std::memory_order_relaxed);
  if (stall_timer_ == 0) ArmStallTimer(now + env_.options.decode_stall_timeout);
}

void RequestDriver::ArmStallTimer(absl::Time at) {
  // The timer holds the driver weakly, as the reservation's does.
  stall_timer_ =
      env_.executor->PostAt(std::min(at, deadline_), [weak = weak_from_this(), stream = stream_] {
        if (std::shared_ptr<RequestDriver> self = weak.lock()) {
          self->Post([self, stream] { self->OnStallTimer(stream); });
        }
      });
}

void RequestDriver::CancelStallTimer() {
  if (stall_timer_ != 0) env_.executor->CancelTimer(stall_timer_);
  stall_timer_ = 0;
}

void RequestDriver::OnStallTimer(int stream) {
  stall_timer_ = 0;
  if (phase_ != Phase::kStreaming || stream != stream_ || awaiting_first_) return;
  const absl::Time now = env_.clock->Now();
  const absl::Duration limit = std::max(env_.options.decode_stall_timeout, 8 * token_gap_);
  if (now - last_token_at_ < limit) {
    ArmStallTimer(last_token_at_ + limit);
    return;
  }
  // Only while others' tokens keep coming: when none does, the router
  // itself (or every worker) paused, and moving would help nothing.
  const absl::Time others =
      absl::FromUnixMicros(env_.progress->last_token_unix_us.load(std::memory_order_relaxed));
  const absl::Status cause = absl::UnavailableError(absl::StrCat(
      "decode worker ", decode_address_, " sent no token for ", absl::FormatDuration(limit),
      " while other streams' tokens kept coming (--decode_stall_timeout)"));
  if (handoff_.has_value()) {
    HandoffFailed(cause, /*avoid_new=*/true);
    return;
  }
  if (others - last_token_at_ < limit / 2 || !CanMigrate(cause)) {
    ArmStallTimer(now + limit / 2);
    return;
  }
  AbandonAndMigrate(cause);
}

}  // namespace tandem::router
