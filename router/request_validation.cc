#include "router/request_validation.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "router/reasoning.h"

namespace tandem::router {

namespace {

// The messages as the templates take them when tools are involved.
absl::StatusOr<jinja::Json> MessagesJson(const std::vector<ChatTurn>& messages) {
  jinja::Json out = jinja::Json::array();
  for (const ChatTurn& m : messages) {
    jinja::Json j = {{"role", m.role}, {"content", m.content}};
    if (!m.name.empty()) j["name"] = m.name;
    if (!m.reasoning_content.empty()) j["reasoning_content"] = m.reasoning_content;
    if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
    if (!m.tool_calls.empty()) {
      j["tool_calls"] = jinja::Json::parse(m.tool_calls, nullptr, false);
      if (j["tool_calls"].is_discarded()) {
        return absl::InvalidArgumentError("a message's tool_calls are not JSON");
      }
    }
    out.push_back(std::move(j));
  }
  return out;
}

jinja::Json ToolsJson(const std::vector<ToolFunction>& tools) {
  jinja::Json out = jinja::Json::array();
  for (const ToolFunction& t : tools) {
    jinja::Json f = {{"name", t.name}};
    if (!t.description.empty()) f["description"] = t.description;
    f["parameters"] = t.parameters.empty()
                          ? jinja::Json{{"type", "object"}, {"properties", jinja::Json::object()}}
                          : jinja::Json::parse(t.parameters, nullptr, false);
    out.push_back({{"type", "function"}, {"function", std::move(f)}});
  }
  return out;
}

// Whether `name` occurs in `source` as a whole word (a name the template
// may read).
bool MentionsName(absl::string_view source, absl::string_view name) {
  const auto word = [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_';
  };
  for (size_t at = source.find(name); at != absl::string_view::npos;
       at = source.find(name, at + 1)) {
    const size_t end = at + name.size();
    if ((at == 0 || !word(source[at - 1])) && (end == source.size() || !word(source[end]))) {
      return true;
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<jinja::Json> ChatTemplateKwargs(const std::string& text,
                                               const ChatTemplate& chat_template) {
  jinja::Json kwargs = jinja::Json::object();
  if (text.empty()) return kwargs;
  kwargs = jinja::Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!kwargs.is_object()) {
    return absl::InvalidArgumentError("`chat_template_kwargs` must be a JSON object");
  }
  static constexpr absl::string_view kSetByRender[] = {
      "messages",  "tools",     "documents", "add_generation_prompt", "bos_token",
      "eos_token", "unk_token", "pad_token", "raise_exception",       "strftime_now"};
  for (auto it = kwargs.begin(); it != kwargs.end(); ++it) {
    const std::string& key = it.key();
    const std::string where = absl::StrCat("`chat_template_kwargs.", key.substr(0, 64), "`");
    const bool name = !key.empty() && key.size() <= 64 &&
                      !absl::ascii_isdigit(static_cast<unsigned char>(key[0])) &&
                      std::all_of(key.begin(), key.end(), [](char c) {
                        return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_';
                      });
    if (!name) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is not a template variable name (1 to 64 of a-z, A-Z, 0-9 and _)"));
    }
    if (std::find(std::begin(kSetByRender), std::end(kSetByRender), key) !=
        std::end(kSetByRender)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " is set by the request itself; send it in its own field or leave it out"));
    }
    if (!MentionsName(chat_template.source(), key)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the served model's chat template does not read it; leave it out"));
    }
  }
  return kwargs;
}

bool GenerationPromptOpensThinking(const ChatTemplate& chat_template,
                                   const std::string& template_kwargs) {
  absl::StatusOr<jinja::Json> kwargs = ChatTemplateKwargs(template_kwargs, chat_template);
  if (!kwargs.ok()) return false;
  absl::StatusOr<std::string> text =
      chat_template.Render({{.role = "user", .content = "?"}}, true, *kwargs);
  return text.ok() && OpensThinking(*text);
}

absl::StatusOr<std::vector<int32_t>> ChatPromptIds(const std::vector<ChatTurn>& messages,
                                                   const Tokenizer& tokenizer,
                                                   const ChatTemplate& chat_template,
                                                   bool add_generation_prompt,
                                                   const std::vector<ToolFunction>& tools,
                                                   const std::string& template_kwargs) {
  if (messages.empty()) {
    return absl::InvalidArgumentError("messages is empty; send at least one message");
  }
  if (messages.size() > static_cast<size_t>(kMaxChatMessages)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the chat has ", messages.size(), " messages; at most ", kMaxChatMessages, " are served"));
  }
  std::vector<ChatMessage> chat;
  chat.reserve(messages.size());
  size_t bytes = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatTurn& m = messages[i];
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, " has role '", m.role.substr(0, 64),
                       "'; the role must be system, developer, user, assistant or tool"));
    }
    bytes += m.role.size() + m.content.size() + m.name.size() + m.tool_calls.size() +
             m.tool_call_id.size() + m.reasoning_content.size();
    if (bytes > kMaxChatBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the chat's roles and contents exceed ", kMaxChatBytes, " bytes; shorten the messages"));
    }
    chat.push_back({.role = m.role, .content = m.content, .name = m.name});
  }
  ASSIGN_OR_RETURN(jinja::Json extra, ChatTemplateKwargs(template_kwargs, chat_template));
  bool structured = !tools.empty();
  for (const ChatTurn& m : messages) {
    structured = structured || !m.tool_calls.empty() || !m.tool_call_id.empty() ||
                 !m.reasoning_content.empty();
  }
  absl::StatusOr<std::string> text;
  if (structured) {
    ASSIGN_OR_RETURN(jinja::Json json_messages, MessagesJson(messages));
    if (!tools.empty()) extra["tools"] = ToolsJson(tools);
    text = chat_template.RenderJson(json_messages, add_generation_prompt, extra);
  } else {
    text = chat_template.Render(chat, add_generation_prompt, extra);
  }
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the chat template refused the messages: ", text.status().message()));
  }
  // Only the plain default template may lack a BOS: every other template
  // writes the special tokens its model wants.
  const bool add_bos =
      (chat_template.is_default() || chat_template.source() == kDefaultChatTemplate) &&
      !chat_template.special_tokens().contains("bos_token");
  absl::StatusOr<std::vector<int32_t>> ids =
      tokenizer.Encode(*text, EncodeOptions{.add_bos = add_bos, .parse_special = true});
  if (!ids.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot tokenize the rendered chat: ", ids.status().message()));
  }
  if (ids->empty()) {
    return absl::InvalidArgumentError(
        "the chat template rendered an empty prompt; send messages with content");
  }
  return ids;
}

