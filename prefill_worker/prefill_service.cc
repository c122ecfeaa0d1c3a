#include "prefill_worker/prefill_service.h"

#include <atomic>
#include <chrono>
#include <memory>
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
// Start may run on another thread than the handler's (once the request's
// grammar is compiled), so a cancel may come before the job has an id.
class PrefillReactor final : public grpc::ServerUnaryReactor {
 public:
  PrefillReactor(PrefillLoop* loop, tandem::v1::PrefillResponse* response)
      : loop_(loop), response_(response), job_(std::make_shared<JobState>()) {}

  void Start(PrefillJob job) {
    // Once Submit's callback has finished the call, this reactor may be
    // gone: only these copies are read after Submit.
    PrefillLoop* const loop = loop_;
    const std::shared_ptr<JobState> state = job_;
    const JobId id = loop->Submit(std::move(job), [this](absl::StatusOr<PrefillResult> result) {
      if (!result.ok()) {
        Finish(rpc::ToGrpc(result.status()));
        return;
      }
      ResultToProto(*result, response_);
      Finish(grpc::Status::OK);
    });
    state->id = id;
    // A cancel that came before the id was known; a second Cancel of one
    // job does nothing.
    if (state->cancelled) loop->Cancel(id);
  }

  void OnCancel() override {
    job_->cancelled = true;
    if (const JobId id = job_->id.load(); id != 0) loop_->Cancel(id);
  }
  void OnDone() override { delete this; }

 private:
  struct JobState {
    std::atomic<JobId> id{0};
    std::atomic<bool> cancelled{false};
  };
  PrefillLoop* const loop_;
  tandem::v1::PrefillResponse* const response_;
  const std::shared_ptr<JobState> job_;
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
  auto job = std::make_shared<PrefillJob>(JobFromProto(*request));
  job->deadline = DeadlineOf(*context);
  auto* reactor = new PrefillReactor(loop_, response);
  // At once for a request without a constraint; else once its grammar is
  // compiled, on the resolver's thread.
  constraints_->Resolve(
      request->sampling(),
      [reactor, job](absl::StatusOr<std::shared_ptr<grammar::CompiledGrammar>> grammar) {
        if (!grammar.ok()) {
          reactor->Finish(rpc::ToGrpc(grammar.status()));
          return;
        }
        job->sampling.grammar = *std::move(grammar);
        reactor->Start(std::move(*job));
      });
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
