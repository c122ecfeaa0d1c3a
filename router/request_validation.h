// Checking and tokenizing a client's GenerateRequest before any worker is
// involved. Pure functions: no network, no clock.
#ifndef TANDEM_ROUTER_REQUEST_VALIDATION_H_
#define TANDEM_ROUTER_REQUEST_VALIDATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/tokenizer.h"
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
// text or token ids, text without a tokenizer, max_tokens < 1, temperature
// < 0 (or not finite), top_k < 0, top_p outside (0, 1], an empty stop
// string, timeout_ms < 0. Text is tokenized with BOS first; token ids are
// used as given. `tokenizer` may be null (token-id prompts only).
absl::StatusOr<ValidRequest> ValidateRequest(const v1::GenerateRequest& request,
                                             const Tokenizer* tokenizer);

// INVALID_ARGUMENT when a prompt token is outside [0, vocab_size) or the
// prompt does not leave room for one generated token in `max_context`.
// Limits <= 0 are unknown and not checked.
absl::Status CheckModelLimits(const std::vector<int32_t>& prompt, int vocab_size, int max_context);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_REQUEST_VALIDATION_H_
