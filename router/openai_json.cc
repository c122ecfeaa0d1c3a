#include "router/openai_json.h"

#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace tandem::router::openai {
namespace {

using nlohmann::json;

// The field's value, or null when absent.
const json* Field(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status WrongType(const char* field, const char* expected, const json& value) {
  return absl::InvalidArgumentError(
      absl::StrCat("`", field, "` must be ", expected, ", not ", value.type_name()));
}

// An integer field within [lo, hi].
absl::StatusOr<int64_t> IntField(const char* field, const json& value, int64_t lo, int64_t hi) {
  if (!value.is_number_integer()) return WrongType(field, "an integer", value);
  if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return absl::InvalidArgumentError(
        absl::StrCat("`", field, "` is too large (at most ", hi, ")"));
  }
  const int64_t v = value.get<int64_t>();
  if (!value.is_number_unsigned() && (v < lo || v > hi)) {
    return absl::InvalidArgumentError(
        absl::StrCat("`", field, "` is ", v, "; it must be in [", lo, ", ", hi, "]"));
  }
  return v;
}

absl::StatusOr<double> NumberField(const char* field, const json& value) {
  if (!value.is_number()) return WrongType(field, "a number", value);
  return value.get<double>();
}

// prompt: a string, an array of token ids, or a one-element array of either.
absl::Status ParsePrompt(const json& prompt, v1::GenerateRequest& out) {
  if (prompt.is_string()) {
    out.set_text(prompt.get<std::string>());
    return absl::OkStatus();
  }
  if (!prompt.is_array()) {
    return WrongType("prompt", "a string or an array of token ids", prompt);
  }
  if (prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array())) {
    return ParsePrompt(prompt[0], out);
  }
  v1::TokenIds* ids = out.mutable_token_ids();
  for (size_t i = 0; i < prompt.size(); ++i) {
    const json& id = prompt[i];
    if (id.is_string() || id.is_array()) {
      return absl::InvalidArgumentError(
          "`prompt` holds several prompts; send one prompt per request");
    }
    if (!id.is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "`prompt` element ", i, " must be an integer token id, not ", id.type_name()));
    }
    if (id.is_number_unsigned() ? id.get<uint64_t>() > std::numeric_limits<int32_t>::max()
                                : (id.get<int64_t>() < std::numeric_limits<int32_t>::min() ||
                                   id.get<int64_t>() > std::numeric_limits<int32_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("`prompt` element ", i, " is not a token id of this model"));
    }
    ids->add_ids(static_cast<int32_t>(id.get<int64_t>()));
  }
  return absl::OkStatus();
}

// The body as a JSON object.
absl::StatusOr<json> ParseBody(std::string_view body) {
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError("the request body is not valid JSON");
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body must be a JSON object, not ", j.type_name()));
  }
  return j;
}

// The fields /v1/completions and /v1/chat/completions share: model,
// max_tokens, sampling, stop, stream, and the refusals of what is not
// served.
absl::Status ParseCommonFields(const json& j, int default_max_tokens, CompletionRequest& out) {
  v1::GenerateRequest& r = out.request;
  if (const json* v = Field(j, "model")) {
    if (!v->is_string()) return WrongType("model", "a string", *v);
    out.model = v->get<std::string>();
  }
  r.set_max_tokens(default_max_tokens);
  if (const json* v = Field(j, "max_tokens")) {
    absl::StatusOr<int64_t> n = IntField("max_tokens", *v, 1, std::numeric_limits<int32_t>::max());
    if (!n.ok()) return n.status();
    r.set_max_tokens(static_cast<int32_t>(*n));
  }
  v1::SamplingParams& s = *r.mutable_sampling();
  s.set_temperature(1.0f);
  if (const json* v = Field(j, "temperature")) {
    absl::StatusOr<double> t = NumberField("temperature", *v);
    if (!t.ok()) return t.status();
    s.set_temperature(static_cast<float>(*t));
  }
  if (const json* v = Field(j, "top_p")) {
    absl::StatusOr<double> p = NumberField("top_p", *v);
    if (!p.ok()) return p.status();
    s.set_top_p(static_cast<float>(*p));
  }
  if (const json* v = Field(j, "top_k")) {
    absl::StatusOr<int64_t> k = IntField("top_k", *v, -1, std::numeric_limits<int32_t>::max());
    if (!k.ok()) return k.status();
    s.set_top_k(*k < 0 ? 0 : static_cast<int32_t>(*k));
  }
  if (const json* v = Field(j, "seed")) {
    if (!v->is_number_integer()) return WrongType("seed", "an integer", *v);
    s.set_seed(v->is_number_unsigned() ? v->get<uint64_t>()
                                       : static_cast<uint64_t>(v->get<int64_t>()));
  }
  if (const json* v = Field(j, "stop")) {
    if (v->is_string()) {
      r.add_stop(v->get<std::string>());
    } else if (v->is_array()) {
      for (const json& e : *v) {
        if (!e.is_string()) return WrongType("stop", "a string or an array of strings", e);
        r.add_stop(e.get<std::string>());
      }
    } else {
      return WrongType("stop", "a string or an array of strings", *v);
    }
  }
  if (const json* v = Field(j, "stream")) {
    if (!v->is_boolean()) return WrongType("stream", "a boolean", *v);
    out.stream = v->get<bool>();
  }
  for (const char* field : {"n", "best_of"}) {
    if (const json* v = Field(j, field)) {
      if (!v->is_number_integer() || v->get<int64_t>() != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("`", field, "` must be 1: one completion per request is served"));
      }
    }
  }
  if (const json* v = Field(j, "echo"); v != nullptr && !(v->is_boolean() && !v->get<bool>())) {
    return absl::InvalidArgumentError("`echo` is not supported; leave it out or false");
  }
  // An integer count for /v1/completions, a bool for chat: 0 and false
  // ask for nothing.
  if (const json* v = Field(j, "logprobs"); v != nullptr &&
                                            !(v->is_number_integer() && v->get<int64_t>() == 0) &&
                                            !(v->is_boolean() && !v->get<bool>())) {
    return absl::InvalidArgumentError("`logprobs` is not supported; leave it out");
  }
  if (const json* v = Field(j, "suffix"); v != nullptr && !(v->is_string() && v->empty())) {
    return absl::InvalidArgumentError("`suffix` is not supported; leave it out");
  }
  return absl::OkStatus();
}

