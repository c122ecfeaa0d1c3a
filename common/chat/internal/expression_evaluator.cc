// The renderer's expressions (Evaluator::Eval and the calls, filters,
// tests and comparisons it evaluates); statements are in evaluator.cc.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/chat/internal/builtins.h"
#include "common/chat/internal/evaluator_internal.h"
#include "common/chat/internal/operators.h"

namespace tandem::jinja::internal {

absl::StatusOr<CallArgs> Evaluator::EvalArgs(const Expr& e, size_t first, const ScopePtr& scope) {
  CallArgs args;
  for (size_t i = first; i < e.args.size(); ++i) {
    ASSIGN_OR_RETURN(Value v, Eval(*e.args[i], scope));
    args.positional.push_back(std::move(v));
  }
  for (const auto& [k, x] : e.kwargs) {
    ASSIGN_OR_RETURN(Value v, Eval(*x, scope));
    args.keyword.emplace_back(k, std::move(v));
  }
  return args;
}

absl::StatusOr<Value> Evaluator::EvalCall(const Expr& e, const ScopePtr& scope,
                                          const Value* caller) {
  ASSIGN_OR_RETURN(Value fn, Eval(*e.args[0], scope));
  if (fn.is_undefined()) return Locate(UndefinedError(fn), e.line);
  if (!fn.is_callable()) {
    return Locate(
        absl::InvalidArgumentError(absl::StrCat("'", TypeName(fn), "' object is not callable")),
        e.line);
  }
  ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1, scope));
  if (caller != nullptr) args.keyword.emplace_back("caller", *caller);
  absl::StatusOr<Value> r = fn.callable().fn(args);
  RETURN_LOCATED(r.status(), e.line);
  return r;
}

absl::StatusOr<Value> Evaluator::EvalFilterChain(const Expr& e, const Value& input,
                                                 const ScopePtr& scope) {
  Value in = input;
  if (e.args[0] != nullptr) {
    ASSIGN_OR_RETURN(in, EvalFilterChain(*e.args[0], input, scope));
  }
  ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1, scope));
  absl::StatusOr<Value> r = ApplyFilter(e.name, in, args, limits_);
  RETURN_LOCATED(r.status(), e.line);
  return r;
}

absl::StatusOr<Value> Evaluator::MakeList(const Expr& e, const ScopePtr& scope) {
  Json out = Json::array();
  for (const ExprPtr& item : e.args) {
    ASSIGN_OR_RETURN(Value v, Eval(*item, scope));
    if (v.is_namespace() || v.is_callable()) {
      return Locate(absl::InvalidArgumentError(
                        absl::StrCat("a list can hold only plain data here, not a ", TypeName(v))),
                    item->line);
    }
    out.push_back(ToJsonLoose(v));
  }
  return Value(std::move(out));
}

