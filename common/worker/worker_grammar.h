// Structured outputs on a worker: the grammar cache over the tokenizer the
// worker loads for it, and the step that turns a request's
// OutputConstraint into the compiled grammar its samplers follow, compiled
// off the gRPC reaction that received the request.
#ifndef TANDEM_COMMON_WORKER_WORKER_GRAMMAR_H_
#define TANDEM_COMMON_WORKER_WORKER_GRAMMAR_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/executor.h"
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

// Compiles each constrained request's grammar on an executor of its own:
// a large schema takes milliseconds to seconds to compile, which must not
// hold the gRPC thread that received the request (nor the engine's loop).
// Thread-safe; `grammars` and `compiles` must outlive it, and `compiles`
// must run (or have run) every task posted before what Resolve's callbacks
// use goes away.
class ConstraintResolver {
 public:
  using Done = std::function<void(absl::StatusOr<std::shared_ptr<grammar::CompiledGrammar>>)>;

  // `grammars` may be null: every constrained request is then refused
  // (FAILED_PRECONDITION, saying how to give the worker a tokenizer).
  ConstraintResolver(grammar::GrammarCache* grammars, Executor* compiles)
      : grammars_(grammars), compiles_(compiles) {}

  // Calls `done` once with the grammar of proto.constraint: null for a
  // request without one, and any refusal, on this thread before Resolve
  // returns; a grammar to compile (or the compiler's INVALID_ARGUMENT for
  // a schema it cannot enforce) on the executor's thread.
  void Resolve(const v1::SamplingParams& proto, Done done) const;

  // A resolver without grammars, which refuses every constraint.
  static const ConstraintResolver& None();

 private:
  grammar::GrammarCache* const grammars_;
  Executor* const compiles_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_WORKER_WORKER_GRAMMAR_H_
