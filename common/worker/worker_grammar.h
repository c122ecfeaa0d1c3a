// Structured outputs on a worker: the grammar cache over the tokenizer the
// worker loads for it, and the step that turns a request's
// OutputConstraint into the compiled grammar its samplers follow.
#ifndef TANDEM_COMMON_WORKER_WORKER_GRAMMAR_H_
#define TANDEM_COMMON_WORKER_WORKER_GRAMMAR_H_

#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/engine/sampler.h"
#include "common/grammar/constraint.h"
#include "tandem/v1/generate.pb.h"

ABSL_DECLARE_FLAG(std::string, tokenizer);

namespace tandem {

// The grammar cache of a worker serving `model_path`: over the tokenizer of
// `tokenizer_path` when given, else of the model's folder when it holds one
// (tokenizer.json or tokenizer.model); null when there is none (such a
// worker refuses constrained requests, saying how to give it one). The
// tokenizer's load errors.
absl::StatusOr<std::unique_ptr<grammar::GrammarCache>> LoadWorkerGrammars(
    const std::string& model_path, const std::string& tokenizer_path);

// Sets params.grammar from proto.constraint (nothing when unset).
// FAILED_PRECONDITION when `grammars` is null; the compiler's
// INVALID_ARGUMENT for a schema it cannot enforce.
absl::Status ResolveConstraint(const v1::SamplingParams& proto, grammar::GrammarCache* grammars,
                               SamplingParams& params);

}  // namespace tandem

#endif  // TANDEM_COMMON_WORKER_WORKER_GRAMMAR_H_
