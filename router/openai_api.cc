#include "router/openai_api.h"

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"

namespace tandem::router::openai_api {
namespace {

using nlohmann::json;

constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// The field's value, or null when absent or JSON null.
const json* Field(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status WrongType(absl::string_view field, const char* expected, const json& value) {
  return absl::InvalidArgumentError(
      absl::StrCat("`", field, "` must be ", expected, ", not ", value.type_name()));
}

absl::Status OnlyKnownFields(const json& object, std::initializer_list<absl::string_view> known,
                             absl::string_view where) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    bool found = false;
    for (absl::string_view k : known) found = found || it.key() == k;
    if (!found) {
      return absl::InvalidArgumentError(
          absl::StrCat("`", it.key(), "` is not supported by ", where, "; leave it out"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> IntField(absl::string_view field, const json& value, int64_t lo,
                                 int64_t hi) {
  if (!value.is_number_integer()) return WrongType(field, "an integer", value);
  const bool too_large =
      value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(hi);
  const int64_t v = too_large ? hi : value.get<int64_t>();
  if (too_large || v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("`", field, "` is ", value.dump(), "; it must be in [", lo, ", ", hi, "]"));
  }
  return v;
}

absl::StatusOr<float> FloatField(absl::string_view field, const json& value) {
  if (!value.is_number()) return WrongType(field, "a number", value);
  const double d = value.get<double>();
  if (!std::isfinite(static_cast<float>(d))) {
    return absl::InvalidArgumentError(absl::StrCat("`", field, "` is out of range"));
  }
  return static_cast<float>(d);
}

absl::StatusOr<bool> BoolField(absl::string_view field, const json& value) {
  if (!value.is_boolean()) return WrongType(field, "a boolean", value);
  return value.get<bool>();
}

absl::StatusOr<std::string> StringField(absl::string_view field, const json& value) {
  if (!value.is_string()) return WrongType(field, "a string", value);
  return value.get<std::string>();
}

absl::StatusOr<json> ParseBody(absl::string_view body) {
  if (body.empty()) {
    return absl::InvalidArgumentError("the request body is empty: send a JSON object");
  }
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("the request body is not valid JSON");
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
      if (k != "role" && k != "content" &&
          !((k == "tool_calls" || k == "function_call") && empty)) {
        return absl::InvalidArgumentError(
            absl::StrCat("`", where, ".", k, "` is not supported; leave it out"));
      }
    }
    const json* role = Field(m, "role");
    if (role == nullptr || !role->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("`", where, ".role` is required: a string"));
    }
    ChatTurn turn{.role = role->get<std::string>(), .content = ""};
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
  if (const json* v = Field(j, "user")) RETURN_IF_ERROR(StringField("user", *v).status());
  if (const json* v = Field(j, "max_tokens")) {
    ASSIGN_OR_RETURN(int64_t n, IntField("max_tokens", *v, kInt32Min, kInt32Max));
    p.max_tokens = static_cast<int>(n);
  }
  p.temperature = 1.0f;
  if (const json* v = Field(j, "temperature")) {
    ASSIGN_OR_RETURN(p.temperature, FloatField("temperature", *v));
  }
  if (const json* v = Field(j, "top_p")) {
    ASSIGN_OR_RETURN(p.top_p, FloatField("top_p", *v));
  }
  if (const json* v = Field(j, "top_k")) {
    ASSIGN_OR_RETURN(int64_t k, IntField("top_k", *v, -1, kInt32Max));
    p.top_k = k < 0 ? 0 : static_cast<int>(k);
  }
  if (const json* v = Field(j, "seed")) {
    if (!v->is_number_integer()) return WrongType("seed", "an integer", *v);
    p.seed =
        v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
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
                                   "repetition_penalty",
                                   "min_tokens",
                                   "ignore_eos"},
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
                                   "repetition_penalty",
                                   "min_tokens",
                                   "ignore_eos",
                                   "tools",
                                   "tool_choice",
                                   "functions",
                                   "function_call",
                                   "response_format"},
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
    ASSIGN_OR_RETURN(int64_t n, IntField("max_completion_tokens", *v, kInt32Min, kInt32Max));
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
  for (const char* field : {"tools", "functions"}) {
    if (const json* v = Field(j, field); v != nullptr && !(v->is_array() && v->empty())) {
      return absl::InvalidArgumentError(
          absl::StrCat("`", field, "` is not supported: tool calls are not served"));
    }
  }
  for (const char* field : {"tool_choice", "function_call"}) {
    if (const json* v = Field(j, field); v != nullptr && !(v->is_string() && *v == "none")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "`", field, "` is not supported: tool calls are not served (leave it out or \"none\")"));
    }
  }
  if (const json* v = Field(j, "response_format");
      v != nullptr && !(v->is_object() && v->size() == 1 && v->value("type", "") == "text")) {
    return absl::InvalidArgumentError(
        "`response_format` is not supported; leave it out or {\"type\": \"text\"}");
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

const char* OpenAiFinishReason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
    case FinishReason::kContext:
      return "length";
    default:
      return "stop";
  }
}

