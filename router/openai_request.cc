// The OpenAI API's request bodies (openai_api.h): /v1/completions,
// /v1/chat/completions, /tokenize and /detokenize parsed and checked into
// the router's request types.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "router/openai_api.h"
#include "router/openai_fields.h"
#include "router/openai_response_format.h"
#include "router/openai_tools.h"

namespace tandem::router::openai_api {
namespace {

using nlohmann::json;

constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

bool IsName(absl::string_view s) {
  return !s.empty() && s.size() <= kMaxNameBytes && std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '_' || c == '-';
  });
}

// metadata: up to kMaxMetadataPairs string pairs, as OpenAI bounds them.
absl::Status ParseMetadata(const json& v, GenerateParams& p) {
  if (!v.is_object()) return WrongType("metadata", "an object of string values", v);
  if (v.size() > static_cast<size_t>(kMaxMetadataPairs)) {
    return absl::InvalidArgumentError(
        absl::StrCat("`metadata` has ", v.size(), " keys; at most ", kMaxMetadataPairs));
  }
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it.key().empty() || it.key().size() > kMaxMetadataKeyBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("`metadata` keys must be 1 to ", kMaxMetadataKeyBytes, " bytes"));
    }
    const std::string where = absl::StrCat("metadata[\"", it.key(), "\"]");
    ASSIGN_OR_RETURN(std::string value, StringField(where, *it));
    if (value.size() > kMaxMetadataValueBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("`", where, "` is over ", kMaxMetadataValueBytes, " bytes"));
    }
    p.metadata.emplace_back(it.key(), std::move(value));
  }
  return absl::OkStatus();
}

// vLLM's chat_template_kwargs: variables for the chat template (Qwen3's
// enable_thinking). Bounded here; validation checks that the template reads
// each of them.
absl::Status ParseChatTemplateKwargs(const json& v, GenerateParams& p) {
  if (!v.is_object()) return WrongType("chat_template_kwargs", "an object", v);
  if (v.size() > static_cast<size_t>(kMaxTemplateKwargs)) {
    return absl::InvalidArgumentError(absl::StrCat("`chat_template_kwargs` has ", v.size(),
                                                   " keys; at most ", kMaxTemplateKwargs));
  }
  std::string text = v.dump();
  if (text.size() > kMaxTemplateKwargsBytes) {
    return absl::InvalidArgumentError(absl::StrCat("`chat_template_kwargs` is ", text.size(),
                                                   " bytes of JSON; at most ",
                                                   kMaxTemplateKwargsBytes));
  }
  if (!v.empty()) p.chat_template_kwargs = std::move(text);
  return absl::OkStatus();
}

absl::StatusOr<json> ParseBody(absl::string_view body) {
  if (body.empty()) {
    return absl::InvalidArgumentError("the request body is empty: send a JSON object");
  }
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    // nlohmann's message says where and why ("parse error at line 1, column
    // 9: syntax error while parsing value - invalid literal; last read:
    // 'NaN'"); its "[json.exception.parse_error.101] " prefix is dropped.
    absl::string_view why = e.what();
    if (const size_t end = why.find("] ");
        absl::StartsWith(why, "[json.exception.") && end != absl::string_view::npos) {
      why.remove_prefix(end + 2);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "the request body is not valid JSON: ", why.substr(0, 300),
        " (JSON has no NaN or Infinity, numbers must fit a double, strings must be UTF-8)"));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body must be a JSON object, not ", j.type_name()));
  }
  return j;
}

