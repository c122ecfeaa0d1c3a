#include "router/grpc_worker_channel.h"

#include <grpcpp/grpcpp.h>

#include <functional>
#include <utility>

#include "common/base/host_port.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/server.h"
#include "common/rpc/tsan_handoff.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {
namespace {

// DecodeWorker.Generate: the events as they arrive, then the final status.
// The call keeps itself alive until its OnDone has run.
class DecodeStreamCall final : public grpc::ClientReadReactor<v1::DecodeEvent>, public WorkerCall {
 public:
  static std::shared_ptr<DecodeStreamCall> Start(v1::DecodeWorker::Stub* stub,
                                                 v1::DecodeRequest request, absl::Time deadline,
                                                 WorkerChannel::DecodeEventFn on_event,
                                                 WorkerChannel::DoneFn on_done) {
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

  void Cancel() override { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    rpc::TakeFromGrpc(this);
    if (!ok) return;  // The stream is over; OnDone follows.
    on_event_(std::move(event_));
    event_.Clear();
    rpc::HandToGrpc(this);
    StartRead(&event_);
  }

  void OnDone(const grpc::Status& status) override {
    rpc::TakeFromGrpc(this);
    on_done_(rpc::FromGrpc(status));
    // Drop the callbacks (and what they hold) before the last reference.
    on_event_ = nullptr;
    on_done_ = nullptr;
    std::shared_ptr<DecodeStreamCall> self = std::move(self_);
  }

 private:
  DecodeStreamCall(WorkerChannel::DecodeEventFn on_event, WorkerChannel::DoneFn on_done)
      : on_event_(std::move(on_event)), on_done_(std::move(on_done)) {}

  grpc::ClientContext context_;
  v1::DecodeRequest request_;
  v1::DecodeEvent event_;
  WorkerChannel::DecodeEventFn on_event_;
  WorkerChannel::DoneFn on_done_;
  std::shared_ptr<DecodeStreamCall> self_;  // Until OnDone.
};

// A unary call on the callback API.
template <typename Request, typename Response>
class UnaryCall final : public WorkerCall {
 public:
  // How the stub starts the call: stub->async()->Method.
  using AsyncFn = std::function<void(grpc::ClientContext*, const Request*, Response*,
                                     std::function<void(grpc::Status)>)>;

  static std::shared_ptr<UnaryCall> Start(const AsyncFn& async, Request request,
                                          absl::Time deadline,
                                          WorkerChannel::ResultFn<Response> on_done) {
    std::shared_ptr<UnaryCall> call(new UnaryCall());
    call->request_ = std::move(request);
    call->context_.set_deadline(rpc::ToChrono(deadline));
    call->on_done_ = std::move(on_done);
    // The lambda keeps the call (context, request, response) alive until
    // gRPC is done with it.
    rpc::HandToGrpc(call.get());
    async(&call->context_, &call->request_, &call->response_, [call](grpc::Status status) mutable {
      rpc::TakeFromGrpc(call.get());
      // The callback (and what it holds, such as the caller's worker
      // and so its channel) goes after the call: the call's context
      // holds a reference to the channel, and the last one must not
      // be dropped on a gRPC thread (gRPC 1.51 joins its own threads
      // from there and aborts).
      WorkerChannel::ResultFn<Response> on_done = std::move(call->on_done_);
      if (status.ok()) {
        on_done(std::move(call->response_));
      } else {
        on_done(rpc::FromGrpc(status));
      }
      call.reset();
    });
    return call;
  }

  void Cancel() override { context_.TryCancel(); }

 private:
  UnaryCall() = default;
  grpc::ClientContext context_;
  Request request_;
  Response response_;
  WorkerChannel::ResultFn<Response> on_done_;
};

class GrpcWorkerChannel final : public WorkerChannel {
 public:
  GrpcWorkerChannel(const std::string& address, const rpc::ChannelSecurity& security,
                    WorkerRole role, const Clock* clock)
      : clock_(clock), channel_(rpc::MakeChannel(address, security)) {
    if (role == WorkerRole::kPrefill) {
      prefill_stub_ = v1::PrefillWorker::NewStub(channel_);
    } else {
      decode_stub_ = v1::DecodeWorker::NewStub(channel_);
    }
  }

  std::shared_ptr<WorkerCall> Generate(v1::DecodeRequest request, absl::Time deadline,
                                       DecodeEventFn on_event, DoneFn on_done) override {
    return DecodeStreamCall::Start(decode_stub_.get(), std::move(request), Real(deadline),
                                   std::move(on_event), std::move(on_done));
  }

