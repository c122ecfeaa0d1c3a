// RequestDriver's wait for a decode slot (router/decode_queue.h): a request
// that every decode worker refuses as full parks in the router's
// DecodeQueue and tries again when woken, until its wait, which began at its
// arrival, reaches the router's --queue_timeout (or its own deadline).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "router/request_driver.h"

namespace tandem::router {

bool RequestDriver::CanWaitForDecode() const {
  return env_.decode_queue != nullptr && !handoff_.has_value() && !resuming_ && !decode_began_;
}

bool RequestDriver::JoinDecodeQueue() {
  const bool woken = std::exchange(woken_, false);
  if (woken || !decode_tried_.empty() || !CanWaitForDecode() || env_.decode_queue->waiting() == 0) {
    return false;
  }
  WaitForDecode(absl::ResourceExhaustedError(
      "every decode slot was taken by the requests waiting ahead of it"));
  return true;
}

void RequestDriver::WaitForDecode(absl::Status refusal) {
  const absl::Time now = env_.clock->Now();
  if (!queue_position_.has_value()) {
    queue_position_ = env_.decode_queue->NextPosition();
    wait_deadline_ = std::min(deadline_, arrival_ + env_.queue_timeout);
  }
  last_refusal_ = std::string(refusal.message());
  if (now >= wait_deadline_) {
    GiveUpWaiting();
    return;
  }
  if (!waiting_) {
    waiting_ = true;
    if (env_.options.metrics != nullptr) env_.options.metrics->requests_waiting_decode.Increment();
    // Held weakly, as the reservation timer is.
    wait_timer_ = env_.executor->PostAt(wait_deadline_, [weak = weak_from_this()] {
      if (std::shared_ptr<RequestDriver> self = weak.lock()) {
        self->Post([self] {
          self->wait_timer_ = 0;
          self->OnDecodeWaitOver();
        });
      }
    });
  }
  // No stream is open while it waits (the last refused one's timer goes).
  CancelReserveTimer();
  awaiting_first_ = false;
  // The next try starts afresh: every worker may have room by then.
  decode_tried_.clear();
  decode_refusals_.clear();
  decode_all_full_ = true;
  // The router's queue time counts until a worker admits it.
  timeline_.router_queue_us = 0;
  Park();
}

void RequestDriver::Park() {
  parked_ = true;
  const int park = ++park_;
  // The queue holds the driver while it waits: nothing else does then.
  env_.decode_queue->Park(params_.priority, *queue_position_, [self = shared_from_this(), park] {
    self->Post([self, park] { self->OnDecodeWake(park); });
  });
}

void RequestDriver::OnDecodeWake(int park) {
  if (phase_ == Phase::kDone || !parked_ || park != park_) return;
  parked_ = false;
  woken_ = true;
  OpenDecode();
}

void RequestDriver::OnDecodeWaitOver() {
  if (phase_ == Phase::kDone || !waiting_) return;
  // Woken, its call in flight: the answer decides (a refusal comes back to
  // WaitForDecode, past the deadline).
  if (!parked_ && decode_call_ != nullptr) return;
  GiveUpWaiting();
}

void RequestDriver::GiveUpWaiting() {
  if (std::optional<absl::Status> own = OwnFault()) {
    Finish(*own);
    return;
  }
  Finish(absl::ResourceExhaustedError(absl::StrCat(
      "no decode worker had room for the request, which may wait ",
      absl::FormatDuration(wait_deadline_ - arrival_),
      " from its arrival (the router's --queue_timeout, or the request's own timeout); the last "
      "refusal: ",
      last_refusal_, "; retry later, or add decode workers")));
}

void RequestDriver::LeaveDecodeQueue(bool admitted) {
  if (parked_) env_.decode_queue->Remove(*queue_position_);
  parked_ = false;
  if (!waiting_) return;
  waiting_ = false;
  if (wait_timer_ != 0) env_.executor->CancelTimer(wait_timer_);
  wait_timer_ = 0;
  if (env_.options.metrics != nullptr) env_.options.metrics->requests_waiting_decode.Decrement();
  if (admitted) env_.decode_queue->WakeOne();
}

}  // namespace tandem::router
