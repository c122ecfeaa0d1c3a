// The renderer of evaluator.h as a class (internal to common/chat):
// statements are run in evaluator.cc, expressions evaluated in
// expression_evaluator.cc.
#ifndef TANDEM_COMMON_CHAT_INTERNAL_EVALUATOR_INTERNAL_H_
#define TANDEM_COMMON_CHAT_INTERNAL_EVALUATOR_INTERNAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/chat/internal/ast.h"
#include "common/chat/internal/operators.h"
#include "common/chat/internal/value.h"
#include "common/chat/jinja.h"

namespace tandem::jinja::internal {

// Adds the line to an error the first time it passes a node.
absl::Status Locate(const absl::Status& s, int line);

#define RETURN_LOCATED(expr, line)                                   \
  do {                                                               \
    ::absl::Status tandem_jinja_s_ = (expr);                         \
    if (!tandem_jinja_s_.ok()) return Locate(tandem_jinja_s_, line); \
  } while (false)

struct Scope {
  explicit Scope(std::shared_ptr<Scope> p) : parent(std::move(p)) {}
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;

  void Set(const std::string& name, Value v) {
    for (auto& [k, old] : vars) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    vars.emplace_back(name, std::move(v));
  }
};
using ScopePtr = std::shared_ptr<Scope>;

enum class Flow { kNormal, kBreak, kContinue };

// Nested statement and expression evaluations, all macro calls included:
// bounds the stack a render uses (a few hundred bytes a level).
constexpr int kMaxEvalDepth = 2000;

// Counts one level of evaluation recursion for the scope of a call.
class DepthGuard {
 public:
  explicit DepthGuard(int* depth) : depth_(depth) { ++*depth_; }
  ~DepthGuard() { --*depth_; }
  bool exceeded() const { return *depth_ > kMaxEvalDepth; }

 private:
  int* depth_;
};

// Renders a parsed template (RenderTemplate makes one per render).
// Thread-compatible: an evaluator and the DepthGuards it makes belong to
// one render, on one thread; the parsed template it reads is immutable.
class Evaluator {
 public:
  Evaluator(const Json& context, const RenderOptions& options);
  ~Evaluator();
  absl::StatusOr<std::string> Run(const Body& body);

 private:
  absl::Status Step(int line);
  absl::Status Append(absl::string_view s, std::string* out, int line);
  Value Lookup(const std::string& name, const ScopePtr& scope);

  // ---- statements (evaluator.cc) ----

  absl::StatusOr<Flow> Exec(const Body& body, const ScopePtr& scope, std::string* out);
  absl::Status TooDeep(int line);
  absl::StatusOr<Flow> ExecNode(const Node& n, const ScopePtr& scope, std::string* out);
  absl::Status Assign(const Expr& target, const Value& v, const ScopePtr& scope);
  absl::StatusOr<Flow> ExecFor(const Node& n, const ScopePtr& scope, std::string* out);

  // A macro (or the caller of a call block): renders its body in a scope
  // whose parent is the defining scope (held weakly: a macro stored in that
  // scope must not keep it alive).
  Value MakeMacro(const std::string& name, const Node& n, const ScopePtr& scope);

  // ---- expressions (expression_evaluator.cc) ----

  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first, const ScopePtr& scope);
  absl::StatusOr<Value> EvalCall(const Expr& e, const ScopePtr& scope, const Value* caller);

  // A filter chain whose innermost input is null (filter blocks, set blocks).
  absl::StatusOr<Value> EvalFilterChain(const Expr& e, const Value& input, const ScopePtr& scope);
  absl::StatusOr<Value> MakeList(const Expr& e, const ScopePtr& scope);
  absl::StatusOr<Value> Eval(const Expr& e, const ScopePtr& scope);
  absl::StatusOr<Value> EvalCompare(const Expr& e, const ScopePtr& scope);

  const Value context_;
  const RenderOptions& options_;
  Limits limits_;
  std::vector<std::pair<std::string, Value>> globals_;
  std::vector<std::shared_ptr<NamespaceData>> namespaces_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  int loop_depth_ = 0;
  int eval_depth_ = 0;
};

}  // namespace tandem::jinja::internal

#endif  // TANDEM_COMMON_CHAT_INTERNAL_EVALUATOR_INTERNAL_H_
