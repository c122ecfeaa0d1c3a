#include "decode_worker/decode_service.h"

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/base/logging.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/stream_writer.h"
#include "common/worker/worker_grammar.h"

namespace tandem::decode {

namespace {

absl::Time Deadline(const grpc::CallbackServerContext& ctx) {
  const std::chrono::system_clock::time_point d = ctx.deadline();
  // No deadline reads as the end of time, which absl cannot represent.
  if (d >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(d);
}

}  // namespace

void ReportEngineHealth(DecodeLoop& loop, rpc::RunningServer& server) {
  loop.SetEngineFailureListener([&server](const absl::Status& failure) {
    LOG(ERROR) << "decode worker: reporting NOT_SERVING and refusing new requests: " << failure;
    server.SetServing(false);
  });
}

grpc::ServerWriteReactor<v1::DecodeEvent>* DecodeService::Generate(
    grpc::CallbackServerContext* ctx, const v1::DecodeRequest* request) {
  auto [reactor, writer] = rpc::StreamWriter<v1::DecodeEvent>::Create();
  auto r = std::make_shared<Request>(FromProto(*request));
  r->deadline = Deadline(*ctx);
  // A named copy: structured bindings cannot be captured (clang 14).
  std::shared_ptr<rpc::StreamWriter<v1::DecodeEvent>> out = writer;
  // At once for a request without a constraint; else once its grammar is
  // compiled, on the resolver's thread.
  constraints_->Resolve(
      request->sampling(),
      [loop = loop_, r, out](absl::StatusOr<std::shared_ptr<grammar::CompiledGrammar>> grammar) {
        if (!grammar.ok()) {
          out->Finish(rpc::ToGrpc(grammar.status()));
          return;
        }
        r->sampling.grammar = *std::move(grammar);
        absl::StatusOr<DecodeLoop::Ticket> ticket = loop->Submit(
            std::move(*r),
            std::make_shared<ProtoEventSink>(
                [out](v1::DecodeEvent event) { out->Write(std::move(event)); },
                [out](const absl::Status& status) { out->Finish(rpc::ToGrpc(status)); }));
        if (!ticket.ok()) {
          out->Finish(rpc::ToGrpc(ticket.status()));
          return;
        }
        // Runs at once if the client has already gone.
        out->OnCancel([loop, t = *ticket] { loop->Cancel(t); });
      });
  return reactor;
}

grpc::ServerUnaryReactor* DecodeService::Start(grpc::CallbackServerContext* ctx,
                                               const v1::StartRequest* request,
                                               v1::StartResponse*) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  loop_->Start(
      request->request_id(), request->generation(), request->first_token(),
      std::vector<int32_t>(request->extra_first_tokens().begin(),
                           request->extra_first_tokens().end()),
      [reactor](absl::Status status) { reactor->Finish(rpc::ToGrpc(status)); },
      std::vector<uint64_t>(request->sampler_draws().begin(), request->sampler_draws().end()));
  return reactor;
}

grpc::ServerUnaryReactor* DecodeService::Handoff(grpc::CallbackServerContext* ctx,
                                                 const v1::HandoffRequest* request,
                                                 v1::HandoffResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  loop_->Handoff(request->request_id(), request->kv_descriptor(),
                 std::vector<int32_t>(request->tokens().begin(), request->tokens().end()),
                 [reactor, response](absl::StatusOr<HandoffResult> result) {
                   if (result.ok()) {
                     response->set_kv_bytes(static_cast<int64_t>(result->kv_bytes));
                     response->set_kv_transfer_us(absl::ToInt64Microseconds(result->transfer));
                   }
                   reactor->Finish(rpc::ToGrpc(result.status()));
                 });
  return reactor;
}

grpc::ServerUnaryReactor* DecodeService::GetStats(grpc::CallbackServerContext* ctx,
                                                  const v1::StatsRequest* request,
                                                  v1::WorkerStats* response) {
  *response = ToProto(loop_->Stats());
  CacheEventsReply(loop_->cache_events(), cache_epoch_, *request, response);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem::decode
