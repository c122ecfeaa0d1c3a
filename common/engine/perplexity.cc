#include "common/engine/perplexity.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/engine/logprobs.h"

namespace tandem {

absl::StatusOr<PerplexityResult> Perplexity(Engine& engine, std::span<const int32_t> tokens,
                                            const PerplexityOptions& options,
                                            const PerplexityProgress& progress) {
  const StepLimits limits = engine.step_limits();
  const int ctx = options.ctx;
  if (ctx < 4 || ctx > limits.seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("a chunk of ", ctx,
                                                   " tokens cannot be scored: give a ctx from 4 "
                                                   "to the model's context, ",
                                                   limits.seq_len));
  }
  if (options.max_chunks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_chunks is ", options.max_chunks, "; give 0 (all) or more"));
  }
  if (tokens.size() < 2 * static_cast<size_t>(ctx)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the text gives ", tokens.size(), " tokens; perplexity over chunks of ", ctx,
                     " needs at least ", 2 * ctx, ": give a longer text or a smaller ctx"));
  }
  if (limits.max_batch_tokens < 1 || limits.max_logit_rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the engine takes ", limits.max_batch_tokens, " tokens and ", limits.max_logit_rows,
        " logit rows a step; perplexity needs at least one of each"));
  }
  int chunks = static_cast<int>(tokens.size() / ctx);
  if (options.max_chunks > 0) chunks = std::min(chunks, options.max_chunks);

  // The context half goes in steps of max_batch_tokens without logits, the
  // scored half in steps with a row per token, so that no step holds more
  // than the engine's limits whatever ctx is.
  const int first = ctx / 2;
  const int context_step = limits.max_batch_tokens;
  const int scored_step = std::min(limits.max_batch_tokens, limits.max_logit_rows);
  const int vocab = limits.vocab_size;
  PerplexityResult result;
  double nll = 0.0;
  std::vector<int32_t> chunk(ctx);
  for (int c = 0; c < chunks; ++c) {
    std::copy_n(tokens.begin() + static_cast<size_t>(c) * ctx, ctx, chunk.begin());
    if (options.bos_id >= 0) chunk[0] = options.bos_id;
    const std::span<const int32_t> view(chunk);
    BlockTable table = engine.NewSequence();
    absl::Cleanup release = [&] { engine.Release(table); };
    for (int at = 0; at < first; at += context_step) {
      const BatchItem item{&table, view.subspan(at, std::min(context_step, first - at)), false};
      RETURN_IF_ERROR(engine.Step({&item, 1}).status());
    }
    // The chunk's last token predicts nothing scored: it is not run.
    for (int at = first; at < ctx - 1; at += scored_step) {
      const int n = std::min(scored_step, ctx - 1 - at);
      BatchItem item{&table, view.subspan(at, n), false};
      item.all_logits = true;
      ASSIGN_OR_RETURN(const std::vector<float> logits, engine.Step({&item, 1}));
      // Row r holds the logits after token at + r, scored against the next.
      for (int r = 0; r < n; ++r) {
        const std::span<const float> row(logits.data() + static_cast<size_t>(r) * vocab, vocab);
        nll -= ComputeLogprob(row, chunk[at + r + 1], /*top=*/0).logprob;
      }
    }
    result.scored += ctx - first - 1;
    result.chunks = c + 1;
    if (progress) progress(c, std::exp(nll / static_cast<double>(result.scored)));
  }
  result.mean_nll = nll / static_cast<double>(result.scored);
  result.perplexity = std::exp(result.mean_nll);
  return result;
}

}  // namespace tandem
