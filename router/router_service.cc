#include "router/router_service.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "common/rpc/grpc_status.h"
#include "common/rpc/stream_writer.h"
#include "router/request_driver.h"

namespace tandem::router {
namespace {

using Writer = rpc::StreamWriter<v1::GenerateResponse>;

void LogprobsToProto(std::vector<TokenLogprob>& in,
                     google::protobuf::RepeatedPtrField<v1::TokenLogprob>* out) {
  for (TokenLogprob& l : in) {
    v1::TokenLogprob* p = out->Add();
    p->set_token_id(l.token_id);
    p->set_logprob(l.logprob);
    p->set_token(std::move(l.token));
    for (TopLogprob& t : l.top) {
      v1::TopLogprob* q = p->add_top();
      q->set_token_id(t.token_id);
      q->set_logprob(t.logprob);
      q->set_token(std::move(t.token));
    }
  }
}

class GrpcSink final : public ResponseSink {
 public:
  explicit GrpcSink(std::shared_ptr<Writer> writer) : writer_(std::move(writer)) {}
  bool OnEvent(GenerateEvent event) override {
    return writer_->Write(EventToProto(std::move(event)));
  }
  void OnDone(absl::Status status) override { writer_->Finish(rpc::ToGrpc(status)); }

 private:
  const std::shared_ptr<Writer> writer_;
};

}  // namespace

GenerateParams ParamsFromProto(const v1::GenerateRequest& r, absl::Time deadline) {
  GenerateParams p;
  p.request_id = r.request_id();
  p.model = r.model();
  switch (r.prompt_case()) {
    case v1::GenerateRequest::kText:
      p.text = r.text();
      break;
    case v1::GenerateRequest::kTokenIds:
      p.token_ids.emplace(r.token_ids().ids().begin(), r.token_ids().ids().end());
      break;
    case v1::GenerateRequest::kMessages:
      p.messages.emplace();
      for (const v1::ChatMessage& m : r.messages().messages()) {
        p.messages->push_back({m.role(), m.content()});
      }
      break;
    default:
      break;
  }
  const v1::SamplingParams& s = r.sampling();
  p.temperature = s.temperature();
  p.top_k = s.top_k();
  if (s.has_top_p()) p.top_p = s.top_p();
  if (s.has_seed()) p.seed = s.seed();
  p.presence_penalty = s.presence_penalty();
  p.frequency_penalty = s.frequency_penalty();
  if (s.has_repetition_penalty()) p.repetition_penalty = s.repetition_penalty();
  p.logit_bias.assign(s.logit_bias().begin(), s.logit_bias().end());
  std::sort(p.logit_bias.begin(), p.logit_bias.end());
  p.min_tokens = s.min_tokens();
  switch (s.constraint().kind_case()) {
    case v1::OutputConstraint::kJsonObject:
      if (s.constraint().json_object()) {
        p.constraint.kind = grammar::ConstraintSpec::Kind::kJsonObject;
      }
      break;
    case v1::OutputConstraint::kJsonSchema:
      p.constraint.kind = grammar::ConstraintSpec::Kind::kJsonSchema;
      p.constraint.schema = s.constraint().json_schema();
      break;
    case v1::OutputConstraint::kRegex:
      p.constraint.kind = grammar::ConstraintSpec::Kind::kRegex;
      p.constraint.schema = s.constraint().regex();
      break;
    case v1::OutputConstraint::KIND_NOT_SET:
      break;
  }
  p.constraint.prefix = s.constraint().prefix();
  p.constraint.suffix = s.constraint().suffix();
  p.ignore_eos = r.ignore_eos();
  // 0: up to the context's end; negative values are refused by validation.
  if (r.max_tokens() != 0) p.max_tokens = r.max_tokens();
  p.stop.assign(r.stop().begin(), r.stop().end());
  p.n = r.n() == 0 ? 1 : r.n();
  if (r.has_logprobs()) p.logprobs = r.logprobs();
  p.echo = r.echo();
  p.priority = r.priority();
  p.timeout = absl::Milliseconds(r.timeout_ms());
  p.deadline = deadline;
  return p;
}

v1::GenerateResponse EventToProto(GenerateEvent event) {
  v1::GenerateResponse m;
  m.set_index(event.index);
  switch (event.kind) {
    case GenerateEvent::Kind::kEcho: {
      v1::Echo* echo = m.mutable_echo();
      echo->mutable_token_ids()->Assign(event.token_ids.begin(), event.token_ids.end());
      echo->set_text(std::move(event.text));
      LogprobsToProto(event.logprobs, echo->mutable_logprobs());
      break;
    }
    case GenerateEvent::Kind::kTokens:
      m.mutable_token_ids()->Assign(event.token_ids.begin(), event.token_ids.end());
      m.set_text(std::move(event.text));
      LogprobsToProto(event.logprobs, m.mutable_logprobs());
      break;
    case GenerateEvent::Kind::kFinished: {
      m.set_text(std::move(event.text));
      v1::Finished* f = m.mutable_finished();
      f->set_reason(FinishReasonToProto(event.finish_reason));
      f->mutable_usage()->set_prompt_tokens(event.prompt_tokens);
      f->mutable_usage()->set_completion_tokens(event.completion_tokens);
      f->mutable_usage()->set_cached_tokens(event.cached_tokens);
      v1::Timeline* t = f->mutable_timeline();
      t->set_router_queue_us(event.timeline.router_queue_us);
      t->set_prefill_queue_us(event.timeline.prefill_queue_us);
      t->set_prefill_us(event.timeline.prefill_us);
      t->set_kv_transfer_us(event.timeline.kv_transfer_us);
      t->set_decode_queue_us(event.timeline.decode_queue_us);
      t->set_first_token_us(event.timeline.first_token_us);
      t->set_end_us(event.timeline.end_us);
      t->set_reserve_us(event.timeline.reserve_us);
      t->set_prefill_call_us(event.timeline.prefill_call_us);
      f->set_prefill_worker(std::move(event.prefill_worker));
      f->set_decode_worker(std::move(event.decode_worker));
      f->set_disaggregated(event.disaggregated);
      break;
    }
  }
  return m;
}

RouterService::RouterService(RequestCore* core, Authorizer authorize, const Clock* clock)
    : core_(core), authorize_(std::move(authorize)), clock_(clock) {}

grpc::ServerWriteReactor<v1::GenerateResponse>* RouterService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  auto [reactor, writer] = Writer::Create();
  if (authorize_) {
    if (absl::Status s = authorize_(*context); !s.ok()) {
      writer->Finish(rpc::ToGrpc(s));
      return reactor;
    }
  }
  std::shared_ptr<RequestHandle> handle = core_->Submit(
      ParamsFromProto(*request, FromRealTime(absl::FromChrono(context->deadline()), *clock_)),
      std::make_shared<GrpcSink>(writer));
  // Weak: the handle holds the sink, which holds the writer.
  writer->OnCancel([weak = std::weak_ptr<RequestHandle>(handle)] {
    if (std::shared_ptr<RequestHandle> h = weak.lock()) h->Cancel();
  });
  return reactor;
}

}  // namespace tandem::router
