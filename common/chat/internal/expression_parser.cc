#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/chat/internal/builtins.h"
#include "common/chat/internal/parser_internal.h"

namespace tandem::jinja::internal {

// Sets e's height from its children; fails past kMaxExprHeight.
absl::Status Parser::Grow(Expr* e) const {
  int h = 0;
  for (const ExprPtr& a : e->args) {
    if (a != nullptr) h = std::max(h, a->height);
  }
  for (const auto& kv : e->kwargs) h = std::max(h, kv.second->height);
  e->height = h + 1;
  if (e->height > kMaxExprHeight) {
    return Error(e->line, absl::StrCat("expression nested deeper than ", kMaxExprHeight));
  }
  return absl::OkStatus();
}

// expr [, expr ...]: a tuple when there is a comma.
absl::StatusOr<ExprPtr> Parser::ParseTuple(bool with_condexpr, bool explicit_parens) {
  const int line = Cur().line;
  std::vector<ExprPtr> items;
  bool saw_comma = false;
  while (true) {
    if (!items.empty()) {
      if (!IsOp(",")) break;
      Next();
      saw_comma = true;
    }
    if (Cur().type == TT::kVarEnd || Cur().type == TT::kBlockEnd || IsOp(")") || IsName("in") ||
        IsName("if") || IsName("recursive")) {
      if (items.empty() && !explicit_parens) return Unexpected("an expression");
      break;
    }
    ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(with_condexpr));
    items.push_back(std::move(e));
  }
  if (!saw_comma && items.size() == 1) return std::move(items[0]);
  auto t = Make(Expr::Kind::kTuple, line);
  t->args = std::move(items);
  RETURN_IF_ERROR(Grow(t.get()));
  return t;
}

absl::StatusOr<ExprPtr> Parser::ParseExpression(bool with_condexpr) {
  if (++depth_ > kMaxParseDepth) {
    return Error(Cur().line, absl::StrCat("expression nested deeper than ", kMaxParseDepth));
  }
  absl::StatusOr<ExprPtr> r = with_condexpr ? ParseCondExpr() : ParseOr();
  --depth_;
  return r;
}

absl::StatusOr<ExprPtr> Parser::ParseCondExpr() {
  ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
  while (IsName("if")) {
    const int line = Cur().line;
    Next();
    ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
    ExprPtr else_expr;
    if (IsName("else")) {
      Next();
      ASSIGN_OR_RETURN(else_expr, ParseCondExpr());
    }
    auto e = Make(Expr::Kind::kCondExpr, line);
    e->args.push_back(std::move(expr));
    e->args.push_back(std::move(cond));
    e->args.push_back(std::move(else_expr));
    RETURN_IF_ERROR(Grow(e.get()));
    expr = std::move(e);
  }
  return expr;
}

absl::StatusOr<ExprPtr> Parser::ParseOr() {
  ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
  while (IsName("or")) {
    const int line = Cur().line;
    Next();
    ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
    auto e = Make(Expr::Kind::kOr, line);
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    RETURN_IF_ERROR(Grow(e.get()));
    left = std::move(e);
  }
  return left;
}

absl::StatusOr<ExprPtr> Parser::ParseAnd() {
  ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
  while (IsName("and")) {
    const int line = Cur().line;
    Next();
    ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
    auto e = Make(Expr::Kind::kAnd, line);
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    RETURN_IF_ERROR(Grow(e.get()));
    left = std::move(e);
  }
  return left;
}

absl::StatusOr<ExprPtr> Parser::ParseNot() {
  if (IsName("not")) {
    const int line = Cur().line;
    Next();
    if (++depth_ > kMaxParseDepth) return Error(line, "expression nested too deeply");
    ASSIGN_OR_RETURN(ExprPtr inner, ParseNot());
    --depth_;
    auto e = Make(Expr::Kind::kNot, line);
    e->args.push_back(std::move(inner));
    RETURN_IF_ERROR(Grow(e.get()));
    return e;
  }
  return ParseCompare();
}