absl::StatusOr<std::vector<int32_t>> TokenIds(absl::string_view field, const json& array) {
  std::vector<int32_t> ids;
  ids.reserve(array.size());
  for (size_t i = 0; i < array.size(); ++i) {
    ASSIGN_OR_RETURN(int64_t id,
                     IntField(absl::StrCat(field, "[", i, "]"), array[i], kInt32Min, kInt32Max));
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// prompt: a string, an array of token ids, or a one-element array of either.
absl::Status ParsePrompt(const json& prompt, GenerateParams& out) {
  if (prompt.is_string()) {
    out.text = prompt.get<std::string>();
    return absl::OkStatus();
  }
  if (!prompt.is_array()) return WrongType("prompt", "a string or an array of token ids", prompt);
  if (prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array())) {
    return ParsePrompt(prompt[0], out);
  }
  for (const json& e : prompt) {
    if (e.is_string() || e.is_array()) {
      return absl::InvalidArgumentError(
          "`prompt` holds several prompts; send one prompt per request (use `n` for several "
          "completions of one prompt)");
    }
  }
  ASSIGN_OR_RETURN(out.token_ids, TokenIds("prompt", prompt));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ChatTurn>> ParseMessages(const json& messages) {
  if (!messages.is_array()) {
    return absl::InvalidArgumentError(
        "`messages` is required: an array of {\"role\", \"content\"} objects");
  }
  std::vector<ChatTurn> turns;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return WrongType(where, "an object", m);
    for (auto it = m.begin(); it != m.end(); ++it) {
      const std::string& k = it.key();
      const bool empty = it->is_null() || (it->is_array() && it->empty());
      // What an SDK echoes back of a response message, when it says nothing.
      const bool echoed =
          k == "function_call" || k == "refusal" || k == "annotations" || k == "audio";
      if (k != "role" && k != "content" && k != "name" && k != "tool_calls" &&
          k != "tool_call_id" && k != "reasoning_content" && !(echoed && empty)) {
        return absl::InvalidArgumentError(
            absl::StrCat("`", where, ".", k, "` is not supported; leave it out"));
      }
    }
    const json* role = Field(m, "role");
    if (role == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("`", where,
                       ".role` is required: \"system\", \"developer\", \"user\", "
                       "\"assistant\" or \"tool\""));
    }
    if (!role->is_string()) return WrongType(absl::StrCat(where, ".role"), "a string", *role);
    ChatTurn turn{.role = role->get<std::string>(), .content = ""};
    // OpenAI's newer name for the system role: the templates know "system".
    if (turn.role == "developer") turn.role = "system";
    if (const json* name = Field(m, "name")) {
      ASSIGN_OR_RETURN(turn.name, StringField(absl::StrCat(where, ".name"), *name));
      if (!IsName(turn.name)) {
        return absl::InvalidArgumentError(
            absl::StrCat("`", where, ".name` must be 1 to ", kMaxNameBytes,
                         " characters of A-Z, a-z, 0-9, '_' and '-'"));
      }
    }
    if (const json* content = Field(m, "content")) {
      if (content->is_string()) {
        turn.content = content->get<std::string>();
      } else if (content->is_array()) {
        for (size_t p = 0; p < content->size(); ++p) {
          const json& part = (*content)[p];
          const std::string part_where = absl::StrCat(where, ".content[", p, "]");
          const json* type = part.is_object() ? Field(part, "type") : nullptr;
          if (type == nullptr || !type->is_string()) {
            return absl::InvalidArgumentError(
                absl::StrCat("`", part_where, "` must be an object with a string `type`"));
          }
          if (type->get<std::string>() != "text") {
            return absl::InvalidArgumentError(absl::StrCat("`", part_where, "` has type '",
                                                           type->get<std::string>(),
                                                           "'; only \"text\" parts are served"));
          }
          RETURN_IF_ERROR(OnlyKnownFields(part, {"type", "text"}, part_where));
          const json* text = Field(part, "text");
          if (text == nullptr || !text->is_string()) {
            return absl::InvalidArgumentError(
                absl::StrCat("`", part_where, ".text` must be a string"));
          }
          turn.content += text->get<std::string>();
        }
      } else {
        return WrongType(absl::StrCat(where, ".content"), "a string or an array of text parts",
                         *content);
      }
    }
    RETURN_IF_ERROR(ParseMessageToolFields(m, where, turn));
    // A thinking model's earlier reasoning, as its response gave it.
    if (const json* r = Field(m, "reasoning_content"); r != nullptr && !r->is_null()) {
      if (turn.role != "assistant") {
        return absl::InvalidArgumentError(absl::StrCat(
            "`", where, ".reasoning_content` goes only on an assistant message; leave it out"));
      }
      ASSIGN_OR_RETURN(turn.reasoning_content,
                       StringField(absl::StrCat(where, ".reasoning_content"), *r));
    }
    turns.push_back(std::move(turn));
  }
  return turns;
}

