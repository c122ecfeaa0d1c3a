#include "router/router_service.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/limits.h"
#include "common/base/status_macros.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/stream_writer.h"
#include "nlohmann/json.hpp"
#include "router/request_driver.h"
#include "router/tool_calls.h"

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

// What a request's tools make of its outputs: each choice's text is kept,
// and one that ends in calls gets them parsed on its last message.
struct ToolOutputs {
  ToolFormat format = ToolFormat::kNone;
  bool parallel = true;
  std::function<std::string()> new_id;
  std::vector<std::string> texts;
};

class GrpcSink final : public ResponseSink {
 public:
  GrpcSink(std::shared_ptr<Writer> writer, ToolOutputs tools)
      : writer_(std::move(writer)), tools_(std::move(tools)) {}
  bool OnEvent(GenerateEvent event) override {
    if (tools_.format == ToolFormat::kNone || event.kind == GenerateEvent::Kind::kEcho ||
        event.index < 0 || event.index >= kMaxChoices) {
      return writer_->Write(EventToProto(std::move(event)));
    }
    if (tools_.texts.size() <= static_cast<size_t>(event.index)) {
      tools_.texts.resize(event.index + 1);
    }
    std::string& text = tools_.texts[event.index];
    text += event.text;
    const bool eos =
        event.kind == GenerateEvent::Kind::kFinished && event.finish_reason == FinishReason::kEos;
    v1::GenerateResponse m = EventToProto(std::move(event));
    if (eos) {
      const ParsedToolCalls parsed =
          ParseToolCalls(tools_.format, text, tools_.new_id, tools_.parallel);
      for (const ToolCall& call : parsed.calls) {
        v1::ToolCall* c = m.mutable_finished()->add_tool_calls();
        c->set_id(call.id);
        c->set_name(call.name);
        c->set_arguments(call.arguments);
      }
      if (!parsed.calls.empty()) m.mutable_finished()->set_reason(v1::FINISH_REASON_TOOL_CALLS);
    }
    return writer_->Write(std::move(m));
  }
  void OnDone(absl::Status status) override { writer_->Finish(rpc::ToGrpc(status)); }

 private:
  const std::shared_ptr<Writer> writer_;
  ToolOutputs tools_;
};

// A message's calls as the templates take them (ChatTurn::tool_calls).
absl::StatusOr<std::string> TemplateToolCalls(const v1::ChatMessage& m, int index) {
  using ordered = nlohmann::ordered_json;
  if (m.tool_calls_size() > 0 && m.role() != "assistant") {
    return absl::InvalidArgumentError(
        absl::StrCat("messages[", index, "].tool_calls belong to assistant messages"));
  }
  if (m.tool_call_id().size() > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("messages[", index, "].tool_call_id is over 256 bytes"));
  }
  ordered calls = ordered::array();
  for (const v1::ToolCall& c : m.tool_calls()) {
    ordered arguments =
        c.arguments().empty() ? ordered::object() : ordered::parse(c.arguments(), nullptr, false);
    if (!arguments.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("messages[", index, "].tool_calls[",
                                                     calls.size(),
                                                     "].arguments must be a JSON object's text"));
    }
    calls.push_back({{"id", c.id()},
                     {"type", "function"},
                     {"function", {{"name", c.name()}, {"arguments", std::move(arguments)}}}});
  }
  return calls.empty() ? std::string() : calls.dump();
}

absl::Status ChatFromProto(const v1::ChatMessages& chat, GenerateParams& p) {
  p.messages.emplace();
  for (const v1::ChatMessage& m : chat.messages()) {
    ASSIGN_OR_RETURN(std::string calls, TemplateToolCalls(m, static_cast<int>(p.messages->size())));
    p.messages->push_back({.role = m.role(),
                           .content = m.content(),
                           .name = m.name(),
                           .tool_calls = std::move(calls),
                           .tool_call_id = m.tool_call_id()});
  }
  for (const v1::Tool& t : chat.tools()) {
    p.tools.push_back(
        {.name = t.name(), .description = t.description(), .parameters = t.parameters()});
  }
  switch (chat.tool_choice()) {
    case v1::TOOL_CHOICE_AUTO:
      p.tool_choice = p.tools.empty() ? ToolChoiceKind::kNone : ToolChoiceKind::kAuto;
      break;
    case v1::TOOL_CHOICE_NONE:
      p.tool_choice = ToolChoiceKind::kNone;
      break;
    case v1::TOOL_CHOICE_REQUIRED:
      p.tool_choice = ToolChoiceKind::kRequired;
      break;
    case v1::TOOL_CHOICE_NAMED:
      p.tool_choice = ToolChoiceKind::kNamed;
      p.tool_choice_name = chat.tool_choice_name();
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tool_choice ", chat.tool_choice(), " is not a ToolChoice"));
  }
  if (p.tools.empty() && p.tool_choice != ToolChoiceKind::kNone) {
    return absl::InvalidArgumentError("tool_choice REQUIRED or NAMED needs `tools`");
  }
  p.parallel_tool_calls = !chat.single_tool_call();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GenerateParams> ParamsFromProto(const v1::GenerateRequest& r, absl::Time deadline) {
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
      RETURN_IF_ERROR(ChatFromProto(r.messages(), p));
      break;
    default:
      break;
  }
  const v1::SamplingParams& s = r.sampling();
  p.temperature = s.temperature();
  p.top_k = s.top_k();
  if (s.has_top_p()) p.top_p = s.top_p();
  p.min_p = s.min_p();
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
  p.constraint.forced_tokens.assign(s.constraint().forced_token_ids().begin(),
                                    s.constraint().forced_token_ids().end());
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
  absl::StatusOr<GenerateParams> params =
      ParamsFromProto(*request, FromRealTime(absl::FromChrono(context->deadline()), *clock_));
  if (!params.ok()) {
    writer->Finish(rpc::ToGrpc(params.status()));
    return reactor;
  }
  ToolOutputs tools;
  if (params->tool_choice != ToolChoiceKind::kNone) {
    tools.format = core_->ModelInfo().tool_format;
    tools.parallel = params->parallel_tool_calls;
    tools.new_id = NewToolCallIds(tools.format);
  }
  std::shared_ptr<RequestHandle> handle =
      core_->Submit(*std::move(params), std::make_shared<GrpcSink>(writer, std::move(tools)));
  // Weak: the handle holds the sink, which holds the writer.
  writer->OnCancel([weak = std::weak_ptr<RequestHandle>(handle)] {
    if (std::shared_ptr<RequestHandle> h = weak.lock()) h->Cancel();
  });
  return reactor;
}

}  // namespace tandem::router
