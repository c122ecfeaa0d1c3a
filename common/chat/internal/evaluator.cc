#include "common/chat/internal/evaluator.h"

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/chat/internal/builtins.h"
#include "common/chat/internal/operators.h"

namespace tandem::jinja {
namespace {

constexpr absl::string_view kLocatedPayload = "tandem.jinja/located";

// Adds the line to an error the first time it passes a node.
absl::Status Locate(const absl::Status& s, int line) {
  if (s.ok() || s.GetPayload(kLocatedPayload).has_value()) return s;
  absl::Status out(s.code(), absl::StrCat("template error, line ", line, ": ", s.message()));
  out.SetPayload(kLocatedPayload, absl::Cord("1"));
  return out;
}

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

class Evaluator {
 public:
  Evaluator(const Json& context, const RenderOptions& options)
      : context_(Value(context)), options_(options) {
    limits_.max_bytes = options.max_output_bytes;
    globals_.emplace_back("range", GlobalRange(limits_));
    globals_.emplace_back("namespace", GlobalNamespace(&namespaces_));
    globals_.emplace_back("dict", GlobalDict());
    // `fn = fn`: Clang 14 (the thread-safety check) cannot capture a
    // structured binding.
    for (const auto& [name, fn] : options.functions) {
      globals_.emplace_back(
          name, Value::Function(name, [fn = fn](CallArgs& call) -> absl::StatusOr<Value> {
            FunctionArgs args;
            for (const Value& v : call.positional) args.positional.push_back(ToJsonLoose(v));
            for (const auto& [k, v] : call.keyword) args.keyword.emplace_back(k, ToJsonLoose(v));
            ASSIGN_OR_RETURN(Json r, fn(args));
            return Value(std::move(r));
          }));
    }
  }

  ~Evaluator() {
    // Namespaces may reference each other (ns.a = ns): break the cycles.
    for (auto& ns : namespaces_) ns->attrs.clear();
  }

  absl::StatusOr<std::string> Run(const Body& body) {
    auto root = std::make_shared<Scope>(nullptr);
    std::string out;
    ASSIGN_OR_RETURN(Flow flow, Exec(body, root, &out));
    (void)flow;
    return out;
  }

 private:
  absl::Status Step(int line) {
    if (++steps_ > options_.max_steps) {
      return Locate(absl::ResourceExhaustedError(absl::StrCat("template evaluation exceeded ",
                                                              options_.max_steps, " steps")),
                    line);
    }
    return absl::OkStatus();
  }

  absl::Status Append(absl::string_view s, std::string* out, int line) {
    if (out->size() + s.size() > options_.max_output_bytes) {
      return Locate(absl::ResourceExhaustedError(absl::StrCat("output larger than the limit of ",
                                                              options_.max_output_bytes, " bytes")),
                    line);
    }
    out->append(s.data(), s.size());
    return absl::OkStatus();
  }

  Value Lookup(const std::string& name, const ScopePtr& scope) {
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

  // ---- statements ----

  absl::StatusOr<Flow> Exec(const Body& body, const ScopePtr& scope, std::string* out) {
    for (const NodePtr& n : body) {
      ASSIGN_OR_RETURN(Flow f, ExecNode(*n, scope, out));
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  absl::Status TooDeep(int line) {
    return Locate(absl::ResourceExhaustedError(absl::StrCat(
                      "template evaluation nested deeper than ", kMaxEvalDepth, " levels")),
                  line);
  }

  absl::StatusOr<Flow> ExecNode(const Node& n, const ScopePtr& scope, std::string* out) {
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

  absl::Status Assign(const Expr& target, const Value& v, const ScopePtr& scope) {
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
      return Locate(absl::InvalidArgumentError(
                        absl::StrCat("cannot assign attribute '", target.name,
                                     "' on non-namespace object '", target.args[0]->name, "'")),
                    target.line);
    }
    if (Value* old = ns.ns()->Find(target.name)) {
      *old = v;
    } else {
      ns.ns()->attrs.emplace_back(target.name, v);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> ExecFor(const Node& n, const ScopePtr& scope, std::string* out) {
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

  // A macro (or the caller of a call block): renders its body in a scope
  // whose parent is the defining scope (held weakly: a macro stored in that
  // scope must not keep it alive).
  Value MakeMacro(const std::string& name, const Node& n, const ScopePtr& scope) {
    std::weak_ptr<Scope> defining = scope;
    const Node* node = &n;
    return Value::Function(
        name, [this, name, node, defining](CallArgs& call) -> absl::StatusOr<Value> {
          ScopePtr parent = defining.lock();
          if (parent == nullptr) {
            return absl::InvalidArgumentError(
                absl::StrCat("macro '", name, "' outlived its scope"));
          }
          if (call_depth_ >= options_.max_call_depth) {
            return absl::ResourceExhaustedError(
                absl::StrCat("macro calls nested deeper than ", options_.max_call_depth));
          }
          const std::vector<Param>& params = node->params;
          if (call.positional.size() > params.size()) {
            return absl::InvalidArgumentError(absl::StrCat(
                "macro '", name, "' takes not more than ", params.size(), " argument(s)"));
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
              scope->Set(params[i].name, Value::Undefined(absl::StrCat(
                                             "parameter '", params[i].name, "' was not provided")));
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

  // ---- expressions ----

  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first, const ScopePtr& scope) {
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

  absl::StatusOr<Value> EvalCall(const Expr& e, const ScopePtr& scope, const Value* caller) {
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

  // A filter chain whose innermost input is null (filter blocks, set blocks).
  absl::StatusOr<Value> EvalFilterChain(const Expr& e, const Value& input, const ScopePtr& scope) {
    Value in = input;
    if (e.args[0] != nullptr) {
      ASSIGN_OR_RETURN(in, EvalFilterChain(*e.args[0], input, scope));
    }
    ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1, scope));
    absl::StatusOr<Value> r = ApplyFilter(e.name, in, args, limits_);
    RETURN_LOCATED(r.status(), e.line);
    return r;
  }

  absl::StatusOr<Value> MakeList(const Expr& e, const ScopePtr& scope) {
    Json out = Json::array();
    for (const ExprPtr& item : e.args) {
      ASSIGN_OR_RETURN(Value v, Eval(*item, scope));
      if (v.is_namespace() || v.is_callable()) {
        return Locate(absl::InvalidArgumentError(absl::StrCat(
                          "a list can hold only plain data here, not a ", TypeName(v))),
                      item->line);
      }
      out.push_back(ToJsonLoose(v));
    }
    return Value(std::move(out));
  }

  absl::StatusOr<Value> Eval(const Expr& e, const ScopePtr& scope) {
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
            return Locate(absl::InvalidArgumentError("a dict can hold only plain data here"),
                          e.line);
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

  absl::StatusOr<Value> EvalCompare(const Expr& e, const ScopePtr& scope) {
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

}  // namespace

absl::StatusOr<std::string> RenderTemplate(const Body& body, const Json& context,
                                           const RenderOptions& options) {
  if (!context.is_object()) {
    return absl::InvalidArgumentError("the template context must be a JSON object");
  }
  Evaluator evaluator(context, options);
  return evaluator.Run(body);
}

}  // namespace tandem::jinja