absl::StatusOr<Value> Evaluator::Eval(const Expr& e, const ScopePtr& scope) {
  DepthGuard guard(&eval_depth_);
  if (guard.exceeded()) return TooDeep(e.line);
  RETURN_IF_ERROR(Step(e.line));
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return Value(e.literal);
    case Expr::Kind::kName:
      return Lookup(e.name, scope);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple:
      return MakeList(e, scope);
    case Expr::Kind::kDict: {
      Json out = Json::object();
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        ASSIGN_OR_RETURN(Value k, Eval(*e.args[i], scope));
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1], scope));
        absl::StatusOr<std::string> key = ToStr(k);
        RETURN_LOCATED(key.status(), e.line);
        if (v.is_namespace() || v.is_callable()) {
          return Locate(absl::InvalidArgumentError("a dict can hold only plain data here"), e.line);
        }
        out[*key] = ToJsonLoose(v);
      }
      return Value(std::move(out));
    }
    case Expr::Kind::kGetAttr: {
      ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], scope));
      absl::StatusOr<Value> r = GetAttr(obj, e.name);
      RETURN_LOCATED(r.status(), e.line);
      return r;
    }
    case Expr::Kind::kGetItem: {
      ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], scope));
      ASSIGN_OR_RETURN(Value key, Eval(*e.args[1], scope));
      absl::StatusOr<Value> r = GetItem(obj, key);
      RETURN_LOCATED(r.status(), e.line);
      return r;
    }
    case Expr::Kind::kSlice: {
      ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], scope));
      Value parts[3];
      for (int i = 0; i < 3; ++i) {
        if (e.args[i + 1] != nullptr) {
          ASSIGN_OR_RETURN(parts[i], Eval(*e.args[i + 1], scope));
        }
      }
      absl::StatusOr<Value> r = GetSlice(obj, parts[0], parts[1], parts[2], limits_);
      RETURN_LOCATED(r.status(), e.line);
      return r;
    }
    case Expr::Kind::kCall:
      return EvalCall(e, scope, nullptr);
    case Expr::Kind::kFilter: {
      ASSIGN_OR_RETURN(Value in, Eval(*e.args[0], scope));
      ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1, scope));
      absl::StatusOr<Value> r = ApplyFilter(e.name, in, args, limits_);
      RETURN_LOCATED(r.status(), e.line);
      return r;
    }
    case Expr::Kind::kTest: {
      ASSIGN_OR_RETURN(Value in, Eval(*e.args[0], scope));
      ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1, scope));
      absl::StatusOr<bool> r = ApplyTest(e.name, in, args);
      RETURN_LOCATED(r.status(), e.line);
      return Value(Json(*r != e.negated));
    }
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[0], scope));
      absl::StatusOr<Value> r = Negate(v, e.kind == Expr::Kind::kNeg);
      RETURN_LOCATED(r.status(), e.line);
      return r;
    }
    case Expr::Kind::kNot: {
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[0], scope));
      return Value(Json(!Truthy(v)));
    }
    case Expr::Kind::kBinary: {
      ASSIGN_OR_RETURN(Value a, Eval(*e.args[0], scope));
      ASSIGN_OR_RETURN(Value b, Eval(*e.args[1], scope));
      absl::StatusOr<Value> r = BinaryOp(e.name, a, b, limits_);
      RETURN_LOCATED(r.status(), e.line);
      return r;
    }
    case Expr::Kind::kAnd:
    case Expr::Kind::kOr: {
      ASSIGN_OR_RETURN(Value a, Eval(*e.args[0], scope));
      if (Truthy(a) == (e.kind == Expr::Kind::kOr)) return a;
      return Eval(*e.args[1], scope);
    }
    case Expr::Kind::kCompare:
      return EvalCompare(e, scope);
    case Expr::Kind::kConcat: {
      std::string out;
      for (const ExprPtr& part : e.args) {
        ASSIGN_OR_RETURN(Value v, Eval(*part, scope));
        absl::StatusOr<std::string> s = ToStr(v);
        RETURN_LOCATED(s.status(), e.line);
        if (out.size() + s->size() > limits_.max_bytes) {
          return Locate(absl::ResourceExhaustedError("string too large"), e.line);
        }
        out += *s;
      }
      return Value(std::move(out));
    }
    case Expr::Kind::kCondExpr: {
      ASSIGN_OR_RETURN(Value c, Eval(*e.args[1], scope));
      if (Truthy(c)) return Eval(*e.args[0], scope);
      if (e.args[2] != nullptr) return Eval(*e.args[2], scope);
      return Value::Undefined(absl::StrCat("the inline if-expression on line ", e.line,
                                           " evaluated to false and no else section was "
                                           "defined."));
    }
  }
  return Value();
}

absl::StatusOr<Value> Evaluator::EvalCompare(const Expr& e, const ScopePtr& scope) {
  ASSIGN_OR_RETURN(Value left, Eval(*e.args[0], scope));
  for (size_t i = 0; i < e.ops.size(); ++i) {
    ASSIGN_OR_RETURN(Value right, Eval(*e.args[i + 1], scope));
    const std::string& op = e.ops[i];
    absl::StatusOr<bool> r;
    if (op == "==") {
      r = PythonEquals(left, right);
    } else if (op == "!=") {
      r = !PythonEquals(left, right);
    } else if (op == "in" || op == "notin") {
      r = Contains(right, left);
      if (r.ok() && op == "notin") r = !*r;
    } else {
      if (left.is_undefined() || right.is_undefined()) {
        return Locate(UndefinedError(left.is_undefined() ? left : right), e.line);
      }
      if (op == "<") {
        r = PythonLess(left, right);
      } else if (op == ">") {
        r = PythonLess(right, left);
      } else if (op == "<=") {
        r = PythonLess(right, left);
        if (r.ok()) r = !*r;
      } else {
        r = PythonLess(left, right);
        if (r.ok()) r = !*r;
      }
    }
    RETURN_LOCATED(r.status(), e.line);
    if (!*r) return Value(Json(false));
    left = std::move(right);
  }
  return Value(Json(true));
}

}  // namespace tandem::jinja::internal
