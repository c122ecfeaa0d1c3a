// The OpenAI API's JSON, mapped to and from the router's plain request
// types (request_core.h): request bodies of /v1/completions,
// /v1/chat/completions, /tokenize and /detokenize into GenerateParams and
// friends, and GenerateEvents into whole responses or SSE chunks. Pure:
// no network, no clock (callers pass `created`).
//
// Every field a body may carry is listed: any other is refused with
// INVALID_ARGUMENT naming it, as are the listed ones tandem cannot honour
// (suffix, tools, best_of other than n, ...). Token strings may be invalid
// UTF-8 (a token can be part of a character): Dump() replaces what is not
// valid, and chat logprobs carry each token's `bytes` as OpenAI's do.
#ifndef TANDEM_ROUTER_OPENAI_API_H_
#define TANDEM_ROUTER_OPENAI_API_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "router/reasoning.h"
#include "router/request_core.h"

namespace tandem::router::openai_api {

// OpenAI's default max_tokens of /v1/completions (chat's is "up to the
// context": unset).
inline constexpr int kDefaultCompletionMaxTokens = 16;

enum class Endpoint { kCompletions, kChat };

struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  GenerateParams params;
  bool stream = false;
  // stream_options.include_usage: a last chunk with `choices: []` and usage.
  bool include_usage = false;
};

// /v1/completions: prompt (a string, an array of token ids, or a
// one-element array of either), echo, logprobs (an integer: alternatives
// per token), suffix (only "" or null), best_of (only equal to n).
absl::StatusOr<ApiRequest> ParseCompletionRequest(absl::string_view body);
// /v1/chat/completions: messages ({role, content} with content a string,
// an array of text parts, or null), max_completion_tokens, logprobs (a
// bool) with top_logprobs, and tools/functions/response_format only when
// they ask for nothing.
absl::StatusOr<ApiRequest> ParseChatRequest(absl::string_view body);

// vLLM's /tokenize: {"prompt", "add_special_tokens" (default true)} or
// {"messages", "add_generation_prompt" (default true)}; "model" optional.
struct TokenizeRequest {
  std::string model;
  std::optional<std::string> prompt;
  std::optional<std::vector<ChatTurn>> messages;
  bool add_special_tokens = true;
  bool add_generation_prompt = true;
};
absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(absl::string_view body);
// vLLM's /detokenize: {"tokens": [ids], "model"}.
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(absl::string_view body);

// "stop" for EOS and stop strings, "length" for max_tokens and the context.
const char* OpenAiFinishReason(FinishReason reason);

// What every object of one response repeats, and how it is shaped.
struct ResponseMeta {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;
  int64_t created = 0;  // Unix seconds
  std::string model;
  int n = 1;
  bool logprobs = false;  // per-token logprobs asked for
  bool include_usage = false;
  // The text of a token id (the prompt's first token has no logprob entry
  // of its own in an echo, so its text comes from here); null = "".
  std::function<std::string(int32_t)> token_text = nullptr;
  // Chat with tools (tool_choice not "none"): outputs in this format are
  // answered as tool_calls (finish_reason "tool_calls"); a stream holds
  // text back while it may still be a call. kNone: text only.
  ToolFormat tool_format = ToolFormat::kNone;
  // A new call's id (null: "call_" and a counter).
  std::function<std::string()> tool_call_id = nullptr;
  // parallel_tool_calls: false keeps only an output's first call.
  bool parallel_tool_calls = true;
  // Chat whose template writes thinking blocks: an output's <think> block
  // is answered as `reasoning_content` (reasoning.h), the rest as content
  // (and tool calls); `thinking_open` when the prompt opened the block.
  bool reasoning = false;
  bool thinking_open = false;
};

// Collects a request's events into the non-streaming response. This and
// StreamBuilder are thread-compatible: one per response, fed in the order
// of the request's sink calls.
class ResponseBuilder {
 public:
  explicit ResponseBuilder(ResponseMeta meta);
  // INTERNAL for a choice index outside [0, n).
  absl::Status Add(const GenerateEvent& event);
  nlohmann::json Build() const;