// One message's content: a string, or an array of {"type": "text", "text"}
// parts, concatenated.
absl::StatusOr<std::string> MessageContent(size_t index, const json& content) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("`messages[", index,
                     "].content` must be a string or an array of text parts, "
                     "not ",
                     content.type_name()));
  }
  std::string text;
  for (size_t p = 0; p < content.size(); ++p) {
    const json& part = content[p];
    const json* type = part.is_object() ? Field(part, "type") : nullptr;
    if (type == nullptr || !type->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("`messages[", index, "].content[", p,
                                                     "]` must be an object with a string `type`"));
    }
    if (type->get<std::string>() != "text") {
      return absl::InvalidArgumentError(absl::StrCat("`messages[", index, "].content[", p,
                                                     "]` has type '", type->get<std::string>(),
                                                     "'; only \"text\" parts are served"));
    }
    const json* t = Field(part, "text");
    if (t == nullptr || !t->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("`messages[", index, "].content[", p, "].text` must be a string"));
    }
    text += t->get<std::string>();
  }
  return text;
}

}  // namespace

absl::StatusOr<CompletionRequest> ParseCompletionRequest(std::string_view body) {
  absl::StatusOr<json> j = ParseBody(body);
  if (!j.ok()) return j.status();
  CompletionRequest out;
  const json* prompt = Field(*j, "prompt");
  if (prompt == nullptr) {
    return absl::InvalidArgumentError("`prompt` is required: a string or an array of token ids");
  }
  if (absl::Status s = ParsePrompt(*prompt, out.request); !s.ok()) return s;
  if (absl::Status s = ParseCommonFields(*j, kDefaultMaxTokens, out); !s.ok()) return s;
  return out;
}

absl::StatusOr<CompletionRequest> ParseChatCompletionRequest(std::string_view body) {
  absl::StatusOr<json> j = ParseBody(body);
  if (!j.ok()) return j.status();
  CompletionRequest out;
  out.chat = true;
  const json* messages = Field(*j, "messages");
  if (messages == nullptr || !messages->is_array()) {
    return absl::InvalidArgumentError(
        "`messages` is required: an array of {\"role\", \"content\"} objects");
  }
  v1::ChatMessages* chat = out.request.mutable_messages();
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    if (!m.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("`messages[", i, "]` must be an object, not ", m.type_name()));
    }
    const json* role = Field(m, "role");
    if (role == nullptr || !role->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("`messages[", i, "].role` is required: a string"));
    }
    for (const char* field : {"tool_calls", "function_call"}) {
      if (const json* v = Field(m, field); v != nullptr && !(v->is_array() && v->empty())) {
        return absl::InvalidArgumentError(
            absl::StrCat("`messages[", i, "].", field, "` is not supported; leave it out"));
      }
    }
    v1::ChatMessage* out_message = chat->add_messages();
    out_message->set_role(role->get<std::string>());
    if (const json* content = Field(m, "content")) {
      absl::StatusOr<std::string> text = MessageContent(i, *content);
      if (!text.ok()) return text.status();
      out_message->set_content(*std::move(text));
    }
  }
  if (absl::Status s = ParseCommonFields(*j, 0, out); !s.ok()) return s;
  // The newer name of max_tokens; it wins when both are given.
  if (const json* v = Field(*j, "max_completion_tokens")) {
    absl::StatusOr<int64_t> n =
        IntField("max_completion_tokens", *v, 1, std::numeric_limits<int32_t>::max());
    if (!n.ok()) return n.status();
    out.request.set_max_tokens(static_cast<int32_t>(*n));
  }
  if (const json* v = Field(*j, "top_logprobs");
      v != nullptr && !(v->is_number_integer() && v->get<int64_t>() == 0)) {
    return absl::InvalidArgumentError("`top_logprobs` is not supported; leave it out");
  }
  for (const char* field : {"tools", "functions"}) {
    if (const json* v = Field(*j, field); v != nullptr && !(v->is_array() && v->empty())) {
      return absl::InvalidArgumentError(
          absl::StrCat("`", field, "` is not supported: tool calls are not served"));
    }
  }
  if (const json* v = Field(*j, "response_format");
      v != nullptr && !(v->is_object() && v->value("type", "") == "text")) {
    return absl::InvalidArgumentError(
        "`response_format` is not supported; leave it out or {\"type\": \"text\"}");
  }
  return out;
}