namespace {

absl::Status CheckRange(const char* name, float value, float lo, float hi, const char* unit) {
  if (!std::isfinite(value) || value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " is ", value, "; it must be in [", lo, ", ", hi, "]", unit));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> PromptIds(const GenerateParams& params,
                                               const ValidationContext& context) {
  const Tokenizer* tokenizer = context.tokenizer;
  const int forms = static_cast<int>(params.text.has_value()) +
                    static_cast<int>(params.token_ids.has_value()) +
                    static_cast<int>(params.messages.has_value());
  if (forms == 0) return absl::InvalidArgumentError("no prompt; set text, token_ids or messages");
  if (forms > 1) {
    return absl::InvalidArgumentError("more than one prompt; set one of text, token_ids, messages");
  }
  if (params.text.has_value()) {
    if (tokenizer == nullptr) {
      return absl::InvalidArgumentError(
          "this router has no tokenizer; send the prompt as token_ids");
    }
    if (params.text->size() > kMaxPromptBytes) {
      return absl::InvalidArgumentError(absl::StrCat("the prompt has ", params.text->size(),
                                                     " bytes; at most ", kMaxPromptBytes,
                                                     " are served"));
    }
    // An empty text gives BOS alone: generation from a new document.
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(*params.text, true);
    if (!ids.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot tokenize the prompt text: ", ids.status().message()));
    }
    return ids;
  }
  if (params.token_ids.has_value()) {
    if (params.token_ids->size() > static_cast<size_t>(kMaxPromptTokenIds)) {
      return absl::InvalidArgumentError(absl::StrCat("the prompt has ", params.token_ids->size(),
                                                     " token ids; at most ", kMaxPromptTokenIds,
                                                     " are served"));
    }
    if (!params.token_ids->empty()) return *params.token_ids;
    if (tokenizer == nullptr) {
      return absl::InvalidArgumentError(
          "prompt token_ids is empty and this router has no tokenizer to start from BOS; send "
          "at least one token");
    }
    return std::vector<int32_t>{tokenizer->bos_id()};
  }
  if (tokenizer == nullptr || context.chat_template == nullptr) {
    return absl::InvalidArgumentError(
        "this router has no tokenizer or chat template for chat messages; send the prompt as "
        "token_ids");
  }
  const bool tools = params.tool_choice != ToolChoiceKind::kNone;
  return ChatPromptIds(*params.messages, *tokenizer, *context.chat_template, true,
                       tools ? params.tools : std::vector<ToolFunction>{},
                       params.chat_template_kwargs);
}

// Tools need a chat and a template that takes them; "required" and a named
// function become the constraint of a call in the template's format.
// The constraint of the request: its response_format's, or that of the call
// a required or named tool_choice asks for.
absl::StatusOr<grammar::ConstraintSpec> ValidateTools(const GenerateParams& params,
                                                      const ValidationContext& context) {
  if (params.tool_choice == ToolChoiceKind::kNone) return params.constraint;
  if (!params.messages.has_value()) {
    return absl::InvalidArgumentError("`tools` go with chat `messages`");
  }
  const ToolFormat format = context.chat_template == nullptr
                                ? ToolFormat::kNone
                                : ToolFormatOf(context.chat_template->source());
  if (format == ToolFormat::kNone) {
    return absl::InvalidArgumentError(
        "the served model's chat template takes no tools; leave `tools` out (or serve a model "
        "whose template renders them: Llama 3.1/3.2, Qwen 2.5, Mistral)");
  }
  RETURN_IF_ERROR(CheckToolFunctions(params.tools, params.tool_choice, params.tool_choice_name));
  if (params.tool_choice == ToolChoiceKind::kAuto) return params.constraint;
  if (params.constraint.kind != grammar::ConstraintSpec::Kind::kNone) {
    return absl::InvalidArgumentError(
        "`response_format` with a required or named tool_choice is not supported: the output is "
        "the call; leave one out");
  }
  return ToolCallConstraint(format, params.tools, params.tool_choice, params.tool_choice_name,
                            context.tokenizer);
}

// The constraint compiled here once, so that a schema the workers cannot
// enforce is a 400 naming what to change (the workers compile it again,
// against their vocabulary, and keep it).
absl::Status ValidateConstraint(const grammar::ConstraintSpec& constraint, bool ignore_eos,
                                absl::string_view what, v1::SamplingParams& s) {
  using Kind = grammar::ConstraintSpec::Kind;
  if (constraint.kind == Kind::kNone) return absl::OkStatus();
  if (ignore_eos) {
    return absl::InvalidArgumentError(
        "`ignore_eos` cannot go with `response_format`: the output ends when its JSON is "
        "complete; remove one");
  }
  if (constraint.forced_tokens.size() > grammar::CompiledGrammar::kMaxForcedTokens) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", constraint.forced_tokens.size(),
                                                   " forced_token_ids; at most ",
                                                   grammar::CompiledGrammar::kMaxForcedTokens));
  }
  absl::StatusOr<std::shared_ptr<const grammar::Grammar>> compiled =
      grammar::CompileConstraint(constraint);
  if (!compiled.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", compiled.status().message()));
  }
  if (constraint.kind == Kind::kJsonObject) {
    s.mutable_constraint()->set_json_object(true);
  } else if (constraint.kind == Kind::kRegex) {
    s.mutable_constraint()->set_regex(constraint.schema);
  } else {
    s.mutable_constraint()->set_json_schema(constraint.schema);
  }
  s.mutable_constraint()->set_prefix(constraint.prefix);
  s.mutable_constraint()->set_suffix(constraint.suffix);
  for (const int32_t id : constraint.forced_tokens)
    s.mutable_constraint()->add_forced_token_ids(id);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ValidRequest> ValidateRequest(const GenerateParams& params,
                                             const ValidationContext& context) {
  if (!params.model.empty() && params.model != context.served_model_name) {
    return absl::NotFoundError(absl::StrCat("the model '", params.model.substr(0, 256),
                                            "' does not exist; this router serves '",
                                            context.served_model_name, "'"));
  }
  ValidRequest out;
  ASSIGN_OR_RETURN(out.prompt, PromptIds(params, context));
  if (params.text.has_value()) out.prompt_text = *params.text;
  if (params.max_tokens.has_value() && *params.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens is ", *params.max_tokens, "; it must be at least 1"));
  }
  out.max_tokens = params.max_tokens;
  if (params.n < 1 || params.n > kMaxChoices) {
    return absl::InvalidArgumentError(
        absl::StrCat("n is ", params.n, "; it must be in [1, ", kMaxChoices, "]"));
  }
  out.n = params.n;
  if (params.logprobs.has_value() && (*params.logprobs < 0 || *params.logprobs > kMaxTopLogprobs)) {
    return absl::InvalidArgumentError(absl::StrCat("logprobs is ", *params.logprobs,
                                                   "; it must be in [0, ", kMaxTopLogprobs, "]"));
  }
  out.logprobs = params.logprobs;
  if (!std::isfinite(params.temperature) || params.temperature < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature is ", params.temperature, "; it must be >= 0 (0 = greedy)"));
  }
  if (params.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k is ", params.top_k, "; it must be >= 0 (0 = no limit)"));
  }
  if (params.top_p.has_value() && !(*params.top_p > 0 && *params.top_p <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_p is ", *params.top_p, "; it must be in (0, 1] (1 or unset = no cut)"));
  }
  RETURN_IF_ERROR(CheckRange("min_p", params.min_p, 0, 1, " (0 = off)"));
  RETURN_IF_ERROR(CheckRange("presence_penalty", params.presence_penalty, -2, 2, ""));
  RETURN_IF_ERROR(CheckRange("frequency_penalty", params.frequency_penalty, -2, 2, ""));
  if (params.repetition_penalty.has_value() &&
      !(std::isfinite(*params.repetition_penalty) && *params.repetition_penalty > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "repetition_penalty is ", *params.repetition_penalty, "; it must be > 0 (1 = no penalty)"));
  }
  if (params.logit_bias.size() > static_cast<size_t>(kMaxLogitBias)) {
    return absl::InvalidArgumentError(absl::StrCat("logit_bias has ", params.logit_bias.size(),
                                                   " entries; at most ", kMaxLogitBias,
                                                   " are served"));
  }
  v1::SamplingParams& s = out.sampling;
  for (const auto& [id, bias] : params.logit_bias) {
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias names token ", id, "; token ids are >= 0"));
    }
    RETURN_IF_ERROR(
        CheckRange("a logit_bias value", bias, -kMaxLogitBiasValue, kMaxLogitBiasValue, ""));
    (*s.mutable_logit_bias())[id] = bias;
  }
  if (params.min_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_tokens is ", params.min_tokens, "; it must be >= 0"));
  }
  if (params.stop.size() > static_cast<size_t>(kMaxStopStrings)) {
    return absl::InvalidArgumentError(absl::StrCat("there are ", params.stop.size(),
                                                   " stop strings; at most ", kMaxStopStrings,
                                                   " are served"));
  }
  for (const std::string& stop : params.stop) {
    if (stop.empty()) return absl::InvalidArgumentError("a stop string is empty; remove it");
    if (stop.size() > kMaxStopBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a stop string has ", stop.size(), " bytes; at most ", kMaxStopBytes, " are served"));
    }
    out.stop.push_back(stop);
  }
  if (context.tokenizer == nullptr && !out.stop.empty()) {
    return absl::InvalidArgumentError(
        "this router has no tokenizer, so it cannot match stop strings; remove `stop`");
  }
  if (context.tokenizer == nullptr && (params.echo || params.logprobs.has_value())) {
    return absl::InvalidArgumentError(
        "this router has no tokenizer to give token texts; remove echo and logprobs");
  }
  out.echo = params.echo;
  if (params.timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("timeout_ms is ",
                                                   absl::ToInt64Milliseconds(params.timeout),
                                                   "; it must be >= 0 (0 = the router's default)"));
  }
  s.set_temperature(params.temperature);
  s.set_top_k(params.top_k);
  if (params.top_p.has_value()) s.set_top_p(*params.top_p);
  s.set_min_p(params.min_p);
  s.set_seed(params.seed.value_or(context.fresh_seed));
  s.set_presence_penalty(params.presence_penalty);
  s.set_frequency_penalty(params.frequency_penalty);
  if (params.repetition_penalty.has_value()) s.set_repetition_penalty(*params.repetition_penalty);
  s.set_min_tokens(params.min_tokens);
  ASSIGN_OR_RETURN(const grammar::ConstraintSpec constraint, ValidateTools(params, context));
  RETURN_IF_ERROR(ValidateConstraint(constraint, params.ignore_eos,
                                     params.constraint.kind == grammar::ConstraintSpec::Kind::kNone
                                         ? "the tool's parameters"
                                         : "response_format",
                                     s));
  // Every end-of-sequence id stops: Llama 3 instruct models end a turn with
  // <|eot_id|> but may also emit <|end_of_text|> or <|eom_id|>.
  if (context.tokenizer != nullptr && !params.ignore_eos) {
    for (const int32_t eos : context.tokenizer->eos_ids()) out.stop_token_ids.push_back(eos);
  }
  return out;
}

