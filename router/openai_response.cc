// The OpenAI API's responses (openai_api.h): whole responses and SSE
// chunks built from a request's events, usage, and the HTTP error of a
// status.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "router/openai_api.h"

namespace tandem::router::openai_api {

const char* OpenAiFinishReason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
    case FinishReason::kContext:
      return "length";
    default:
      return "stop";
  }
}

namespace {

using nlohmann::json;

// OpenAI's tool_calls: [{"id", "type": "function", "function": {"name",
// "arguments": a JSON string}}], with each entry's "index" in a stream.
json ToolCallsJson(const std::vector<ToolCall>& calls, bool stream) {
  json out = json::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    json call = {{"id", calls[k].id},
                 {"type", "function"},
                 {"function", {{"name", calls[k].name}, {"arguments", calls[k].arguments}}}};
    if (stream) call["index"] = k;
    out.push_back(std::move(call));
  }
  return out;
}

// The meta's id maker, or "call_" and a counter.
std::function<std::string()> CallIds(const ResponseMeta& meta) {
  if (meta.tool_call_id) return meta.tool_call_id;
  return [n = std::make_shared<int>(0)] { return absl::StrCat("call_", (*n)++); };
}

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
    const char* finish = c.finish.has_value() ? OpenAiFinishReason(*c.finish) : nullptr;
    if (chat) {
      ReasoningParts parts{.reasoning = {}, .content = c.text};
      if (meta_.reasoning) parts = ReasoningSplitter::Split(c.text, meta_.thinking_open);
      choice["message"] = {{"role", "assistant"}, {"content", parts.content}};
      // An output cut by max_tokens is text: its call would not parse.
      if (meta_.tool_format != ToolFormat::kNone && c.finish == FinishReason::kEos) {
        const ParsedToolCalls parsed = ParseToolCalls(meta_.tool_format, parts.content,
                                                      CallIds(meta_), meta_.parallel_tool_calls);
        if (!parsed.calls.empty()) {
          choice["message"] = {
              {"role", "assistant"},
              {"content", parsed.content.has_value() ? json(*parsed.content) : json(nullptr)},
              {"tool_calls", ToolCallsJson(parsed.calls, false)}};
          finish = "tool_calls";
        }
      }
      if (!parts.reasoning.empty()) choice["message"]["reasoning_content"] = parts.reasoning;
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
    choice["finish_reason"] = finish != nullptr ? json(finish) : json(nullptr);
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
    : meta_(std::move(meta)),
      text_offsets_(static_cast<size_t>(std::max(meta_.n, 1)), 0),
      held_(static_cast<size_t>(std::max(meta_.n, 1))) {
  if (meta_.endpoint == Endpoint::kChat && meta_.tool_format != ToolFormat::kNone) {
    for (Held& h : held_) h.holding = true;
  }
  if (meta_.endpoint == Endpoint::kChat && meta_.reasoning) {
    splitters_.assign(held_.size(), ReasoningSplitter(meta_.thinking_open));
    split_logprobs_.resize(held_.size());
  }
}

std::string StreamBuilder::DeltaChunk(int index, nlohmann::json delta,
                                      const std::vector<TokenLogprob>& lps) {
  json choice = {
      {"index", index},
      {"delta", std::move(delta)},
      {"logprobs", meta_.logprobs ? json{{"content", ChatLogprobEntries(lps)}} : json(nullptr)},
      {"finish_reason", nullptr}};
  return SseEvent(Dump(Chunk(json::array({std::move(choice)}))));
}

std::string StreamBuilder::SplitChunks(int index, const ReasoningParts& parts,
                                       const std::vector<TokenLogprob>& lps) {
  // An event's logprobs go out with its answer text, else with its
  // reasoning, else wait for the next text to go out.
  std::vector<TokenLogprob>& waiting = split_logprobs_[index];
  waiting.insert(waiting.end(), lps.begin(), lps.end());
  std::string out;
  if (!parts.reasoning.empty()) {
    out += DeltaChunk(index, {{"reasoning_content", parts.reasoning}},
                      parts.content.empty() ? waiting : std::vector<TokenLogprob>{});
    if (parts.content.empty()) waiting.clear();
  }
  if (!parts.content.empty()) {
    out += ContentChunks(index, parts.content, waiting);
    waiting.clear();
  }
  return out;
}

std::string StreamBuilder::ContentChunks(int index, const std::string& text,
                                         const std::vector<TokenLogprob>& lps) {
  Held& h = held_[index];
  if (h.holding) {
    h.text += text;
    h.logprobs.insert(h.logprobs.end(), lps.begin(), lps.end());
    const size_t from = ToolCallHoldFrom(meta_.tool_format, h.text);
    if (from == 0) return std::string();
    if (from < h.text.size()) {
      // Text before a call that may follow it (Hermes): the text goes
      // out, its logprobs with what is held, so that none is sent twice.
      std::string out = ChoiceChunk(index, h.text.substr(0, from), {}, false, 0);
      h.text.erase(0, from);
      return out;
    }
    std::string out = ChoiceChunk(index, h.text, h.logprobs, false, 0);
    // Only Hermes calls may follow text; the others are the whole output.
    h = Held{.holding = meta_.tool_format == ToolFormat::kHermes, .text = {}, .logprobs = {}};
    return out;
  }
  if (text.empty() && lps.empty()) return std::string();
  return ChoiceChunk(index, text, lps, false, 0);
}

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
    case GenerateEvent::Kind::kTokens: {
      RETURN_IF_ERROR(CheckIndex(e, meta_.n));
      if (!splitters_.empty()) {
        return SplitChunks(e.index, splitters_[e.index].Feed(e.text), e.logprobs);
      }
      return ContentChunks(e.index, e.text, e.logprobs);
    }
    case GenerateEvent::Kind::kFinished: {
      RETURN_IF_ERROR(CheckIndex(e, meta_.n));
      std::string out;
      if (!splitters_.empty()) {
        out += SplitChunks(e.index, splitters_[e.index].Finish(), {});
        // Logprobs of held white space: with what the choice still holds.
        std::vector<TokenLogprob>& waiting = split_logprobs_[e.index];
        if (!waiting.empty()) out += ContentChunks(e.index, "", waiting);
        waiting.clear();
      }
      const char* finish = OpenAiFinishReason(e.finish_reason);
      if (Held& h = held_[e.index]; h.holding) {
        h.holding = false;
        ParsedToolCalls parsed;
        if (e.finish_reason == FinishReason::kEos) {
          parsed =
              ParseToolCalls(meta_.tool_format, h.text, CallIds(meta_), meta_.parallel_tool_calls);
        }
        if (!parsed.calls.empty()) {
          // The held tokens' logprobs go with the text before the calls, or
          // with the calls.
          if (parsed.content.has_value()) {
            out += ChoiceChunk(e.index, *parsed.content, h.logprobs, false, 0);
            h.logprobs.clear();
          }
          out +=
              DeltaChunk(e.index, {{"tool_calls", ToolCallsJson(parsed.calls, true)}}, h.logprobs);
          finish = "tool_calls";
        } else if (!h.text.empty() || !h.logprobs.empty()) {
          out += ChoiceChunk(e.index, h.text, h.logprobs, false, 0);
        }
        h = Held{};
      }
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
      choice["finish_reason"] = finish;
      return out + SseEvent(Dump(Chunk(json::array({std::move(choice)}))));
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
