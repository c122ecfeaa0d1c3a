#include "common/worker/worker_grammar.h"

#include <filesystem>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/tokenizer.h"

ABSL_FLAG(std::string, tokenizer, "",
          "The model's tokenizer (a folder, tokenizer.json, tokenizer.model or a llama2.c "
          "tokenizer.bin), for structured outputs (response_format): the worker needs each "
          "token's bytes to mask what a JSON schema refuses. Default: the --model folder's own, "
          "when it has one; without either, constrained requests are refused");

namespace tandem {

absl::StatusOr<std::unique_ptr<grammar::GrammarCache>> LoadWorkerGrammars(
    const std::string& model_path, const std::string& tokenizer_path) {
  std::string path = tokenizer_path;
  if (path.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(model_path, ec)) return nullptr;
    for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
      if (std::filesystem::exists(std::filesystem::path(model_path) / name, ec)) path = model_path;
    }
    if (path.empty()) return nullptr;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer(path));
  ASSIGN_OR_RETURN(std::shared_ptr<const grammar::Vocabulary> vocabulary,
                   grammar::Vocabulary::FromTokenizer(*tokenizer));
  LOG(INFO) << "structured outputs: the token bytes of " << path << " (" << vocabulary->size()
            << " tokens)";
  return std::make_unique<grammar::GrammarCache>(std::move(vocabulary));
}

const ConstraintResolver& ConstraintResolver::None() {
  static const ConstraintResolver none(nullptr, nullptr);
  return none;
}

void ConstraintResolver::Resolve(const v1::SamplingParams& proto, Done done) const {
  grammar::ConstraintSpec spec;
  const v1::OutputConstraint& c = proto.constraint();
  switch (c.kind_case()) {
    case v1::OutputConstraint::kJsonObject:
      if (!c.json_object()) return done(nullptr);
      spec.kind = grammar::ConstraintSpec::Kind::kJsonObject;
      break;
    case v1::OutputConstraint::kJsonSchema:
      spec.kind = grammar::ConstraintSpec::Kind::kJsonSchema;
      spec.schema = c.json_schema();
      break;
    case v1::OutputConstraint::kRegex:
      spec.kind = grammar::ConstraintSpec::Kind::kRegex;
      spec.schema = c.regex();
      break;
    case v1::OutputConstraint::KIND_NOT_SET:
      return done(nullptr);
  }
  if (grammars_ == nullptr) {
    return done(absl::FailedPreconditionError(
        "this worker has no tokenizer, so it cannot constrain output (response_format): start "
        "it with --tokenizer (the model's tokenizer) or serve a model folder that has one"));
  }
  spec.prefix = c.prefix();
  spec.suffix = c.suffix();
  spec.forced_tokens.assign(c.forced_token_ids().begin(), c.forced_token_ids().end());
  // The spec is copied out of the proto here: the task may outlive the call.
  compiles_->Post([grammars = grammars_, spec = std::move(spec), done = std::move(done)] {
    done(grammars->Get(spec));
  });
}

}  // namespace tandem