absl::StatusOr<ExprPtr> Parser::ParseCompare() {
  const int line = Cur().line;
  ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
  std::vector<ExprPtr> operands;
  std::vector<std::string> ops;
  while (true) {
    std::string op;
    if (Cur().type == TT::kOperator &&
        (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" || Cur().text == "<=" ||
         Cur().text == ">" || Cur().text == ">=")) {
      op = Cur().text;
      Next();
    } else if (IsName("in")) {
      op = "in";
      Next();
    } else if (IsName("not") && Peek().type == TT::kName && Peek().text == "in") {
      op = "notin";
      Next();
      Next();
    } else {
      break;
    }
    ASSIGN_OR_RETURN(ExprPtr right, ParseMath1());
    ops.push_back(op);
    operands.push_back(std::move(right));
  }
  if (ops.empty()) return first;
  auto e = Make(Expr::Kind::kCompare, line);
  e->args.push_back(std::move(first));
  for (auto& o : operands) e->args.push_back(std::move(o));
  e->ops = std::move(ops);
  RETURN_IF_ERROR(Grow(e.get()));
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParseBinaryLevel(int level) {
  // level 0: + -   level 1: ~ (concat)   level 2: * / // %   level 3: **
  if (level == 1) {
    const int line = Cur().line;
    ASSIGN_OR_RETURN(ExprPtr first, ParseBinaryLevel(2));
    if (!IsOp("~")) return first;
    auto e = Make(Expr::Kind::kConcat, line);
    e->args.push_back(std::move(first));
    while (IsOp("~")) {
      Next();
      ASSIGN_OR_RETURN(ExprPtr next, ParseBinaryLevel(2));
      e->args.push_back(std::move(next));
    }
    RETURN_IF_ERROR(Grow(e.get()));
    return e;
  }
  auto sub = [&]() -> absl::StatusOr<ExprPtr> {
    if (level == 3) return ParseUnary(true);
    return ParseBinaryLevel(level + 1);
  };
  ASSIGN_OR_RETURN(ExprPtr left, sub());
  while (Cur().type == TT::kOperator) {
    const std::string& op = Cur().text;
    const bool match = level == 0   ? (op == "+" || op == "-")
                       : level == 2 ? (op == "*" || op == "/" || op == "//" || op == "%")
                                    : op == "**";
    if (!match) break;
    auto e = Make(Expr::Kind::kBinary, Cur().line);
    e->name = op;
    Next();
    ASSIGN_OR_RETURN(ExprPtr right, sub());
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    RETURN_IF_ERROR(Grow(e.get()));
    left = std::move(e);
  }
  return left;
}

absl::StatusOr<ExprPtr> Parser::ParseUnary(bool with_filter) {
  if (++depth_ > kMaxParseDepth) {
    return Error(Cur().line, absl::StrCat("expression nested deeper than ", kMaxParseDepth));
  }
  ExprPtr node;
  if (IsOp("-") || IsOp("+")) {
    auto e = Make(IsOp("-") ? Expr::Kind::kNeg : Expr::Kind::kPos, Cur().line);
    Next();
    ASSIGN_OR_RETURN(ExprPtr inner, ParseUnary(false));
    e->args.push_back(std::move(inner));
    RETURN_IF_ERROR(Grow(e.get()));
    node = std::move(e);
  } else {
    ASSIGN_OR_RETURN(node, ParsePrimary());
  }
  ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
  if (with_filter) {
    ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
  }
  --depth_;
  return node;
}

absl::StatusOr<ExprPtr> Parser::ParsePrimary() {
  const Token& t = Cur();
  const int line = t.line;
  switch (t.type) {
    case TT::kName: {
      auto e = Make(Expr::Kind::kLiteral, line);
      if (t.text == "true" || t.text == "True") {
        e->literal = true;
      } else if (t.text == "false" || t.text == "False") {
        e->literal = false;
      } else if (t.text == "none" || t.text == "None") {
        e->literal = nullptr;
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.text;
      }
      Next();
      RETURN_IF_ERROR(Grow(e.get()));
      return e;
    }
    case TT::kString: {
      std::string s;
      while (Cur().type == TT::kString) {  // adjacent literals concatenate
        s += Cur().text;
        Next();
      }
      auto e = Make(Expr::Kind::kLiteral, line);
      e->literal = std::move(s);
      RETURN_IF_ERROR(Grow(e.get()));
      return e;
    }
    case TT::kInteger: {
      auto e = Make(Expr::Kind::kLiteral, line);
      e->literal = t.int_value;
      Next();
      RETURN_IF_ERROR(Grow(e.get()));
      return e;
    }
    case TT::kFloat: {
      auto e = Make(Expr::Kind::kLiteral, line);
      e->literal = t.float_value;
      Next();
      RETURN_IF_ERROR(Grow(e.get()));
      return e;
    }
    case TT::kOperator:
      if (t.text == "(") {
        Next();
        ASSIGN_OR_RETURN(ExprPtr inner, ParseTuple(true, true));
        RETURN_IF_ERROR(ExpectOp(")"));
        return inner;
      }
      if (t.text == "[") {
        Next();
        auto e = Make(Expr::Kind::kList, line);
        while (!IsOp("]")) {
          if (!e->args.empty()) {
            RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp("]")) break;
          }
          ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
          e->args.push_back(std::move(item));
        }
        Next();
        RETURN_IF_ERROR(Grow(e.get()));
        return e;
      }
      if (t.text == "{") {
        Next();
        auto e = Make(Expr::Kind::kDict, line);
        while (!IsOp("}")) {
          if (!e->args.empty()) {
            RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp("}")) break;
          }
          ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
          RETURN_IF_ERROR(ExpectOp(":"));
          ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
          e->args.push_back(std::move(key));
          e->args.push_back(std::move(value));
        }
        Next();
        RETURN_IF_ERROR(Grow(e.get()));
        return e;
      }
      break;
    default:
      break;
  }
  return Unexpected("an expression");
}

