// DecodeService: the tandem.v1.DecodeWorker gRPC service, a thin adapter
// between the protos and a DecodeLoop. Generate streams the loop's events;
// cancelling the stream (or its deadline passing) cancels the request;
// Start answers once the loop has committed (or refused) the sequence.
//
// Thread-safe. The loop must outlive the service, and the service the
// server it is registered with.
#ifndef TANDEM_DECODE_WORKER_DECODE_SERVICE_H_
#define TANDEM_DECODE_WORKER_DECODE_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "common/rpc/server.h"
#include "common/worker/cache_events_proto.h"
#include "common/worker/worker_grammar.h"
#include "decode_worker/decode_loop.h"
#include "decode_worker/decode_proto.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::decode {

class DecodeService final : public v1::DecodeWorker::CallbackService {
 public:
  // `constraints` compiles structured outputs' grammars (null: such
  // requests are refused); it must outlive the service, and its executor
  // must have run its tasks before the loop goes.
  explicit DecodeService(DecodeLoop* loop, const ConstraintResolver* constraints = nullptr)
      : loop_(loop),
        constraints_(constraints != nullptr ? constraints : &ConstraintResolver::None()) {}

  grpc::ServerWriteReactor<v1::DecodeEvent>* Generate(grpc::CallbackServerContext* ctx,
                                                      const v1::DecodeRequest* request) override;
  grpc::ServerUnaryReactor* Start(grpc::CallbackServerContext* ctx, const v1::StartRequest* request,
                                  v1::StartResponse* response) override;
  grpc::ServerUnaryReactor* Handoff(grpc::CallbackServerContext* ctx,
                                    const v1::HandoffRequest* request,
                                    v1::HandoffResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx,
                                     const v1::StatsRequest* request,
                                     v1::WorkerStats* response) override;

 private:
  DecodeLoop* const loop_;
  const ConstraintResolver* const constraints_;
  // Names this process's numbering of the loop's cache events.
  const uint64_t cache_epoch_ = NewCacheEpoch();
};

// Turns `server` NOT_SERVING (the server and each of its services) once
// the loop's engine fails, so that health checks keep work away; the loop
// refuses new requests itself. `server` must outlive what this sets up:
// clear it (loop.SetEngineFailureListener(nullptr)) or stop the loop first.
void ReportEngineHealth(DecodeLoop& loop, rpc::RunningServer& server);

}  // namespace tandem::decode

#endif  // TANDEM_DECODE_WORKER_DECODE_SERVICE_H_