 private:
  struct Choice {
    std::string text;
    nlohmann::json logprobs;  // the choice's logprobs object, once any
    size_t text_offset = 0;   // completions' text_offset of the next token
    std::optional<FinishReason> finish;
  };
  void AppendLogprobs(Choice& c, const std::vector<TokenLogprob>& lps, bool echo_first,
                      int32_t first_id);

  const ResponseMeta meta_;
  std::vector<Choice> choices_;
  int prompt_tokens_ = 0;
  int cached_tokens_ = 0;
  int completion_tokens_ = 0;
};

// Turns a request's events into SSE text ("data: {...}\n\n" events).
class StreamBuilder {
 public:
  explicit StreamBuilder(ResponseMeta meta);
  // What goes before the first event: chat's role delta per choice.
  std::string Start();
  // The chunks of one event; INTERNAL for a choice index outside [0, n).
  absl::StatusOr<std::string> OnEvent(const GenerateEvent& event);
  // After a whole stream: the usage chunk (when asked) and [DONE].
  std::string Finish() const;
  // After a failure mid-stream: an error event and [DONE].
  static std::string Failure(const absl::Status& status);

 private:
  nlohmann::json Chunk(nlohmann::json choices) const;
  std::string ChoiceChunk(int index, const std::string& text, const std::vector<TokenLogprob>& lps,
                          bool echo, int32_t first_id);

  // Text a choice holds back while it may be a tool call, with its
  // logprobs; `holding` while calls may still come.
  struct Held {
    bool holding = false;
    std::string text;
    std::vector<TokenLogprob> logprobs;
  };
  // A choice's answer text: out at once, or held while it may be a call.
  std::string ContentChunks(int index, const std::string& text,
                            const std::vector<TokenLogprob>& lps);
  // A chat chunk of one choice with `delta` (reasoning_content,
  // tool_calls) and the logprobs of its tokens.
  std::string DeltaChunk(int index, nlohmann::json delta, const std::vector<TokenLogprob>& lps);
  // The reasoning and answer parts of one event's text (meta_.reasoning).
  std::string SplitChunks(int index, const ReasoningParts& parts,
                          const std::vector<TokenLogprob>& lps);

  const ResponseMeta meta_;
  std::vector<size_t> text_offsets_;
  std::vector<Held> held_;
  // Per choice with meta_.reasoning; the logprobs of text still held there.
  std::vector<ReasoningSplitter> splitters_;
  std::vector<std::vector<TokenLogprob>> split_logprobs_;
  int prompt_tokens_ = 0;
  int cached_tokens_ = 0;
  int completion_tokens_ = 0;
};

// usage: {prompt_tokens, completion_tokens, total_tokens}.
// OpenAI's usage object; prompt_tokens_details.cached_tokens counts the
// prompt tokens a prefix cache saved computing.
nlohmann::json UsageJson(int prompt_tokens, int cached_tokens, int completion_tokens);
// One SSE event: "data: <payload>\n\n".
std::string SseEvent(absl::string_view payload);
// Compact JSON with invalid UTF-8 replaced by U+FFFD.
std::string Dump(const nlohmann::json& j);

struct HttpError {
  int http_status = 500;
  nlohmann::json body;  // {"error": {"message", "type", "param", "code"}}
};
// 400 INVALID_ARGUMENT, FAILED_PRECONDITION and OUT_OF_RANGE; 401
// UNAUTHENTICATED; 403 PERMISSION_DENIED; 404 NOT_FOUND; 429
// RESOURCE_EXHAUSTED; 499 CANCELLED; 503 UNAVAILABLE; 504
// DEADLINE_EXCEEDED; 500 otherwise. `code` is the status code's name in
// lower case ("resource_exhausted").
HttpError ErrorFor(const absl::Status& status);

}  // namespace tandem::router::openai_api

#endif  // TANDEM_ROUTER_OPENAI_API_H_