absl::StatusOr<std::string> DetokenizeIds(const Tokenizer& tokenizer,
                                          const std::vector<int32_t>& ids, bool skip_leading_bos) {
  IncrementalDetokenizer detok(tokenizer, -1);
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i == 0 && skip_leading_bos && ids[0] == tokenizer.bos_id()) continue;
    absl::StatusOr<std::string> piece = detok.Push(ids[i]);
    if (!piece.ok()) return absl::InvalidArgumentError(piece.status().message());
    text += *piece;
  }
  return text + detok.Flush();
}

absl::Status ResolveMaxTokens(ValidRequest& request, int vocab_size, int max_context,
                              int fallback_max_tokens) {
  const std::vector<int32_t>& prompt = request.prompt;
  if (vocab_size > 0) {
    for (size_t i = 0; i < prompt.size(); ++i) {
      if (prompt[i] < 0 || prompt[i] >= vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " is ", prompt[i],
                                                       ", outside the vocabulary [0, ", vocab_size,
                                                       "); send token ids of this model"));
      }
    }
    for (const auto& [id, bias] : request.sampling.logit_bias()) {
      if (id >= vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "logit_bias names token ", id, ", outside the vocabulary [0, ", vocab_size, ")"));
      }
    }
  }
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  if (max_context > 0 && prompt_len >= max_context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt has ", prompt_len, " tokens but the model's context is ", max_context,
        " tokens; shorten the prompt to at most ", max_context - 1, " tokens"));
  }
  if (!request.max_tokens.has_value()) {
    request.max_tokens =
        max_context > 0 ? static_cast<int>(max_context - prompt_len) : fallback_max_tokens;
  } else if (max_context > 0 && prompt_len + *request.max_tokens > max_context) {
    // 64-bit: max_tokens may be near INT32_MAX.
    return absl::InvalidArgumentError(absl::StrCat(
        "this model's maximum context length is ", max_context, " tokens, but ",
        prompt_len + int64_t{*request.max_tokens}, " were requested (", prompt_len,
        " in the prompt, ", *request.max_tokens, " to generate); lower max_tokens to at most ",
        max_context - prompt_len, " or shorten the prompt"));
  }
  if (request.sampling.min_tokens() > *request.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("min_tokens is ", request.sampling.min_tokens(),
                                                   " but max_tokens is ", *request.max_tokens,
                                                   "; min_tokens must be at most max_tokens"));
  }
  return absl::OkStatus();
}

