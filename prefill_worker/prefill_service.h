// PrefillService: tandem.v1.PrefillWorker over gRPC's callback API. A thin
// adapter: protos in, PrefillLoop jobs out, and the loop's reply back as
// the RPC's status (rpc::ToGrpc). A client cancelling Prefill (or its
// deadline passing) cancels the job, which frees its KV blocks.
//
// Thread-safe; the loop must outlive the service.
#ifndef TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_
#define TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "absl/time/time.h"
#include "common/engine/sampler.h"
#include "common/rpc/server.h"
#include "common/worker/cache_events_proto.h"
#include "common/worker/worker_grammar.h"
#include "prefill_worker/prefill_loop.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::prefill {

class PrefillService final : public tandem::v1::PrefillWorker::CallbackService {
 public:
  // `constraints` compiles structured outputs' grammars (null: such
  // requests are refused); it must outlive the service, and its executor
  // must have run its tasks before the loop goes.
  explicit PrefillService(PrefillLoop* loop, const ConstraintResolver* constraints = nullptr)
      : loop_(loop),
        constraints_(constraints != nullptr ? constraints : &ConstraintResolver::None()) {}

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const tandem::v1::PrefillRequest* request,
                                    tandem::v1::PrefillResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const tandem::v1::StatsRequest* request,
                                     tandem::v1::WorkerStats* response) override;

 private:
  PrefillLoop* const loop_;
  const ConstraintResolver* const constraints_;
  // Names this process's numbering of the loop's cache events.
  const uint64_t cache_epoch_ = NewCacheEpoch();
};

// Turns `server` NOT_SERVING (the server and each of its services) once
// the loop's engine fails, so that health checks keep work away; the loop
// refuses new jobs itself. `server` must outlive what this sets up: clear
// it (loop.SetEngineFailureListener(nullptr)) or destroy the loop first.
void ReportEngineHealth(PrefillLoop& loop, rpc::RunningServer& server);

// The RPC's deadline as an absl::Time (InfiniteFuture when it has none).
absl::Time DeadlineOf(const grpc::CallbackServerContext& context);

}  // namespace tandem::prefill

#endif  // TANDEM_PREFILL_WORKER_PREFILL_SERVICE_H_
