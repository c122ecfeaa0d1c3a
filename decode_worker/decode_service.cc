#include "decode_worker/decode_service.h"

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "common/base/logging.h"
#include "common/engine/engine_proto.h"
#include "common/engine/worker_stats_proto.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/stream_writer.h"

namespace tandem::decode {

namespace {

v1::FinishReason ToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kEos:
      return v1::FINISH_REASON_EOS;
    case FinishReason::kContext:
      return v1::FINISH_REASON_CONTEXT;
    case FinishReason::kStopped:
      return v1::FINISH_REASON_STOP;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

// Writes a request's events to its Generate stream.
class StreamSink final : public EventSink {
 public:
  explicit StreamSink(std::shared_ptr<rpc::StreamWriter<v1::DecodeEvent>> writer)
      : writer_(std::move(writer)) {}

  void OnReserved(const Reservation& reservation) override {
    v1::DecodeEvent event;
    event.mutable_reserved()->set_kv_descriptor(reservation.kv_descriptor);
    event.mutable_reserved()->set_generation(reservation.generation);
    event.mutable_reserved()->set_cached_tokens(reservation.cached_tokens);
    writer_->Write(std::move(event));
  }
  void OnPromptLogprobs(std::span<const TokenLogprob> logprobs) override {
    v1::DecodeEvent event;
    for (const TokenLogprob& lp : logprobs) {
      LogprobToProto(lp, event.mutable_prompt_logprobs()->add_logprobs());
    }
    writer_->Write(std::move(event));
  }
  void OnTokens(int index, std::span<const int32_t> ids,
                std::span<const TokenLogprob> logprobs) override {
    v1::DecodeEvent event;
    v1::DecodeTokens* tokens = event.mutable_tokens();
    tokens->set_index(index);
    tokens->mutable_ids()->Add(ids.begin(), ids.end());
    for (const TokenLogprob& lp : logprobs) LogprobToProto(lp, tokens->add_logprobs());
    writer_->Write(std::move(event));
  }
  void OnFinished(const Finished& finished) override {
    v1::DecodeEvent event;
    *event.mutable_finished() = ToProto(finished);
    writer_->Write(std::move(event));
    if (finished.last) writer_->Finish(grpc::Status::OK);
  }
  void OnFailed(const absl::Status& status) override { writer_->Finish(rpc::ToGrpc(status)); }

 private:
  const std::shared_ptr<rpc::StreamWriter<v1::DecodeEvent>> writer_;
};

absl::Time Deadline(const grpc::CallbackServerContext& ctx) {
  const std::chrono::system_clock::time_point d = ctx.deadline();
  // No deadline reads as the end of time, which absl cannot represent.
  if (d >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(d);
}

}  // namespace

Request FromProto(const v1::DecodeRequest& request) {
  Request r;
  r.request_id = request.request_id();
  r.prompt.assign(request.prompt().begin(), request.prompt().end());
  r.sampling = SamplingFromProto(request.sampling());
  r.max_tokens = request.max_tokens();
  r.local_prefill = request.local_prefill();
  r.stop_token_ids.assign(request.stop_token_ids().begin(), request.stop_token_ids().end());
  r.n = request.n() == 0 ? 1 : request.n();
  if (request.has_logprobs()) r.logprobs = request.logprobs();
  r.prompt_logprobs = request.prompt_logprobs();
  r.priority = request.priority();
  return r;
}

v1::DecodeFinished ToProto(const Finished& finished) {
  v1::DecodeFinished f;
  f.set_reason(ToProto(finished.reason));
  f.set_completion_tokens(finished.completion_tokens);
  f.set_decode_queue_us(absl::ToInt64Microseconds(finished.decode_queue));
  f.set_prefill_us(absl::ToInt64Microseconds(finished.prefill));
  f.set_kv_wait_us(absl::ToInt64Microseconds(finished.kv_wait));
  f.set_index(finished.index);
  f.set_cached_tokens(finished.cached_tokens);
  return f;
}

void ReportEngineHealth(DecodeLoop& loop, rpc::RunningServer& server) {
  loop.SetEngineFailureListener([&server](const absl::Status& failure) {
    LOG(ERROR) << "decode worker: reporting NOT_SERVING and refusing new requests: " << failure;
    server.SetServing(false);
  });
}

v1::WorkerStats ToProto(const LoopStats& s) {
  v1::WorkerStats w;
  WorkerStatsToProto(s, "decode", &w);
  return w;
}

grpc::ServerWriteReactor<v1::DecodeEvent>* DecodeService::Generate(
    grpc::CallbackServerContext* ctx, const v1::DecodeRequest* request) {
  auto [reactor, writer] = rpc::StreamWriter<v1::DecodeEvent>::Create();
  Request r = FromProto(*request);
  r.deadline = Deadline(*ctx);
  absl::StatusOr<DecodeLoop::Ticket> ticket =
      loop_->Submit(std::move(r), std::make_shared<StreamSink>(writer));
  if (!ticket.ok()) {
    writer->Finish(rpc::ToGrpc(ticket.status()));
    return reactor;
  }
  // Runs at once if the client has already gone.
  writer->OnCancel([loop = loop_, t = *ticket] { loop->Cancel(t); });
  return reactor;
}

grpc::ServerUnaryReactor* DecodeService::Start(grpc::CallbackServerContext* ctx,
                                               const v1::StartRequest* request,
                                               v1::StartResponse*) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  loop_->Start(request->request_id(), request->generation(), request->first_token(),
               std::vector<int32_t>(request->extra_first_tokens().begin(),
                                    request->extra_first_tokens().end()),
               [reactor](absl::Status status) { reactor->Finish(rpc::ToGrpc(status)); },
               std::vector<uint64_t>(request->sampler_draws().begin(),
                                     request->sampler_draws().end()));
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