// --- responses -------------------------------------------------------------

namespace {

json BytesOf(const std::string& s) {
  json out = json::array();
  for (char c : s) out.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return out;
}

// Chat's logprobs entries: {token, logprob, bytes, top_logprobs: [...]}.
json ChatLogprobEntries(const std::vector<TokenLogprob>& lps) {
  json out = json::array();
  for (const TokenLogprob& lp : lps) {
    json top = json::array();
    for (const TopLogprob& t : lp.top) {
      top.push_back({{"token", t.token}, {"logprob", t.logprob}, {"bytes", BytesOf(t.token)}});
    }
    out.push_back({{"token", lp.token},
                   {"logprob", lp.logprob},
                   {"bytes", BytesOf(lp.token)},
                   {"top_logprobs", std::move(top)}});
  }
  return out;
}

// Completions' logprobs object {tokens, token_logprobs, top_logprobs,
// text_offset} for `lps`; with `first_text` set, a first entry for the
// prompt's first token, which has no logprob (null, as OpenAI's echo).
// `offset` is the text_offset of the next token (bytes into the choice's
// text) and moves past these.
json CompletionLogprobs(const std::vector<TokenLogprob>& lps,
                        const std::optional<std::string>& first_text, size_t& offset) {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset = json::array();
  if (first_text.has_value()) {
    tokens.push_back(*first_text);
    token_logprobs.push_back(nullptr);
    top_logprobs.push_back(nullptr);
    text_offset.push_back(offset);
    offset += first_text->size();
  }
  for (const TokenLogprob& lp : lps) {
    tokens.push_back(lp.token);
    token_logprobs.push_back(lp.logprob);
    json top = json::object();
    for (const TopLogprob& t : lp.top) top[t.token] = t.logprob;
    top_logprobs.push_back(std::move(top));
    text_offset.push_back(offset);
    offset += lp.token.size();
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(text_offset)}};
}

// Appends the arrays of `more` to those of `into` (completions' logprobs).
void ExtendCompletionLogprobs(json& into, json more) {
  if (into.is_null()) {
    into = std::move(more);
    return;
  }
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    for (json& e : more[key]) into[key].push_back(std::move(e));
  }
}

absl::Status CheckIndex(const GenerateEvent& e, int n) {
  if (e.index < 0 || e.index >= n) {
    return absl::InternalError(
        absl::StrCat("the router sent choice ", e.index, " of a request for ", n));
  }
  return absl::OkStatus();
}

}  // namespace

