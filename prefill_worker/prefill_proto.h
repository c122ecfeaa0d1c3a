// The prefill worker's side of the tandem.v1.PrefillWorker contract as
// plain functions, shared by the gRPC service (prefill_service.h) and
// in-process channels (tools/sim). No gRPC here.
#ifndef TANDEM_PREFILL_WORKER_PREFILL_PROTO_H_
#define TANDEM_PREFILL_WORKER_PREFILL_PROTO_H_

#include "prefill_worker/prefill_job.h"
#include "prefill_worker/prefill_loop.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::prefill {

// The job (its deadline and callback left unset: the caller's transport
// has them).
PrefillJob JobFromProto(const v1::PrefillRequest& request);
void ResultToProto(const PrefillResult& result, v1::PrefillResponse* response);
v1::WorkerStats StatsToProto(const PrefillStats& stats);

}  // namespace tandem::prefill

#endif  // TANDEM_PREFILL_WORKER_PREFILL_PROTO_H_
