// Perplexity of a model over a token stream, scored as llama.cpp's
// llama-perplexity scores it by default, so that the two tools' figures
// can be set side by side on the same file and text:
//
// - the tokens are cut into consecutive chunks of `ctx` tokens (a shorter
//   tail is dropped), each evaluated from an empty cache;
// - a chunk's first token is replaced by BOS when `bos_id` is set;
// - only the second half of a chunk is scored: the logits at positions
//   ctx/2 .. ctx-2 against the tokens that follow them, so every scored
//   token has at least ctx/2 tokens of context;
// - perplexity = exp(mean negative log-likelihood over every scored token).
#ifndef TANDEM_COMMON_ENGINE_PERPLEXITY_H_
#define TANDEM_COMMON_ENGINE_PERPLEXITY_H_

#include <cstdint>
#include <functional>
#include <span>

#include "absl/status/statusor.h"
#include "common/engine/engine.h"

namespace tandem {

struct PerplexityOptions {
  int ctx = 512;        // tokens per chunk, at least 4 and at most the model's context
  int max_chunks = 0;   // 0 = every whole chunk
  int32_t bos_id = -1;  // put in each chunk's first position; -1 leaves the token
};

struct PerplexityResult {
  double perplexity = 0.0;
  double mean_nll = 0.0;  // natural log
  int64_t scored = 0;     // tokens scored: chunks * (ctx - ctx/2 - 1)
  int chunks = 0;
};

// Each chunk as it ends: its index and the perplexity over the chunks so far.
using PerplexityProgress = std::function<void(int chunk, double running)>;

// Runs `tokens` through `engine`, each chunk in as few steps as the engine's
// step limits allow (the scored half with a logit row per token), and frees
// every block it takes. INVALID_ARGUMENT saying what to change for a ctx
// out of range or fewer than 2 * ctx tokens (llama-perplexity's floor); an
// engine error as the engine returns it.
absl::StatusOr<PerplexityResult> Perplexity(Engine& engine, std::span<const int32_t> tokens,
                                            const PerplexityOptions& options,
                                            const PerplexityProgress& progress = nullptr);

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_PERPLEXITY_H_
