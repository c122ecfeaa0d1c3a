// Calls to the workers on gRPC's callback client API: no thread waits on
// them. Each call owns its ClientContext, request and response until gRPC
// is done with them, and reports its outcome to a callback exactly once
// (events too, for the decode stream). Callbacks run on gRPC's threads and
// must not block.
//
// Cancel() may be called from any thread at any time, also after the call
// ended (it then does nothing).
#ifndef TANDEM_ROUTER_WORKER_CALLS_H_
#define TANDEM_ROUTER_WORKER_CALLS_H_

#include <functional>
#include <memory>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/tsan_handoff.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

// DecodeWorker.Generate: the events as they arrive, then the final status.
class DecodeStreamCall final : public grpc::ClientReadReactor<v1::DecodeEvent> {
 public:
  using EventFn = std::function<void(v1::DecodeEvent)>;
  using DoneFn = std::function<void(absl::Status)>;

  // Starts the call. The returned handle only cancels; the call keeps
  // itself alive until `on_done` has run.
  static std::shared_ptr<DecodeStreamCall> Start(v1::DecodeWorker::Stub* stub,
                                                 v1::DecodeRequest request, absl::Time deadline,
                                                 EventFn on_event, DoneFn on_done);

  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  DecodeStreamCall(EventFn on_event, DoneFn on_done)
      : on_event_(std::move(on_event)), on_done_(std::move(on_done)) {}

  grpc::ClientContext context_;
  v1::DecodeRequest request_;
  v1::DecodeEvent event_;
  EventFn on_event_;
  DoneFn on_done_;
  std::shared_ptr<DecodeStreamCall> self_;  // Until OnDone.
};

// A unary call (Prefill, Start) on the callback API.
template <typename Request, typename Response>
class UnaryCall {
 public:
  using DoneFn = std::function<void(absl::StatusOr<Response>)>;
  // How the stub starts the call: stub->async()->Method.
  using AsyncFn = std::function<void(grpc::ClientContext*, const Request*, Response*,
                                     std::function<void(grpc::Status)>)>;

  static std::shared_ptr<UnaryCall> Start(const AsyncFn& async, Request request,
                                          absl::Time deadline, DoneFn on_done) {
    std::shared_ptr<UnaryCall> call(new UnaryCall());
    call->request_ = std::move(request);
    call->context_.set_deadline(rpc::ToChrono(deadline));
    // The lambda keeps the call (context, request, response) alive until
    // gRPC is done with it.
    rpc::HandToGrpc(call.get());
    async(&call->context_, &call->request_, &call->response_,
          [call, on_done = std::move(on_done)](grpc::Status status) {
            rpc::TakeFromGrpc(call.get());
            if (status.ok()) {
              on_done(std::move(call->response_));
            } else {
              on_done(rpc::FromGrpc(status));
            }
          });
    return call;
  }

  void Cancel() { context_.TryCancel(); }

 private:
  UnaryCall() = default;
  grpc::ClientContext context_;
  Request request_;
  Response response_;
};

using PrefillCall = UnaryCall<v1::PrefillRequest, v1::PrefillResponse>;
using StartCall = UnaryCall<v1::StartRequest, v1::StartResponse>;

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_WORKER_CALLS_H_