// What both endpoints share: model, sampling, penalties, limits, stop,
// stream and stream_options, n, seed, user.
absl::Status ParseCommon(const json& j, ApiRequest& out) {
  GenerateParams& p = out.params;
  if (const json* v = Field(j, "model")) {
    ASSIGN_OR_RETURN(p.model, StringField("model", *v));
  }
  if (const json* v = Field(j, "user")) {
    ASSIGN_OR_RETURN(p.user, StringField("user", *v));
    if (p.user.size() > kMaxUserBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("`user` is ", p.user.size(), " bytes; at most ", kMaxUserBytes));
    }
  }
  if (const json* v = Field(j, "max_tokens")) {
    ASSIGN_OR_RETURN(int64_t n, IntField("max_tokens", *v, 1, kInt32Max));
    p.max_tokens = static_cast<int>(n);
  }
  p.temperature = 1.0f;
  if (const json* v = Field(j, "temperature")) {
    ASSIGN_OR_RETURN(p.temperature, FloatField("temperature", *v));
    // OpenAI's range (tandem's gRPC API takes any temperature >= 0).
    if (!(p.temperature >= 0 && p.temperature <= 2)) {
      return absl::InvalidArgumentError(
          absl::StrCat("`temperature` is ", v->dump(), "; it must be in [0, 2] (0 = greedy)"));
    }
  }
  if (const json* v = Field(j, "metadata")) RETURN_IF_ERROR(ParseMetadata(*v, p));
  if (const json* v = Field(j, "store")) {
    ASSIGN_OR_RETURN(const bool store, BoolField("store", *v));
    if (store) {
      return absl::InvalidArgumentError(
          "`store`: true asks to keep the completion, and completions are not stored here; "
          "leave it out or false (`metadata` is written to the router's request log)");
    }
  }
  if (const json* v = Field(j, "top_p")) {
    ASSIGN_OR_RETURN(p.top_p, FloatField("top_p", *v));
  }
  if (const json* v = Field(j, "min_p")) {
    ASSIGN_OR_RETURN(p.min_p, FloatField("min_p", *v));
  }
  if (const json* v = Field(j, "top_k")) {
    ASSIGN_OR_RETURN(int64_t k, IntField("top_k", *v, -1, kInt32Max));
    p.top_k = k < 0 ? 0 : static_cast<int>(k);
  }
  if (const json* v = Field(j, "seed")) {
    ASSIGN_OR_RETURN(p.seed, SeedField("seed", *v));
  }
  if (const json* v = Field(j, "presence_penalty")) {
    ASSIGN_OR_RETURN(p.presence_penalty, FloatField("presence_penalty", *v));
  }
  if (const json* v = Field(j, "frequency_penalty")) {
    ASSIGN_OR_RETURN(p.frequency_penalty, FloatField("frequency_penalty", *v));
  }
  if (const json* v = Field(j, "repetition_penalty")) {
    ASSIGN_OR_RETURN(p.repetition_penalty, FloatField("repetition_penalty", *v));
  }
  if (const json* v = Field(j, "logit_bias")) {
    if (!v->is_object()) return WrongType("logit_bias", "an object of \"token id\": bias", *v);
    if (v->size() > static_cast<size_t>(kMaxLogitBias)) {
      return absl::InvalidArgumentError(
          absl::StrCat("`logit_bias` has ", v->size(), " entries; at most ", kMaxLogitBias));
    }
    for (auto it = v->begin(); it != v->end(); ++it) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(it.key(), &id)) {
        return absl::InvalidArgumentError(absl::StrCat("`logit_bias` key '", it.key(),
                                                       "' is not a token id (a decimal integer)"));
      }
      ASSIGN_OR_RETURN(float bias, FloatField(absl::StrCat("logit_bias[\"", it.key(), "\"]"), *it));
      p.logit_bias.emplace_back(id, bias);
    }
  }
  if (const json* v = Field(j, "min_tokens")) {
    ASSIGN_OR_RETURN(int64_t n, IntField("min_tokens", *v, 0, kInt32Max));
    p.min_tokens = static_cast<int>(n);
  }
  if (const json* v = Field(j, "ignore_eos")) {
    ASSIGN_OR_RETURN(p.ignore_eos, BoolField("ignore_eos", *v));
  }
  if (const json* v = Field(j, "stop")) {
    if (v->is_string()) {
      p.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      if (v->size() > static_cast<size_t>(kMaxStopStrings)) {
        return absl::InvalidArgumentError(
            absl::StrCat("`stop` has ", v->size(), " strings; at most ", kMaxStopStrings));
      }
      for (const json& e : *v) {
        if (!e.is_string()) return WrongType("stop", "a string or an array of strings", e);
        p.stop.push_back(e.get<std::string>());
      }
    } else {
      return WrongType("stop", "a string or an array of strings", *v);
    }
  }
  if (const json* v = Field(j, "n")) {
    ASSIGN_OR_RETURN(int64_t n, IntField("n", *v, 1, kMaxChoices));
    p.n = static_cast<int>(n);
  }
  if (const json* v = Field(j, "priority")) {
    ASSIGN_OR_RETURN(int64_t priority, IntField("priority", *v, kMinPriority, kMaxPriority));
    p.priority = static_cast<int>(priority);
  }
  if (const json* v = Field(j, "stream")) {
    ASSIGN_OR_RETURN(out.stream, BoolField("stream", *v));
  }
  if (const json* v = Field(j, "stream_options")) {
    if (!out.stream) {
      return absl::InvalidArgumentError("`stream_options` is only allowed with \"stream\": true");
    }
    if (!v->is_object()) return WrongType("stream_options", "an object", *v);
    RETURN_IF_ERROR(OnlyKnownFields(*v, {"include_usage"}, "stream_options"));
    if (const json* u = Field(*v, "include_usage")) {
      ASSIGN_OR_RETURN(out.include_usage, BoolField("stream_options.include_usage", *u));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ApiRequest> ParseCompletionRequest(absl::string_view body) {
  ASSIGN_OR_RETURN(json j, ParseBody(body));
  RETURN_IF_ERROR(OnlyKnownFields(j,
                                  {"model",
                                   "prompt",
                                   "suffix",
                                   "max_tokens",
                                   "temperature",
                                   "top_p",
                                   "n",
                                   "stream",
                                   "stream_options",
                                   "logprobs",
                                   "echo",
                                   "stop",
                                   "presence_penalty",
                                   "frequency_penalty",
                                   "best_of",
                                   "logit_bias",
                                   "user",
                                   "seed",
                                   "priority",
                                   "top_k",
                                   "min_p",
                                   "repetition_penalty",
                                   "min_tokens",
                                   "ignore_eos",
                                   "metadata",
                                   "store",
                                   "response_format"},
                                  "/v1/completions"));
  ApiRequest out;
  out.endpoint = Endpoint::kCompletions;
  out.params.max_tokens = kDefaultCompletionMaxTokens;
  const json* prompt = Field(j, "prompt");
  if (prompt == nullptr) {
    return absl::InvalidArgumentError("`prompt` is required: a string or an array of token ids");
  }
  RETURN_IF_ERROR(ParsePrompt(*prompt, out.params));
  RETURN_IF_ERROR(ParseCommon(j, out));
  // Not in OpenAI's /v1/completions; served as vLLM and SGLang do.
  if (const json* v = Field(j, "response_format")) {
    RETURN_IF_ERROR(ParseResponseFormat(*v, body, out.params));
  }
  if (const json* v = Field(j, "echo")) {
    ASSIGN_OR_RETURN(out.params.echo, BoolField("echo", *v));
  }
  if (const json* v = Field(j, "logprobs")) {
    ASSIGN_OR_RETURN(int64_t n, IntField("logprobs", *v, 0, kMaxTopLogprobs));
    out.params.logprobs = static_cast<int>(n);
  }
  if (const json* v = Field(j, "suffix");
      v != nullptr && !(v->is_string() && v->get<std::string>().empty())) {
    return absl::InvalidArgumentError("`suffix` is not supported (no insertion); leave it out");
  }
  if (const json* v = Field(j, "best_of")) {
    ASSIGN_OR_RETURN(int64_t b, IntField("best_of", *v, 1, kMaxChoices));
    if (b != out.params.n) {
      return absl::InvalidArgumentError(
          absl::StrCat("`best_of` is ", b, " but `n` is ", out.params.n,
                       "; only best_of equal to n is served (leave best_of out)"));
    }
  }
  return out;
}

absl::StatusOr<ApiRequest> ParseChatRequest(absl::string_view body) {
  ASSIGN_OR_RETURN(json j, ParseBody(body));
  RETURN_IF_ERROR(OnlyKnownFields(j,
                                  {"model",
                                   "messages",
                                   "max_tokens",
                                   "max_completion_tokens",
                                   "temperature",
                                   "top_p",
                                   "n",
                                   "stream",
                                   "stream_options",
                                   "logprobs",
                                   "top_logprobs",
                                   "stop",
                                   "presence_penalty",
                                   "frequency_penalty",
                                   "logit_bias",
                                   "user",
                                   "seed",
                                   "priority",
                                   "top_k",
                                   "min_p",
                                   "repetition_penalty",
                                   "min_tokens",
                                   "ignore_eos",
                                   "metadata",
                                   "store",
                                   "parallel_tool_calls",
                                   "tools",
                                   "tool_choice",
                                   "functions",
                                   "function_call",
                                   "response_format",
                                   "chat_template_kwargs"},
                                  "/v1/chat/completions"));
  ApiRequest out;
  out.endpoint = Endpoint::kChat;
  const json* messages = Field(j, "messages");
  if (messages == nullptr) {
    return absl::InvalidArgumentError(
        "`messages` is required: an array of {\"role\", \"content\"} objects");
  }
  ASSIGN_OR_RETURN(out.params.messages, ParseMessages(*messages));
  RETURN_IF_ERROR(ParseCommon(j, out));
  // The newer name of max_tokens; it wins when both are given.
  if (const json* v = Field(j, "max_completion_tokens")) {
    ASSIGN_OR_RETURN(int64_t n, IntField("max_completion_tokens", *v, 1, kInt32Max));
    out.params.max_tokens = static_cast<int>(n);
  }
  bool logprobs = false;
  if (const json* v = Field(j, "logprobs")) {
    ASSIGN_OR_RETURN(logprobs, BoolField("logprobs", *v));
  }
  if (const json* v = Field(j, "top_logprobs")) {
    ASSIGN_OR_RETURN(int64_t n, IntField("top_logprobs", *v, 0, kMaxTopLogprobs));
    if (!logprobs && n > 0) {
      return absl::InvalidArgumentError("`top_logprobs` needs \"logprobs\": true");
    }
    if (logprobs) out.params.logprobs = static_cast<int>(n);
  }
  if (logprobs && !out.params.logprobs.has_value()) out.params.logprobs = 0;
  // The deprecated forms of tools: refused, saying which to use.
  if (const json* v = Field(j, "functions"); v != nullptr && !(v->is_array() && v->empty())) {
    return absl::InvalidArgumentError("`functions` is not supported: send them as `tools`");
  }
  if (const json* v = Field(j, "function_call");
      v != nullptr && !(v->is_string() && *v == "none")) {
    return absl::InvalidArgumentError(
        "`function_call` is not supported: use `tool_choice` (leave it out or \"none\")");
  }
  RETURN_IF_ERROR(ParseTools(j, body, out.params));
  if (const json* v = Field(j, "response_format")) {
    RETURN_IF_ERROR(ParseResponseFormat(*v, body, out.params));
  }
  if (const json* v = Field(j, "chat_template_kwargs"); v != nullptr && !v->is_null()) {
    RETURN_IF_ERROR(ParseChatTemplateKwargs(*v, out.params));
  }
  return out;
}

absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(absl::string_view body) {
  ASSIGN_OR_RETURN(json j, ParseBody(body));
  RETURN_IF_ERROR(OnlyKnownFields(
      j, {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt"},
      "/tokenize"));
  TokenizeRequest out;
  if (const json* v = Field(j, "model")) {
    ASSIGN_OR_RETURN(out.model, StringField("model", *v));
  }
  const json* prompt = Field(j, "prompt");
  const json* messages = Field(j, "messages");
  if ((prompt == nullptr) == (messages == nullptr)) {
    return absl::InvalidArgumentError("send exactly one of `prompt` (a string) and `messages`");
  }
  if (prompt != nullptr) {
    ASSIGN_OR_RETURN(out.prompt, StringField("prompt", *prompt));
    if (Field(j, "add_generation_prompt") != nullptr) {
      return absl::InvalidArgumentError(
          "`add_generation_prompt` goes with `messages`, not `prompt`");
    }
    if (const json* v = Field(j, "add_special_tokens")) {
      ASSIGN_OR_RETURN(out.add_special_tokens, BoolField("add_special_tokens", *v));
    }
    return out;
  }
  ASSIGN_OR_RETURN(out.messages, ParseMessages(*messages));
  if (const json* v = Field(j, "add_generation_prompt")) {
    ASSIGN_OR_RETURN(out.add_generation_prompt, BoolField("add_generation_prompt", *v));
  }
  if (const json* v = Field(j, "add_special_tokens"); v != nullptr && *v != false) {
    return absl::InvalidArgumentError(
        "`add_special_tokens` with `messages` is not supported: the chat template places the "
        "special tokens; leave it out");
  }
  return out;
}

absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(absl::string_view body) {
  ASSIGN_OR_RETURN(json j, ParseBody(body));
  RETURN_IF_ERROR(OnlyKnownFields(j, {"model", "tokens"}, "/detokenize"));
  DetokenizeRequest out;
  if (const json* v = Field(j, "model")) {
    ASSIGN_OR_RETURN(out.model, StringField("model", *v));
  }
  const json* tokens = Field(j, "tokens");
  if (tokens == nullptr || !tokens->is_array()) {
    return absl::InvalidArgumentError("`tokens` is required: an array of token ids");
  }
  if (tokens->size() > static_cast<size_t>(kMaxPromptTokenIds)) {
    return absl::InvalidArgumentError(
        absl::StrCat("`tokens` holds more than ", kMaxPromptTokenIds, " ids"));
  }
  ASSIGN_OR_RETURN(out.tokens, TokenIds("tokens", *tokens));
  return out;
}

}  // namespace tandem::router::openai_api