nlohmann::json UsageJson(int prompt_tokens, int cached_tokens, int completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", static_cast<int64_t>(prompt_tokens) + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

ResponseBuilder::ResponseBuilder(ResponseMeta meta)
    : meta_(std::move(meta)), choices_(static_cast<size_t>(std::max(meta_.n, 1))) {}

void ResponseBuilder::AppendLogprobs(Choice& c, const std::vector<TokenLogprob>& lps,
                                     bool echo_first, int32_t first_id) {
  if (meta_.endpoint == Endpoint::kChat) {
    if (c.logprobs.is_null()) c.logprobs = {{"content", json::array()}};
    for (json& e : ChatLogprobEntries(lps)) c.logprobs["content"].push_back(std::move(e));
    return;
  }
  std::optional<std::string> first;
  if (echo_first) first = meta_.token_text ? meta_.token_text(first_id) : std::string();
  ExtendCompletionLogprobs(c.logprobs, CompletionLogprobs(lps, first, c.text_offset));
}

absl::Status ResponseBuilder::Add(const GenerateEvent& e) {
  switch (e.kind) {
    case GenerateEvent::Kind::kEcho:
      for (Choice& c : choices_) {
        c.text += e.text;
        if (meta_.logprobs) {
          AppendLogprobs(c, e.logprobs, !e.token_ids.empty(),
                         e.token_ids.empty() ? 0 : e.token_ids.front());
        }
      }
      return absl::OkStatus();
    case GenerateEvent::Kind::kTokens: {
      RETURN_IF_ERROR(CheckIndex(e, meta_.n));
      Choice& c = choices_[e.index];
      c.text += e.text;
      if (meta_.logprobs) AppendLogprobs(c, e.logprobs, false, 0);
      return absl::OkStatus();
    }
    case GenerateEvent::Kind::kFinished:
      RETURN_IF_ERROR(CheckIndex(e, meta_.n));
      choices_[e.index].finish = e.finish_reason;
      prompt_tokens_ = e.prompt_tokens;
      cached_tokens_ = e.cached_tokens;
      completion_tokens_ += e.completion_tokens;
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

nlohmann::json ResponseBuilder::Build() const {
  const bool chat = meta_.endpoint == Endpoint::kChat;
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    json choice = {{"index", i}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = c.text;
    }
    json logprobs = c.logprobs;
    if (meta_.logprobs && logprobs.is_null()) {
      size_t offset = 0;
      logprobs =
          chat ? json{{"content", json::array()}} : CompletionLogprobs({}, std::nullopt, offset);
    }
    choice["logprobs"] = meta_.logprobs ? std::move(logprobs) : json(nullptr);
    choice["finish_reason"] =
        c.finish.has_value() ? json(OpenAiFinishReason(*c.finish)) : json(nullptr);
    choices.push_back(std::move(choice));
  }
  return {{"id", meta_.id},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", meta_.created},
          {"model", meta_.model},
          {"choices", std::move(choices)},
          {"usage", UsageJson(prompt_tokens_, cached_tokens_, completion_tokens_)}};
}

StreamBuilder::StreamBuilder(ResponseMeta meta)
    : meta_(std::move(meta)), text_offsets_(static_cast<size_t>(std::max(meta_.n, 1)), 0) {}

nlohmann::json StreamBuilder::Chunk(nlohmann::json choices) const {
  json chunk = {
      {"id", meta_.id},
      {"object", meta_.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
      {"created", meta_.created},
      {"model", meta_.model},
      {"choices", std::move(choices)}};
  if (meta_.include_usage) chunk["usage"] = nullptr;
  return chunk;
}

std::string StreamBuilder::Start() {
  if (meta_.endpoint != Endpoint::kChat) return "";
  std::string out;
  for (int i = 0; i < meta_.n; ++i) {
    out += SseEvent(Dump(Chunk(json::array({{{"index", i},
                                             {"delta", {{"role", "assistant"}, {"content", ""}}},
                                             {"logprobs", nullptr},
                                             {"finish_reason", nullptr}}}))));
  }
  return out;
}

std::string StreamBuilder::ChoiceChunk(int index, const std::string& text,
                                       const std::vector<TokenLogprob>& lps, bool echo,
                                       int32_t first_id) {
  json choice = {{"index", index}};
  if (meta_.endpoint == Endpoint::kChat) {
    choice["delta"] = {{"content", text}};
    choice["logprobs"] =
        meta_.logprobs ? json{{"content", ChatLogprobEntries(lps)}} : json(nullptr);
  } else {
    choice["text"] = text;
    std::optional<std::string> first;
    if (echo) first = meta_.token_text ? meta_.token_text(first_id) : std::string();
    choice["logprobs"] =
        meta_.logprobs ? CompletionLogprobs(lps, first, text_offsets_[index]) : json(nullptr);
  }
  choice["finish_reason"] = nullptr;
  return SseEvent(Dump(Chunk(json::array({std::move(choice)}))));
}

absl::StatusOr<std::string> StreamBuilder::OnEvent(const GenerateEvent& e) {
  switch (e.kind) {
    case GenerateEvent::Kind::kEcho: {
      // The prompt opens every choice.
      std::string out;
      for (int i = 0; i < meta_.n; ++i) {
        out += ChoiceChunk(i, e.text, e.logprobs, !e.token_ids.empty(),
                           e.token_ids.empty() ? 0 : e.token_ids.front());
      }
      return out;
    }
    case GenerateEvent::Kind::kTokens:
      RETURN_IF_ERROR(CheckIndex(e, meta_.n));
      if (e.text.empty() && e.logprobs.empty()) return std::string();
      return ChoiceChunk(e.index, e.text, e.logprobs, false, 0);
    case GenerateEvent::Kind::kFinished: {
      RETURN_IF_ERROR(CheckIndex(e, meta_.n));
      prompt_tokens_ = e.prompt_tokens;
      cached_tokens_ = e.cached_tokens;
      completion_tokens_ += e.completion_tokens;
      json choice = {{"index", e.index}};
      if (meta_.endpoint == Endpoint::kChat) {
        choice["delta"] = json::object();
      } else {
        choice["text"] = "";
      }
      choice["logprobs"] = nullptr;
      choice["finish_reason"] = OpenAiFinishReason(e.finish_reason);
      return SseEvent(Dump(Chunk(json::array({std::move(choice)}))));
    }
  }
  return std::string();
}

std::string StreamBuilder::Finish() const {
  std::string out;
  if (meta_.include_usage) {
    json chunk = Chunk(json::array());
    chunk["usage"] = UsageJson(prompt_tokens_, cached_tokens_, completion_tokens_);
    out += SseEvent(Dump(chunk));
  }
  out += SseEvent("[DONE]");
  return out;
}

std::string StreamBuilder::Failure(const absl::Status& status) {
  return SseEvent(Dump(ErrorFor(status).body)) + SseEvent("[DONE]");
}

std::string SseEvent(absl::string_view payload) {
  std::string out = "data: ";
  out.append(payload.data(), payload.size());
  out += "\n\n";
  return out;
}

std::string Dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
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
    case absl::StatusCode::kUnauthenticated:
      e.http_status = 401;
      type = "authentication_error";
      break;
    case absl::StatusCode::kPermissionDenied:
      e.http_status = 403;
      type = "permission_error";
      break;
    case absl::StatusCode::kNotFound:
      e.http_status = 404;
      type = "invalid_request_error";
      break;
    case absl::StatusCode::kResourceExhausted:
      e.http_status = 429;
      type = "rate_limit_error";
      break;
    case absl::StatusCode::kCancelled:
      e.http_status = 499;
      type = "cancelled";
      break;
    case absl::StatusCode::kUnavailable:
      e.http_status = 503;
      type = "service_unavailable";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      type = "timeout";
      break;
    default:
      break;
  }
  e.body = {{"error",
             {{"message", std::string(status.message())},
              {"type", type},
              {"param", nullptr},
              {"code", absl::AsciiStrToLower(absl::StatusCodeToString(status.code()))}}}};
  return e;
}

}  // namespace tandem::router::openai_api
