// The OpenAI-compatible JSON of /v1/completions and /v1/chat/completions:
// parsing a request into a tandem.v1.GenerateRequest and building
// responses, stream chunks and errors. Pure functions: no network, no clock (callers pass
// `created`).
#ifndef TANDEM_ROUTER_OPENAI_JSON_H_
#define TANDEM_ROUTER_OPENAI_JSON_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tandem/v1/generate.pb.h"

namespace tandem::router::openai {

// OpenAI's default for max_tokens of /v1/completions.
inline constexpr int kDefaultMaxTokens = 16;
// max_tokens of /v1/chat/completions when the request sets none (OpenAI's
// is "up to the context"; generation still ends at the context's end).
inline constexpr int kDefaultChatMaxTokens = 1024;

struct CompletionRequest {
  v1::GenerateRequest request;
  // The `model` field as sent ("" when absent).
  std::string model;
  bool stream = false;
  // From /v1/chat/completions: the prompt is request.messages.
  bool chat = false;
};

// INVALID_ARGUMENT naming the field for: a body that is not a JSON object,
// a missing prompt, a field of the wrong type (prompt: a string, an array
// of token ids, or an array holding one of those; max_tokens, top_k, seed:
// integers; temperature, top_p: numbers; stop: a string or an array of
// strings; stream: a bool), an out-of-range integer, and the features not
// served (n or best_of other than 1, echo, logprobs, suffix). Value ranges
// (max_tokens >= 1, temperature >= 0, ...) are left to the router's own
// validation, whose messages name the same fields. Defaults as OpenAI's:
// max_tokens 16, temperature 1; top_k -1 means no limit (as 0).
absl::StatusOr<CompletionRequest> ParseCompletionRequest(std::string_view body);

// /v1/chat/completions: `messages` (required; each {"role": string,
// "content": a string or an array of {"type": "text", "text"} parts, which
// are concatenated; absent or null = ""}) into request.messages, whose
// roles and rendering the router checks; the other fields as
// ParseCompletionRequest, with max_completion_tokens as the newer name of
// max_tokens (default kDefaultChatMaxTokens) and logprobs a bool. Refused
// as well (INVALID_ARGUMENT naming them): content parts of any other type,
// tool_calls in a message, tools, functions, top_logprobs and a
// response_format other than text.
absl::StatusOr<CompletionRequest> ParseChatCompletionRequest(std::string_view body);

// "stop" for EOS and stop strings, "length" for LENGTH and CONTEXT.
std::string FinishReasonName(v1::FinishReason reason);

// What every response object of one request repeats.
struct CompletionMeta {
  std::string id;
  int64_t created = 0;  // Unix seconds.
  std::string model;
  // Chat objects (chat.completion, chat.completion.chunk with `delta`)
  // rather than text_completion ones.
  bool chat = false;
};

// The whole non-streaming response (for chat, choices[0].message is
// {"role": "assistant", "content": text}).
nlohmann::json CompletionResponse(const CompletionMeta& meta, const std::string& text,
                                  const v1::Finished& finished);
// The first chunk of a chat stream: delta {"role": "assistant"}.
nlohmann::json RoleChunk(const CompletionMeta& meta);
// A stream chunk carrying `text` (finish_reason null; for chat, delta
// {"content": text}).
nlohmann::json CompletionChunk(const CompletionMeta& meta, const std::string& text);
// The last stream chunk: empty text (an empty delta for chat), the finish
// reason and usage.
nlohmann::json FinalChunk(const CompletionMeta& meta, const v1::Finished& finished);
// usage: {prompt_tokens, completion_tokens, total_tokens}.
nlohmann::json UsageJson(const v1::Usage& usage);

// One SSE event: "data: <payload>\n\n".
std::string SseEvent(std::string_view payload);

struct HttpError {
  int http_status = 500;
  nlohmann::json body;  // {"error": {"message", "type", "code"}}
};
// 400 INVALID_ARGUMENT (and FAILED_PRECONDITION, OUT_OF_RANGE), 404
// NOT_FOUND, 429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 504
// DEADLINE_EXCEEDED, 499 CANCELLED, 500 otherwise. `code` is the status
// code's name in lower case ("resource_exhausted").
HttpError ErrorFor(const absl::Status& status);

}  // namespace tandem::router::openai

#endif  // TANDEM_ROUTER_OPENAI_JSON_H_
