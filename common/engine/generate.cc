#include "common/engine/generate.h"

#include <algorithm>
#include <span>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {

absl::StatusOr<GenerateResult> Generate(Engine& engine, const GenerateRequest& request,
                                        const TokenSink& sink) {
  const ModelConfig& config = engine.config();
  if (request.prompt.empty()) {
    return absl::InvalidArgumentError("prompt is empty; start it with at least the BOS token");
  }
  if (static_cast<int64_t>(request.prompt.size()) >= config.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt has ", request.prompt.size(), " tokens; the model's context is ",
                     config.seq_len, ", so it must be shorter than that"));
  }
  if (request.max_new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens ", request.max_new_tokens, " must be at least 1"));
  }
  if (request.prefill_chunk < 0) {
    return absl::InvalidArgumentError("prefill_chunk must be >= 0 (0 = whole prompt)");
  }
  RETURN_IF_ERROR(request.sampling.ValidateForVocab(config.vocab_size));

  BlockTable table = engine.NewSequence();
  absl::Cleanup release = [&] { engine.Release(table); };
  Sampler sampler(request.sampling, request.prompt, request.eos_ids);
  GenerateResult result;
  const absl::Time start = absl::Now();

  // Prefill, in chunks when asked; only the last chunk needs logits.
  const std::span<const int32_t> prompt(request.prompt);
  const size_t chunk = request.prefill_chunk > 0 ? request.prefill_chunk : prompt.size();
  std::vector<float> logits;
  for (size_t at = 0; at < prompt.size(); at += chunk) {
    const size_t n = std::min(chunk, prompt.size() - at);
    const bool last = at + n == prompt.size();
    const BatchItem item{&table, prompt.subspan(at, n), last};
    ASSIGN_OR_RETURN(logits, engine.Step({&item, 1}));
  }
  int32_t token = sampler.Sample(logits);
  result.prefill = result.ttft = absl::Now() - start;

  const absl::Time decode_start = absl::Now();
  while (true) {
    if (std::find(request.eos_ids.begin(), request.eos_ids.end(), token) != request.eos_ids.end()) {
      result.finish = FinishReason::kEos;
      break;
    }
    result.tokens.push_back(token);
    sampler.Accept(token);
    if (sink && !sink(token)) {
      result.finish = FinishReason::kStop;
      break;
    }
    if (static_cast<int>(result.tokens.size()) >= request.max_new_tokens) {
      result.finish = FinishReason::kLength;
      break;
    }
    if (table.num_tokens() >= config.seq_len) {
      result.finish = FinishReason::kContext;
      break;
    }
    const BatchItem item{&table, {&token, 1}, true};
    ASSIGN_OR_RETURN(logits, engine.Step({&item, 1}));
    token = sampler.Sample(logits);
  }
  result.decode = absl::Now() - decode_start;
  return result;
}

}  // namespace tandem