absl::StatusOr<ExprPtr> Parser::ParsePostfix(ExprPtr node) {
  while (true) {
    if (IsOp(".")) {
      const int line = Cur().line;
      Next();
      auto e = Make(Expr::Kind::kGetAttr, line);
      if (Cur().type == TT::kName) {
        e->name = Cur().text;
      } else if (Cur().type == TT::kInteger) {
        // x.0 is x[0]
        e->kind = Expr::Kind::kGetItem;
        auto idx = Make(Expr::Kind::kLiteral, line);
        idx->literal = Cur().int_value;
        e->args.push_back(std::move(node));
        e->args.push_back(std::move(idx));
        Next();
        RETURN_IF_ERROR(Grow(e.get()));
        node = std::move(e);
        continue;
      } else {
        return Unexpected("an attribute name");
      }
      Next();
      e->args.push_back(std::move(node));
      RETURN_IF_ERROR(Grow(e.get()));
      node = std::move(e);
    } else if (IsOp("[")) {
      ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
    } else if (IsOp("(")) {
      ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
    } else {
      return node;
    }
  }
}

absl::StatusOr<ExprPtr> Parser::ParseSubscript(ExprPtr node) {
  const int line = Cur().line;
  Next();  // [
  ExprPtr parts[3];
  int colons = 0;
  while (!IsOp("]")) {
    if (IsOp(":")) {
      if (++colons > 2) return Unexpected("']'");
      Next();
      continue;
    }
    if (parts[colons] != nullptr) return Unexpected("':' or ']'");
    if (IsOp(",")) return Error(line, "tuple subscripts are not supported");
    ASSIGN_OR_RETURN(parts[colons], ParseExpression(true));
  }
  Next();
  if (colons == 0) {
    if (parts[0] == nullptr) return Error(line, "empty subscript");
    auto e = Make(Expr::Kind::kGetItem, line);
    e->args.push_back(std::move(node));
    e->args.push_back(std::move(parts[0]));
    RETURN_IF_ERROR(Grow(e.get()));
    return e;
  }
  auto e = Make(Expr::Kind::kSlice, line);
  e->args.push_back(std::move(node));
  for (auto& p : parts) e->args.push_back(std::move(p));
  RETURN_IF_ERROR(Grow(e.get()));
  return e;
}

