// The renderer (evaluator.h): the Evaluator's set-up, its scopes and
// statements (output, if, for, set, macros, call and filter blocks, with),
// and RenderTemplate. Expressions are evaluated in expression_evaluator.cc.
#include "common/chat/internal/evaluator.h"

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/chat/internal/builtins.h"
#include "common/chat/internal/evaluator_internal.h"
#include "common/chat/internal/operators.h"

namespace tandem::jinja {
namespace internal {
namespace {

constexpr absl::string_view kLocatedPayload = "tandem.jinja/located";

}  // namespace

absl::Status Locate(const absl::Status& s, int line) {
  if (s.ok() || s.GetPayload(kLocatedPayload).has_value()) return s;
  absl::Status out(s.code(), absl::StrCat("template error, line ", line, ": ", s.message()));
  out.SetPayload(kLocatedPayload, absl::Cord("1"));
  return out;
}

Evaluator::Evaluator(const Json& context, const RenderOptions& options)
    : context_(Value(context)), options_(options) {
  limits_.max_bytes = options.max_output_bytes;
  globals_.emplace_back("range", GlobalRange(limits_));
  globals_.emplace_back("namespace", GlobalNamespace(&namespaces_));
  globals_.emplace_back("dict", GlobalDict());
  // `fn = fn`: Clang 14 (the thread-safety check) cannot capture a
  // structured binding.
  for (const auto& [name, fn] : options.functions) {
    globals_.emplace_back(name,
                          Value::Function(name, [fn = fn](CallArgs& call) -> absl::StatusOr<Value> {
                            FunctionArgs args;
                            for (const Value& v : call.positional)
                              args.positional.push_back(ToJsonLoose(v));
                            for (const auto& [k, v] : call.keyword)
                              args.keyword.emplace_back(k, ToJsonLoose(v));
                            ASSIGN_OR_RETURN(Json r, fn(args));
                            return Value(std::move(r));
                          }));
  }
}

Evaluator::~Evaluator() {
  // Namespaces may reference each other (ns.a = ns): break the cycles.
  for (auto& ns : namespaces_) ns->attrs.clear();
}

absl::StatusOr<std::string> Evaluator::Run(const Body& body) {
  auto root = std::make_shared<Scope>(nullptr);
  std::string out;
  ASSIGN_OR_RETURN(Flow flow, Exec(body, root, &out));
  (void)flow;
  return out;
}

absl::Status Evaluator::Step(int line) {
  if (++steps_ > options_.max_steps) {
    return Locate(absl::ResourceExhaustedError(
                      absl::StrCat("template evaluation exceeded ", options_.max_steps, " steps")),
                  line);
  }
  return absl::OkStatus();
}

absl::Status Evaluator::Append(absl::string_view s, std::string* out, int line) {
  if (out->size() + s.size() > options_.max_output_bytes) {
    return Locate(absl::ResourceExhaustedError(absl::StrCat("output larger than the limit of ",
                                                            options_.max_output_bytes, " bytes")),
                  line);
  }
  out->append(s.data(), s.size());
  return absl::OkStatus();
}

Value Evaluator::Lookup(const std::string& name, const ScopePtr& scope) {
  for (Scope* s = scope.get(); s != nullptr; s = s->parent.get()) {
    for (const auto& [k, v] : s->vars) {
      if (k == name) return v;
    }
  }
  if (context_.is_dict()) {
    auto it = context_.json().find(name);
    if (it != context_.json().end()) return context_.Child(*it);
  }
  for (const auto& [k, v] : globals_) {
    if (k == name) return v;
  }
  return Value::Undefined(absl::StrCat("'", name, "' is undefined"));
}

absl::StatusOr<Flow> Evaluator::Exec(const Body& body, const ScopePtr& scope, std::string* out) {
  for (const NodePtr& n : body) {
    ASSIGN_OR_RETURN(Flow f, ExecNode(*n, scope, out));
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

absl::Status Evaluator::TooDeep(int line) {
  return Locate(absl::ResourceExhaustedError(absl::StrCat("template evaluation nested deeper than ",
                                                          kMaxEvalDepth, " levels")),
                line);
}

absl::StatusOr<Flow> Evaluator::ExecNode(const Node& n, const ScopePtr& scope, std::string* out) {
  DepthGuard guard(&eval_depth_);
  if (guard.exceeded()) return TooDeep(n.line);
  RETURN_IF_ERROR(Step(n.line));
  switch (n.kind) {
    case Node::Kind::kText:
      RETURN_IF_ERROR(Append(n.text, out, n.line));
      return Flow::kNormal;
    case Node::Kind::kOutput: {
      ASSIGN_OR_RETURN(Value v, Eval(*n.expr, scope));
      absl::StatusOr<std::string> s = ToStr(v);
      RETURN_LOCATED(s.status(), n.line);
      RETURN_IF_ERROR(Append(*s, out, n.line));
      return Flow::kNormal;
    }
    case Node::Kind::kIf:
      for (const auto& [cond, body] : n.branches) {
        ASSIGN_OR_RETURN(Value c, Eval(*cond, scope));
        if (Truthy(c)) return Exec(body, scope, out);
      }
      return Exec(n.else_body, scope, out);
    case Node::Kind::kFor:
      return ExecFor(n, scope, out);
    case Node::Kind::kSet: {
      ASSIGN_OR_RETURN(Value v, Eval(*n.expr, scope));
      RETURN_IF_ERROR(Assign(*n.target, v, scope));
      return Flow::kNormal;
    }
    case Node::Kind::kSetBlock: {
      std::string text;
      ASSIGN_OR_RETURN(Flow f, Exec(n.body, std::make_shared<Scope>(scope), &text));
      (void)f;
      Value v(std::move(text));
      if (n.expr != nullptr) {
        ASSIGN_OR_RETURN(v, EvalFilterChain(*n.expr, v, scope));
      }
      RETURN_IF_ERROR(Assign(*n.target, v, scope));
      return Flow::kNormal;
    }
    case Node::Kind::kMacro:
      scope->Set(n.name, MakeMacro(n.name, n, scope));
      return Flow::kNormal;
    case Node::Kind::kCallBlock: {
      Value caller = MakeMacro("caller", n, scope);
      ASSIGN_OR_RETURN(Value v, EvalCall(*n.expr, scope, &caller));
      absl::StatusOr<std::string> s = ToStr(v);
      RETURN_LOCATED(s.status(), n.line);
      RETURN_IF_ERROR(Append(*s, out, n.line));
      return Flow::kNormal;
    }
    case Node::Kind::kFilterBlock: {
      std::string text;
      ASSIGN_OR_RETURN(Flow f, Exec(n.body, std::make_shared<Scope>(scope), &text));
      (void)f;
      ASSIGN_OR_RETURN(Value v, EvalFilterChain(*n.expr, Value(std::move(text)), scope));
      absl::StatusOr<std::string> s = ToStr(v);
      RETURN_LOCATED(s.status(), n.line);
      RETURN_IF_ERROR(Append(*s, out, n.line));
      return Flow::kNormal;
    }
    case Node::Kind::kWith: {
      auto inner = std::make_shared<Scope>(scope);
      for (const auto& [target, value] : n.assignments) {
        ASSIGN_OR_RETURN(Value v, Eval(*value, scope));
        RETURN_IF_ERROR(Assign(*target, v, inner));
      }
      return Exec(n.body, inner, out);
    }
    case Node::Kind::kBreak:
      if (loop_depth_ == 0)
        return Locate(absl::InvalidArgumentError("'break' outside a loop"), n.line);
      return Flow::kBreak;
    case Node::Kind::kContinue:
      if (loop_depth_ == 0) {
        return Locate(absl::InvalidArgumentError("'continue' outside a loop"), n.line);
      }
      return Flow::kContinue;
  }
  return Flow::kNormal;
}

absl::Status Evaluator::Assign(const Expr& target, const Value& v, const ScopePtr& scope) {
  if (target.kind == Expr::Kind::kName) {
    scope->Set(target.name, v);
    return absl::OkStatus();
  }
  if (target.kind == Expr::Kind::kTuple) {
    absl::StatusOr<std::vector<Value>> items = Iterate(v);
    RETURN_LOCATED(items.status(), target.line);
    if (items->size() != target.args.size()) {
      return Locate(
          absl::InvalidArgumentError(absl::StrCat(
              items->size() > target.args.size() ? "too many" : "not enough",
              " values to unpack (expected ", target.args.size(), ", got ", items->size(), ")")),
          target.line);
    }
    for (size_t i = 0; i < items->size(); ++i) scope->Set(target.args[i]->name, (*items)[i]);
    return absl::OkStatus();
  }
  // ns.attr = v
  const Value ns = Lookup(target.args[0]->name, scope);
  if (!ns.is_namespace() || ns.ns()->is_loop) {
    return Locate(absl::InvalidArgumentError(absl::StrCat("cannot assign attribute '", target.name,
                                                          "' on non-namespace object '",
                                                          target.args[0]->name, "'")),
                  target.line);
  }
  if (Value* old = ns.ns()->Find(target.name)) {
    *old = v;
  } else {
    ns.ns()->attrs.emplace_back(target.name, v);
  }
  return absl::OkStatus();
}

absl::StatusOr<Flow> Evaluator::ExecFor(const Node& n, const ScopePtr& scope, std::string* out) {
  ASSIGN_OR_RETURN(Value iterable, Eval(*n.expr, scope));
  absl::StatusOr<std::vector<Value>> all = Iterate(iterable);
  RETURN_LOCATED(all.status(), n.line);
  std::vector<Value> items;
  if (n.cond != nullptr) {
    for (const Value& item : *all) {
      RETURN_IF_ERROR(Step(n.line));
      auto probe = std::make_shared<Scope>(scope);
      RETURN_IF_ERROR(Assign(*n.target, item, probe));
      ASSIGN_OR_RETURN(Value keep, Eval(*n.cond, probe));
      if (Truthy(keep)) items.push_back(item);
    }
  } else {
    items = std::move(*all);
  }
  if (items.empty()) return Exec(n.else_body, scope, out);
  const int64_t length = static_cast<int64_t>(items.size());
  ++loop_depth_;
  for (int64_t i = 0; i < length; ++i) {
    RETURN_IF_ERROR(Step(n.line));
    auto inner = std::make_shared<Scope>(scope);
    RETURN_IF_ERROR(Assign(*n.target, items[i], inner));
    auto loop = std::make_shared<NamespaceData>();
    loop->is_loop = true;
    loop->attrs = {
        {"index", Value(Json(i + 1))},
        {"index0", Value(Json(i))},
        {"revindex", Value(Json(length - i))},
        {"revindex0", Value(Json(length - i - 1))},
        {"first", Value(Json(i == 0))},
        {"last", Value(Json(i == length - 1))},
        {"length", Value(Json(length))},
        {"depth", Value(Json(1))},
        {"depth0", Value(Json(0))},
        {"previtem", i > 0 ? items[i - 1] : Value::Undefined("there is no previous item")},
        {"nextitem", i + 1 < length ? items[i + 1] : Value::Undefined("there is no next item")},
        {"cycle", Value::Function("loop.cycle",
                                  [i](CallArgs& call) -> absl::StatusOr<Value> {
                                    if (call.positional.empty()) {
                                      return absl::InvalidArgumentError(
                                          "no items for cycling given");
                                    }
                                    return call.positional[i % call.positional.size()];
                                  })},
    };
    inner->Set("loop", Value::Namespace(std::move(loop)));
    absl::StatusOr<Flow> f = Exec(n.body, inner, out);
    if (!f.ok()) {
      --loop_depth_;
      return f.status();
    }
    if (*f == Flow::kBreak) break;
  }
  --loop_depth_;
  return Flow::kNormal;
}

Value Evaluator::MakeMacro(const std::string& name, const Node& n, const ScopePtr& scope) {
  std::weak_ptr<Scope> defining = scope;
  const Node* node = &n;
  return Value::Function(
      name, [this, name, node, defining](CallArgs& call) -> absl::StatusOr<Value> {
        ScopePtr parent = defining.lock();
        if (parent == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat("macro '", name, "' outlived its scope"));
        }
        if (call_depth_ >= options_.max_call_depth) {
          return absl::ResourceExhaustedError(
              absl::StrCat("macro calls nested deeper than ", options_.max_call_depth));
        }
        const std::vector<Param>& params = node->params;
        if (call.positional.size() > params.size()) {
          return absl::InvalidArgumentError(absl::StrCat("macro '", name, "' takes not more than ",
                                                         params.size(), " argument(s)"));
        }
        auto scope = std::make_shared<Scope>(parent);
        std::vector<bool> given(params.size(), false);
        for (size_t i = 0; i < call.positional.size(); ++i) {
          scope->Set(params[i].name, call.positional[i]);
          given[i] = true;
        }
        for (const auto& [key, value] : call.keyword) {
          if (key == "caller") {
            scope->Set("caller", value);
            continue;
          }
          size_t i = 0;
          while (i < params.size() && params[i].name != key) ++i;
          if (i == params.size()) {
            return absl::InvalidArgumentError(
                absl::StrCat("macro '", name, "' has no argument '", key, "'"));
          }
          scope->Set(key, value);
          given[i] = true;
        }
        for (size_t i = 0; i < params.size(); ++i) {
          if (given[i]) continue;
          if (params[i].default_value != nullptr) {
            ASSIGN_OR_RETURN(Value d, Eval(*params[i].default_value, scope));
            scope->Set(params[i].name, d);
          } else {
            scope->Set(params[i].name, Value::Undefined(absl::StrCat("parameter '", params[i].name,
                                                                     "' was not provided")));
          }
        }
        ++call_depth_;
        const int saved_loop_depth = loop_depth_;
        loop_depth_ = 0;
        std::string text;
        absl::StatusOr<Flow> f = Exec(node->body, scope, &text);
        loop_depth_ = saved_loop_depth;
        --call_depth_;
        if (!f.ok()) return f.status();
        return Value(std::move(text));
      });
}

}  // namespace internal

absl::StatusOr<std::string> RenderTemplate(const Body& body, const Json& context,
                                           const RenderOptions& options) {
  if (!context.is_object()) {
    return absl::InvalidArgumentError("the template context must be a JSON object");
  }
  internal::Evaluator evaluator(context, options);
  return evaluator.Run(body);
}

}  // namespace tandem::jinja