std::string FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_LENGTH:
    case v1::FINISH_REASON_CONTEXT:
      return "length";
    default:
      return "stop";
  }
}

nlohmann::json UsageJson(const v1::Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens()},
          {"completion_tokens", usage.completion_tokens()},
          {"total_tokens", usage.prompt_tokens() + usage.completion_tokens()}};
}

namespace {

json Envelope(const CompletionMeta& meta, const char* object, json choice) {
  return {{"id", meta.id},
          {"object", object},
          {"created", meta.created},
          {"model", meta.model},
          {"choices", json::array({std::move(choice)})}};
}

const char* ChunkObject(const CompletionMeta& meta) {
  return meta.chat ? "chat.completion.chunk" : "text_completion";
}

}  // namespace

nlohmann::json CompletionResponse(const CompletionMeta& meta, const std::string& text,
                                  const v1::Finished& finished) {
  json r = meta.chat ? Envelope(meta, "chat.completion",
                                {{"index", 0},
                                 {"message", {{"role", "assistant"}, {"content", text}}},
                                 {"logprobs", nullptr},
                                 {"finish_reason", FinishReasonName(finished.reason())}})
                     : Envelope(meta, "text_completion",
                                {{"index", 0},
                                 {"text", text},
                                 {"logprobs", nullptr},
                                 {"finish_reason", FinishReasonName(finished.reason())}});
  r["usage"] = UsageJson(finished.usage());
  return r;
}

nlohmann::json RoleChunk(const CompletionMeta& meta) {
  return Envelope(meta, ChunkObject(meta),
                  {{"index", 0},
                   {"delta", {{"role", "assistant"}}},
                   {"logprobs", nullptr},
                   {"finish_reason", nullptr}});
}

nlohmann::json CompletionChunk(const CompletionMeta& meta, const std::string& text) {
  if (meta.chat) {
    return Envelope(meta, ChunkObject(meta),
                    {{"index", 0},
                     {"delta", {{"content", text}}},
                     {"logprobs", nullptr},
                     {"finish_reason", nullptr}});
  }
  return Envelope(
      meta, ChunkObject(meta),
      {{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", nullptr}});
}

nlohmann::json FinalChunk(const CompletionMeta& meta, const v1::Finished& finished) {
  json choice = {{"index", 0}};
  if (meta.chat) {
    choice["delta"] = json::object();
  } else {
    choice["text"] = "";
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = FinishReasonName(finished.reason());
  json r = Envelope(meta, ChunkObject(meta), std::move(choice));
  r["usage"] = UsageJson(finished.usage());
  return r;
}

std::string SseEvent(std::string_view payload) {
  std::string out = "data: ";
  out.append(payload);
  out += "\n\n";
  return out;
}

HttpError ErrorFor(const absl::Status& status) {
  HttpError e;
  const char* type = "server_error";
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      e.http_status = 400;
      type = "invalid_request_error";
      break;
    case absl::StatusCode::kNotFound:
      e.http_status = 404;
      type = "invalid_request_error";
      break;
    case absl::StatusCode::kResourceExhausted:
      e.http_status = 429;
      type = "rate_limit_error";
      break;
    case absl::StatusCode::kUnavailable:
      e.http_status = 503;
      type = "service_unavailable";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      type = "timeout";
      break;
    case absl::StatusCode::kCancelled:
      e.http_status = 499;
      type = "cancelled";
      break;
    default:
      e.http_status = 500;
      break;
  }
  e.body = {{"error",
             {{"message", std::string(status.message())},
              {"type", type},
              {"code", absl::AsciiStrToLower(absl::StatusCodeToString(status.code()))}}}};
  return e;
}

}  // namespace tandem::router::openai
