// Checking and tokenizing a client's request before any worker is
// involved. Pure functions: no network, no clock.
#ifndef TANDEM_ROUTER_REQUEST_VALIDATION_H_
#define TANDEM_ROUTER_REQUEST_VALIDATION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "router/request_core.h"
#include "tandem/v1/generate.pb.h"

namespace tandem::router {

struct ValidRequest {
  std::vector<int32_t> prompt;
  // The prompt's text when the client sent text (echoed as sent).
  std::optional<std::string> prompt_text;
  // Sampling as the workers get it, the seed always set.
  v1::SamplingParams sampling;
  // Unset until ResolveMaxTokens: then the completion tokens per choice.
  std::optional<int> max_tokens;
  std::vector<std::string> stop;
  // The tokenizer's end-of-sequence ids; empty with ignore_eos (or without
  // a tokenizer).
  std::vector<int32_t> stop_token_ids;
  int n = 1;
  std::optional<int> logprobs;
  bool echo = false;
};

// What the validation needs to know about the router.
struct ValidationContext {
  const Tokenizer* tokenizer = nullptr;         // null: token-id prompts only
  const ChatTemplate* chat_template = nullptr;  // null: no chat prompts
  std::string served_model_name;
  // Used when the request sets no seed.
  uint64_t fresh_seed = 0;
};

// INVALID_ARGUMENT, saying what to change, for: no prompt or more than one,
// text without a tokenizer, messages without a chat template, an empty
// token-id prompt without a tokenizer (whose BOS would start it), a prompt
// above kMaxPromptBytes / kMaxPromptTokenIds, max_tokens < 1, n outside
// [1, kMaxChoices], logprobs outside [0, kMaxTopLogprobs], temperature < 0
// or not finite, top_k < 0, top_p outside (0, 1], penalties outside [-2, 2],
// repetition_penalty <= 0, logit_bias above kMaxLogitBias entries or values
// outside [-100, 100] or negative ids, min_tokens < 0 or above max_tokens,
// more than kMaxStopStrings stop strings or one empty or longer than
// kMaxStopBytes, stop strings or echo without a tokenizer, a timeout < 0,
// and what ChatPromptIds refuses. NOT_FOUND for a model other than the
// served one. An empty text or token-id prompt becomes BOS alone; text gets
// BOS first; token ids are used as given; messages become token ids through
// ChatPromptIds.
absl::StatusOr<ValidRequest> ValidateRequest(const GenerateParams& params,
                                             const ValidationContext& context);

// The prompt of a chat: `messages` rendered by `chat_template` (with the
// generation prompt when `add_generation_prompt`), encoded with the special
// tokens recognized and no BOS added (the template writes its own). Only
// the plain default template without a bos_token (a router given a bare
// tokenizer file) leaves BOS to the tokenizer, which then adds it as for
// text prompts. INVALID_ARGUMENT for no messages, more than
// kMaxChatMessages or kMaxChatBytes, a role other than system, user,
// assistant or tool, a conversation the template rejects (with the
// template's message), and an empty rendered prompt.
// `tools`, when not empty, reach the template as `tools` (OpenAI's
// [{"type": "function", "function": {...}}] form); `template_kwargs` (a
// JSON object's text, "" = none) as variables, checked by
// ChatTemplateKwargs.
absl::StatusOr<std::vector<int32_t>> ChatPromptIds(const std::vector<ChatTurn>& messages,
                                                   const Tokenizer& tokenizer,
                                                   const ChatTemplate& chat_template,
                                                   bool add_generation_prompt = true,
                                                   const std::vector<ToolFunction>& tools = {},
                                                   const std::string& template_kwargs = "");

// chat_template_kwargs as the render's extra variables: INVALID_ARGUMENT,
// naming the key, for one that is not a name, one the render sets itself
// (messages, tools, add_generation_prompt, the special tokens, ...), and
// one the template never reads (it would be ignored).
absl::StatusOr<jinja::Json> ChatTemplateKwargs(const std::string& text,
                                               const ChatTemplate& chat_template);

// Whether the generation prompt `chat_template` writes for one user message
// with `template_kwargs` leaves a thinking block open (reasoning.h); false
// when the template does not render it.
bool GenerationPromptOpensThinking(const ChatTemplate& chat_template,
                                   const std::string& template_kwargs);

// The text of `ids`, decoded incrementally (whole UTF-8 characters), with a
// leading BOS left out when `skip_leading_bos` (it is not text).
// INVALID_ARGUMENT for an id outside the vocabulary.
absl::StatusOr<std::string> DetokenizeIds(const Tokenizer& tokenizer,
                                          const std::vector<int32_t>& ids,
                                          bool skip_leading_bos = false);

// Checks the request against the model: INVALID_ARGUMENT when a prompt
// token or a logit_bias id is outside [0, vocab_size), when the prompt
// leaves no room for a generated token in `max_context`, or when the prompt
// plus max_tokens exceeds it (with the numbers, as vLLM says it). An unset
// max_tokens becomes what the context leaves. Limits <= 0 are unknown and
// not checked (an unset max_tokens then becomes `fallback_max_tokens`).
// INVALID_ARGUMENT when the request (after ResolveMaxTokens) could never be
// held by a decode worker whose pool has `kv_blocks` blocks of
// `block_size` tokens, even alone: each of its n choices holds its prompt
// and max_tokens (up to `max_context`, when known) at once. It is not a
// matter of load, so it is no 429: the message says what to lower. Unknown
// sizes (<= 0) are not checked.
absl::Status CheckFitsKvPool(const ValidRequest& request, int block_size, int kv_blocks,
                             int max_context);

absl::Status ResolveMaxTokens(ValidRequest& request, int vocab_size, int max_context,
                              int fallback_max_tokens);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_REQUEST_VALIDATION_H_