absl::Status CheckFitsKvPool(const ValidRequest& request, int block_size, int kv_blocks,
                             int max_context) {
  if (block_size <= 0 || kv_blocks <= 0 || !request.max_tokens.has_value()) {
    return absl::OkStatus();
  }
  const int64_t prompt_len = static_cast<int64_t>(request.prompt.size());
  int64_t tokens = prompt_len + *request.max_tokens;
  if (max_context > 0) tokens = std::min<int64_t>(tokens, max_context);
  const int64_t per_choice = (tokens + block_size - 1) / block_size;
  const int64_t needed = per_choice * request.n;
  if (needed <= kv_blocks) return absl::OkStatus();
  std::string fix;
  const int64_t room = kv_blocks / request.n * int64_t{block_size} - prompt_len;
  if (room > 0) {
    absl::StrAppend(&fix, "lower max_tokens to at most ", room, " for n=", request.n);
  }
  const int64_t max_n = kv_blocks / per_choice;
  if (max_n >= 1) {
    absl::StrAppend(&fix, fix.empty() ? "" : ", or ", "lower n to at most ", max_n,
                    " for max_tokens=", *request.max_tokens);
  }
  if (fix.empty()) fix = "shorten the prompt";
  return absl::InvalidArgumentError(absl::StrCat(
      "the request needs ", needed, " KV blocks at once (", request.n, " choice",
      request.n == 1 ? "" : "s", " of ", tokens, " tokens: ", prompt_len, " in the prompt and ",
      *request.max_tokens, " to generate) but the largest decode worker's KV pool holds ",
      kv_blocks, " blocks of ", block_size, " tokens; ", fix));
}

}  // namespace tandem::router
