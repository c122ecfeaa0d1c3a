#include "prefill_worker/prefill_service.h"

#include <atomic>
#include <chrono>
#include <utility>

#include "common/base/logging.h"
#include "common/rpc/grpc_status.h"
#include "common/worker/worker_grammar.h"
#include "prefill_worker/prefill_proto.h"

namespace tandem::prefill {
namespace {

// One Prefill call. gRPC owns it from the handler's return until OnDone.
// The loop's callback calls Finish (from whichever thread replies), and
// OnCancel hands the client's cancellation to the loop; the loop replies to
// a cancelled job too, so Finish always happens and OnDone always follows.
class PrefillReactor final : public grpc::ServerUnaryReactor {
 public:
  PrefillReactor(PrefillLoop* loop, tandem::v1::PrefillResponse* response)
      : loop_(loop), response_(response) {}

  void Start(PrefillJob job) {
    // The callback may run before Submit returns; OnCancel runs only after
    // the handler has returned this reactor, when job_id_ is set.
    job_id_ = loop_->Submit(std::move(job), [this](absl::StatusOr<PrefillResult> result) {
      if (!result.ok()) {
        Finish(rpc::ToGrpc(result.status()));
        return;
      }
      ResultToProto(*result, response_);
      Finish(grpc::Status::OK);
    });
  }

  void OnCancel() override { loop_->Cancel(job_id_.load()); }
  void OnDone() override { delete this; }

 private:
  PrefillLoop* const loop_;
  tandem::v1::PrefillResponse* const response_;
  std::atomic<JobId> job_id_{0};
};

}  // namespace

void ReportEngineHealth(PrefillLoop& loop, rpc::RunningServer& server) {
  loop.SetEngineFailureListener([&server](const absl::Status& failure) {
    LOG(ERROR) << "prefill worker: reporting NOT_SERVING and refusing new requests: " << failure;
    server.SetServing(false);
  });
}

absl::Time DeadlineOf(const grpc::CallbackServerContext& context) {
  const std::chrono::system_clock::time_point deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

grpc::ServerUnaryReactor* PrefillService::Prefill(grpc::CallbackServerContext* context,
                                                  const tandem::v1::PrefillRequest* request,
                                                  tandem::v1::PrefillResponse* response) {
  PrefillJob job = JobFromProto(*request);
  job.deadline = DeadlineOf(*context);
  if (absl::Status s = ResolveConstraint(request->sampling(), grammars_, job.sampling); !s.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(rpc::ToGrpc(s));
    return reactor;
  }
  auto* reactor = new PrefillReactor(loop_, response);
  reactor->Start(std::move(job));
  return reactor;
}

grpc::ServerUnaryReactor* PrefillService::GetStats(grpc::CallbackServerContext* context,
                                                   const tandem::v1::StatsRequest* request,
                                                   tandem::v1::WorkerStats* response) {
  *response = StatsToProto(loop_->Stats());
  CacheEventsReply(loop_->cache_events(), cache_epoch_, *request, response);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem::prefill
