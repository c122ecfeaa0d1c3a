// Checking and tokenizing a client's GenerateRequest before any worker is
// involved. Pure functions: no network, no clock.
#ifndef TANDEM_ROUTER_REQUEST_VALIDATION_H_
#define TANDEM_ROUTER_REQUEST_VALIDATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/chat_template.h"
#include "common/model/tokenizer.h"
#include "router/request_core.h"
#include "tandem/v1/generate.pb.h"

namespace tandem::router {

struct ValidRequest {
  std::vector<int32_t> prompt;
  v1::SamplingParams sampling;
  int max_tokens = 0;
  std::vector<std::string> stop;
  // The tokenizer's EOS (empty without a tokenizer).
  std::vector<int32_t> stop_token_ids;
};

// INVALID_ARGUMENT, saying what to change, for: no prompt, empty prompt
// text or token ids, text or messages without a tokenizer, messages without
// a chat template, max_tokens < 1, temperature < 0 (or not finite), top_k <
// 0, top_p outside (0, 1], an empty stop string, timeout_ms < 0, and what
// ChatPromptIds refuses. Text is tokenized with BOS first; token ids are
// used as given; messages become token ids through ChatPromptIds.
// `tokenizer` may be null (token-id prompts only), `chat_template` too (no
// chat prompts).
absl::StatusOr<ValidRequest> ValidateRequest(const v1::GenerateRequest& request,
                                             const Tokenizer* tokenizer,
                                             const ChatTemplate* chat_template = nullptr);

// The prompt of a chat: `messages` rendered by `chat_template` with
// add_generation_prompt, encoded with the special tokens recognized and no
// BOS added (the template writes its own). Only the plain default template
// without a bos_token (a router given a bare tokenizer file) leaves BOS to
// the tokenizer, which then adds it as for text prompts. INVALID_ARGUMENT
// for no messages, more than kMaxChatMessages or kMaxChatBytes, a role
// other than system, user, assistant or tool, a conversation the template
// rejects (with the template's message), and an empty rendered prompt.
absl::StatusOr<std::vector<int32_t>> ChatPromptIds(const v1::ChatMessages& messages,
                                                   const Tokenizer& tokenizer,
                                                   const ChatTemplate& chat_template);

// INVALID_ARGUMENT when a prompt token is outside [0, vocab_size) or the
// prompt does not leave room for one generated token in `max_context`.
// Limits <= 0 are unknown and not checked.
absl::Status CheckModelLimits(const std::vector<int32_t>& prompt, int vocab_size, int max_context);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_REQUEST_VALIDATION_H_