absl::Status Parser::ParseCallArgs(Expr* e) {
  RETURN_IF_ERROR(ExpectOp("("));
  bool first = true;
  while (!IsOp(")")) {
    if (!first) {
      RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(")")) break;
    }
    first = false;
    if (IsOp("*") || IsOp("**")) return Error(Cur().line, "*args and **kwargs are not supported");
    if (Cur().type == TT::kName && Peek().type == TT::kOperator && Peek().text == "=") {
      std::string key = Cur().text;
      Next();
      Next();
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      e->kwargs.emplace_back(std::move(key), std::move(value));
    } else {
      if (!e->kwargs.empty()) {
        return Error(Cur().line, "positional argument after keyword argument");
      }
      ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      e->args.push_back(std::move(value));
    }
  }
  Next();
  return absl::OkStatus();
}

absl::StatusOr<ExprPtr> Parser::ParseFilterExpr(ExprPtr node) {
  while (true) {
    if (IsOp("|")) {
      ASSIGN_OR_RETURN(node, ParseFilterChain(std::move(node), /*single=*/true));
    } else if (IsName("is")) {
      ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
    } else if (IsOp("(")) {
      ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
    } else {
      return node;
    }
  }
}

// One filter when `single` (the caller loops), else "| f | g ..." or, in a
// filter block, "f | g ...".
absl::StatusOr<ExprPtr> Parser::ParseFilterChain(ExprPtr input, bool single) {
  bool first = true;
  while (first || IsOp("|")) {
    if (IsOp("|")) Next();
    if (first && !single && Cur().type == TT::kName && Cur().text == "filter") Next();
    first = false;
    const int line = Cur().line;
    ASSIGN_OR_RETURN(std::string name, ExpectName());
    while (IsOp(".")) {
      Next();
      ASSIGN_OR_RETURN(std::string part, ExpectName());
      absl::StrAppend(&name, ".", part);
    }
    if (!IsKnownFilter(name)) return Error(line, absl::StrCat("no filter named '", name, "'"));
    auto e = Make(Expr::Kind::kFilter, line);
    e->name = std::move(name);
    e->args.push_back(std::move(input));
    if (IsOp("(")) RETURN_IF_ERROR(ParseCallArgs(e.get()));
    RETURN_IF_ERROR(Grow(e.get()));
    input = std::move(e);
    if (single) break;
  }
  return input;
}

absl::StatusOr<ExprPtr> Parser::ParseTest(ExprPtr node) {
  const int line = Cur().line;
  Next();  // is
  auto e = Make(Expr::Kind::kTest, line);
  if (IsName("not")) {
    e->negated = true;
    Next();
  }
  ASSIGN_OR_RETURN(e->name, ExpectName());
  if (!IsKnownTest(e->name)) return Error(line, absl::StrCat("no test named '", e->name, "'"));
  e->args.push_back(std::move(node));
  if (IsOp("(")) {
    RETURN_IF_ERROR(ParseCallArgs(e.get()));
  } else if ((Cur().type == TT::kName || Cur().type == TT::kString || Cur().type == TT::kInteger ||
              Cur().type == TT::kFloat || IsOp("[") || IsOp("{")) &&
             !IsName("else") && !IsName("or") && !IsName("and") && !IsName("if") && !IsName("in") &&
             !IsName("not")) {
    if (IsName("is")) return Error(line, "tests cannot be chained with 'is'");
    ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
    ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
    e->args.push_back(std::move(arg));
  }
  RETURN_IF_ERROR(Grow(e.get()));
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParseCall(ExprPtr callee) {
  auto e = Make(Expr::Kind::kCall, Cur().line);
  e->args.push_back(std::move(callee));
  RETURN_IF_ERROR(ParseCallArgs(e.get()));
  RETURN_IF_ERROR(Grow(e.get()));
  return e;
}

}  // namespace tandem::jinja::internal
