#include "router/worker_calls.h"

namespace tandem::router {

std::shared_ptr<DecodeStreamCall> DecodeStreamCall::Start(v1::DecodeWorker::Stub* stub,
                                                          v1::DecodeRequest request,
                                                          absl::Time deadline, EventFn on_event,
                                                          DoneFn on_done) {
  std::shared_ptr<DecodeStreamCall> call(
      new DecodeStreamCall(std::move(on_event), std::move(on_done)));
  call->request_ = std::move(request);
  call->context_.set_deadline(rpc::ToChrono(deadline));
  call->self_ = call;
  stub->async()->Generate(&call->context_, &call->request_, call.get());
  rpc::HandToGrpc(call.get());
  call->StartRead(&call->event_);
  call->StartCall();
  return call;
}

void DecodeStreamCall::OnReadDone(bool ok) {
  rpc::TakeFromGrpc(this);
  if (!ok) return;  // The stream is over; OnDone follows.
  on_event_(std::move(event_));
  event_.Clear();
  rpc::HandToGrpc(this);
  StartRead(&event_);
}

void DecodeStreamCall::OnDone(const grpc::Status& status) {
  rpc::TakeFromGrpc(this);
  on_done_(rpc::FromGrpc(status));
  // Drop the callbacks (and what they hold) before the last reference.
  on_event_ = nullptr;
  on_done_ = nullptr;
  std::shared_ptr<DecodeStreamCall> self = std::move(self_);
}

}  // namespace tandem::router