  std::shared_ptr<WorkerCall> Prefill(v1::PrefillRequest request, absl::Time deadline,
                                      ResultFn<v1::PrefillResponse> on_done) override {
    v1::PrefillWorker::Stub* stub = prefill_stub_.get();
    return UnaryCall<v1::PrefillRequest, v1::PrefillResponse>::Start(
        [stub](grpc::ClientContext* c, const v1::PrefillRequest* q, v1::PrefillResponse* r,
               std::function<void(grpc::Status)> done) {
          stub->async()->Prefill(c, q, r, std::move(done));
        },
        std::move(request), Real(deadline), std::move(on_done));
  }

  std::shared_ptr<WorkerCall> Start(v1::StartRequest request, absl::Time deadline,
                                    ResultFn<v1::StartResponse> on_done) override {
    v1::DecodeWorker::Stub* stub = decode_stub_.get();
    return UnaryCall<v1::StartRequest, v1::StartResponse>::Start(
        [stub](grpc::ClientContext* c, const v1::StartRequest* q, v1::StartResponse* s,
               std::function<void(grpc::Status)> done) {
          stub->async()->Start(c, q, s, std::move(done));
        },
        std::move(request), Real(deadline), std::move(on_done));
  }

  std::shared_ptr<WorkerCall> Handoff(v1::HandoffRequest request, absl::Time deadline,
                                      ResultFn<v1::HandoffResponse> on_done) override {
    v1::DecodeWorker::Stub* stub = decode_stub_.get();
    return UnaryCall<v1::HandoffRequest, v1::HandoffResponse>::Start(
        [stub](grpc::ClientContext* c, const v1::HandoffRequest* q, v1::HandoffResponse* s,
               std::function<void(grpc::Status)> done) {
          stub->async()->Handoff(c, q, s, std::move(done));
        },
        std::move(request), Real(deadline), std::move(on_done));
  }

  std::shared_ptr<WorkerCall> GetStats(v1::StatsRequest request, absl::Time deadline,
                                       ResultFn<v1::WorkerStats> on_done) override {
    return prefill_stub_ != nullptr ? StartGetStats(prefill_stub_.get(), std::move(request),
                                                    deadline, std::move(on_done))
                                    : StartGetStats(decode_stub_.get(), std::move(request),
                                                    deadline, std::move(on_done));
  }

 private:
  // GetStats on either role's stub.
  template <typename Stub>
  std::shared_ptr<WorkerCall> StartGetStats(Stub* stub, v1::StatsRequest request,
                                            absl::Time deadline,
                                            ResultFn<v1::WorkerStats> on_done) {
    return UnaryCall<v1::StatsRequest, v1::WorkerStats>::Start(
        [stub](grpc::ClientContext* c, const v1::StatsRequest* q, v1::WorkerStats* s,
               std::function<void(grpc::Status)> done) {
          stub->async()->GetStats(c, q, s, std::move(done));
        },
        std::move(request), Real(deadline), std::move(on_done));
  }

  // The wall-clock time of a deadline on the router's clock.
  absl::Time Real(absl::Time deadline) const { return ToRealTime(deadline, *clock_); }

  const Clock* const clock_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::PrefillWorker::Stub> prefill_stub_;
  std::unique_ptr<v1::DecodeWorker::Stub> decode_stub_;
};

}  // namespace

std::unique_ptr<WorkerChannel> NewGrpcWorkerChannel(const std::string& address,
                                                    const std::string& target, WorkerRole role,
                                                    const rpc::ChannelSecurity& security,
                                                    const Clock* clock) {
  rpc::ChannelSecurity named = security;
  if (named.tls && named.target_name_override.empty()) {
    if (absl::StatusOr<HostPort> hp = ParseHostPort(target, "worker target"); hp.ok()) {
      named.target_name_override = hp->host;
    }
  }
  return std::make_unique<GrpcWorkerChannel>(address, named, role, clock);
}

absl::StatusOr<WorkerChannelFactory> GrpcWorkerChannels(const rpc::TlsConfig& tls,
                                                        const Clock* clock) {
  absl::StatusOr<rpc::ChannelSecurity> security = rpc::MakeChannelSecurity(tls);
  if (!security.ok()) return security.status();
  return WorkerChannelFactory([security = *std::move(security), clock](const std::string& address,
                                                                       const std::string& target,
                                                                       WorkerRole role) {
    return NewGrpcWorkerChannel(address, target, role, security, clock);
  });
}

}  // namespace tandem::router
