#include "common/chat/internal/parser.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/chat/internal/builtins.h"
#include "common/chat/internal/parser_internal.h"

namespace tandem::jinja {
namespace internal {

absl::StatusOr<Body> Parser::ParseAll() {
  Body body;
  std::string end;
  RETURN_IF_ERROR(ParseBody({}, &body, &end, "", 0));
  return body;
}

absl::Status Parser::ParseBody(const std::vector<std::string>& end_tags, Body* body,
                               std::string* end, absl::string_view opener, int opener_line) {
  if (++depth_ > kMaxParseDepth) {
    return Error(Cur().line, absl::StrCat("blocks nested deeper than ", kMaxParseDepth));
  }
  while (true) {
    const Token& t = Cur();
    if (t.type == TT::kEof) {
      if (end_tags.empty()) break;
      return Error(t.line, absl::StrCat("unexpected end of template: the '", opener,
                                        "' block opened on line ", opener_line,
                                        " was never closed (expected '",
                                        absl::StrJoin(end_tags, "' or '"), "')"));
    }
    if (t.type == TT::kText) {
      auto n = std::make_unique<Node>();
      n->kind = Node::Kind::kText;
      n->line = t.line;
      n->text = t.text;
      body->push_back(std::move(n));
      Next();
    } else if (t.type == TT::kVarBegin) {
      Next();
      auto n = std::make_unique<Node>();
      n->kind = Node::Kind::kOutput;
      n->line = t.line;
      ASSIGN_OR_RETURN(n->expr, ParseTuple(true, false));
      if (Cur().type != TT::kVarEnd) return Unexpected("end of print statement");
      Next();
      body->push_back(std::move(n));
    } else if (t.type == TT::kBlockBegin) {
      Next();
      if (Cur().type != TT::kName) return Unexpected("a tag name");
      const std::string tag = Cur().text;
      for (const std::string& e : end_tags) {
        if (tag == e) {
          *end = tag;
          Next();
          --depth_;
          return absl::OkStatus();
        }
      }
      ASSIGN_OR_RETURN(NodePtr n, ParseStatement(end_tags, opener));
      if (n != nullptr) body->push_back(std::move(n));
    } else {
      return Unexpected("template data or a tag");
    }
  }
  --depth_;
  return absl::OkStatus();
}

absl::StatusOr<NodePtr> Parser::ParseStatement(const std::vector<std::string>& end_tags,
                                               absl::string_view opener) {
  const std::string tag = Cur().text;
  const int line = Cur().line;
  if (tag == "if") return ParseIf();
  if (tag == "for") return ParseFor();
  if (tag == "set") return ParseSet();
  if (tag == "macro") return ParseMacro();
  if (tag == "call") return ParseCallBlock();
  if (tag == "filter") return ParseFilterBlock();
  if (tag == "with") return ParseWith();
  if (tag == "break" || tag == "continue") {
    Next();
    RETURN_IF_ERROR(ExpectBlockEnd());
    auto n = std::make_unique<Node>();
    n->kind = tag == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
    n->line = line;
    return n;
  }
  if (tag == "generation") {
    // Hugging Face's AssistantTracker extension: marks assistant text; the
    // rendered output is the body's.
    Next();
    RETURN_IF_ERROR(ExpectBlockEnd());
    auto n = std::make_unique<Node>();
    n->kind = Node::Kind::kWith;
    n->line = line;
    std::string end;
    RETURN_IF_ERROR(ParseBody({"endgeneration"}, &n->body, &end, "generation", line));
    RETURN_IF_ERROR(ExpectBlockEnd());
    return n;
  }
  if (tag == "include" || tag == "import" || tag == "from" || tag == "extends" || tag == "block" ||
      tag == "do" || tag == "autoescape" || tag == "trans") {
    return Error(line, absl::StrCat("tag '", tag, "' is not supported"));
  }
  std::string msg = absl::StrCat("unknown tag '", tag, "'");
  if (!end_tags.empty()) {
    absl::StrAppend(&msg, " (the innermost open block is '", opener, "', closed by '",
                    absl::StrJoin(end_tags, "' or '"), "')");
  }
  return Error(line, msg);
}

absl::StatusOr<NodePtr> Parser::ParseIf() {
  auto n = std::make_unique<Node>();
  n->kind = Node::Kind::kIf;
  n->line = Cur().line;
  Next();
  while (true) {
    ASSIGN_OR_RETURN(ExprPtr cond, ParseTuple(false, false));
    RETURN_IF_ERROR(ExpectBlockEnd());
    Body body;
    std::string end;
    RETURN_IF_ERROR(ParseBody({"elif", "else", "endif"}, &body, &end, "if", n->line));
    n->branches.emplace_back(std::move(cond), std::move(body));
    if (end == "elif") continue;
    if (end == "else") {
      RETURN_IF_ERROR(ExpectBlockEnd());
      RETURN_IF_ERROR(ParseBody({"endif"}, &n->else_body, &end, "if", n->line));
    }
    RETURN_IF_ERROR(ExpectBlockEnd());
    return n;
  }
}

absl::StatusOr<NodePtr> Parser::ParseFor() {
  auto n = std::make_unique<Node>();
  n->kind = Node::Kind::kFor;
  n->line = Cur().line;
  Next();
  ASSIGN_OR_RETURN(n->target, ParseAssignTarget(false));
  if (!IsName("in")) return Unexpected("'in'");
  Next();
  ASSIGN_OR_RETURN(n->expr, ParseTuple(false, false));
  if (IsName("if")) {
    Next();
    ASSIGN_OR_RETURN(n->cond, ParseExpression(true));
  }
  if (IsName("recursive")) return Error(Cur().line, "recursive for loops are not supported");
  RETURN_IF_ERROR(ExpectBlockEnd());
  std::string end;
  RETURN_IF_ERROR(ParseBody({"endfor", "else"}, &n->body, &end, "for", n->line));
  if (end == "else") {
    RETURN_IF_ERROR(ExpectBlockEnd());
    RETURN_IF_ERROR(ParseBody({"endfor"}, &n->else_body, &end, "for", n->line));
  }
  RETURN_IF_ERROR(ExpectBlockEnd());
  return n;
}

// name | name, name, ... | (with_namespace) name.attr
absl::StatusOr<ExprPtr> Parser::ParseAssignTarget(bool with_namespace) {
  const int line = Cur().line;
  auto name_node = [&]() -> absl::StatusOr<ExprPtr> {
    ASSIGN_OR_RETURN(std::string name, ExpectName());
    if (name == "true" || name == "false" || name == "none" || name == "True" || name == "False" ||
        name == "None") {
      return Error(line, absl::StrCat("cannot assign to '", name, "'"));
    }
    auto e = std::make_unique<Expr>();
    e->kind = Expr::Kind::kName;
    e->line = line;
    e->name = std::move(name);
    return e;
  };
  if (with_namespace && Cur().type == TT::kName && Peek().type == TT::kOperator &&
      Peek().text == ".") {
    ASSIGN_OR_RETURN(ExprPtr obj, name_node());
    Next();
    ASSIGN_OR_RETURN(std::string attr, ExpectName());
    auto e = std::make_unique<Expr>();
    e->kind = Expr::Kind::kGetAttr;
    e->line = line;
    e->name = std::move(attr);
    e->args.push_back(std::move(obj));
    return e;
  }
  const bool paren = IsOp("(");
  if (paren) Next();
  ASSIGN_OR_RETURN(ExprPtr first, name_node());
  if (!IsOp(",")) {
    if (paren) RETURN_IF_ERROR(ExpectOp(")"));
    return first;
  }
  auto tuple = std::make_unique<Expr>();
  tuple->kind = Expr::Kind::kTuple;
  tuple->line = line;
  tuple->args.push_back(std::move(first));
  while (IsOp(",")) {
    Next();
    if (Cur().type != TT::kName) break;
    ASSIGN_OR_RETURN(ExprPtr next, name_node());
    tuple->args.push_back(std::move(next));
  }
  if (paren) RETURN_IF_ERROR(ExpectOp(")"));
  return tuple;
}

absl::StatusOr<NodePtr> Parser::ParseSet() {
  auto n = std::make_unique<Node>();
  n->line = Cur().line;
  Next();
  ASSIGN_OR_RETURN(n->target, ParseAssignTarget(true));
  if (IsOp("=")) {
    Next();
    n->kind = Node::Kind::kSet;
    ASSIGN_OR_RETURN(n->expr, ParseTuple(true, false));
    RETURN_IF_ERROR(ExpectBlockEnd());
    return n;
  }
  n->kind = Node::Kind::kSetBlock;
  if (IsOp("|")) {
    ASSIGN_OR_RETURN(n->expr, ParseFilterChain(nullptr));
  }
  RETURN_IF_ERROR(ExpectBlockEnd());
  std::string end;
  RETURN_IF_ERROR(ParseBody({"endset"}, &n->body, &end, "set", n->line));
  RETURN_IF_ERROR(ExpectBlockEnd());
  return n;
}

absl::Status Parser::ParseSignature(std::vector<Param>* params) {
  RETURN_IF_ERROR(ExpectOp("("));
  while (!IsOp(")")) {
    if (!params->empty()) RETURN_IF_ERROR(ExpectOp(","));
    if (IsOp(")")) break;
    Param p;
    ASSIGN_OR_RETURN(p.name, ExpectName());
    if (IsOp("=")) {
      Next();
      ASSIGN_OR_RETURN(p.default_value, ParseExpression(true));
    }
    params->push_back(std::move(p));
  }
  Next();
  return absl::OkStatus();
}

absl::StatusOr<NodePtr> Parser::ParseMacro() {
  auto n = std::make_unique<Node>();
  n->kind = Node::Kind::kMacro;
  n->line = Cur().line;
  Next();
  ASSIGN_OR_RETURN(n->name, ExpectName());
  RETURN_IF_ERROR(ParseSignature(&n->params));
  RETURN_IF_ERROR(ExpectBlockEnd());
  std::string end;
  RETURN_IF_ERROR(ParseBody({"endmacro"}, &n->body, &end, "macro", n->line));
  if (Cur().type == TT::kName) Next();  // {% endmacro name %}
  RETURN_IF_ERROR(ExpectBlockEnd());
  return n;
}

absl::StatusOr<NodePtr> Parser::ParseCallBlock() {
  auto n = std::make_unique<Node>();
  n->kind = Node::Kind::kCallBlock;
  n->line = Cur().line;
  Next();
  if (IsOp("(")) RETURN_IF_ERROR(ParseSignature(&n->params));
  ASSIGN_OR_RETURN(n->expr, ParseExpression(true));
  if (n->expr->kind != Expr::Kind::kCall) return Error(n->line, "expected a call in 'call'");
  RETURN_IF_ERROR(ExpectBlockEnd());
  std::string end;
  RETURN_IF_ERROR(ParseBody({"endcall"}, &n->body, &end, "call", n->line));
  RETURN_IF_ERROR(ExpectBlockEnd());
  return n;
}

absl::StatusOr<NodePtr> Parser::ParseFilterBlock() {
  auto n = std::make_unique<Node>();
  n->kind = Node::Kind::kFilterBlock;
  n->line = Cur().line;
  // "{% filter upper %}": the chain starts without a '|'.
  ASSIGN_OR_RETURN(n->expr, ParseFilterChain(nullptr));
  RETURN_IF_ERROR(ExpectBlockEnd());
  std::string end;
  RETURN_IF_ERROR(ParseBody({"endfilter"}, &n->body, &end, "filter", n->line));
  RETURN_IF_ERROR(ExpectBlockEnd());
  return n;
}

absl::StatusOr<NodePtr> Parser::ParseWith() {
  auto n = std::make_unique<Node>();
  n->kind = Node::Kind::kWith;
  n->line = Cur().line;
  Next();
  while (Cur().type != TT::kBlockEnd) {
    if (!n->assignments.empty()) RETURN_IF_ERROR(ExpectOp(","));
    ASSIGN_OR_RETURN(ExprPtr target, ParseAssignTarget(false));
    RETURN_IF_ERROR(ExpectOp("="));
    ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
    n->assignments.emplace_back(std::move(target), std::move(value));
  }
  Next();
  std::string end;
  RETURN_IF_ERROR(ParseBody({"endwith"}, &n->body, &end, "with", n->line));
  RETURN_IF_ERROR(ExpectBlockEnd());
  return n;
}

}  // namespace internal

absl::StatusOr<Body> ParseTemplate(absl::string_view source) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  return internal::Parser(std::move(tokens)).ParseAll();
}

}  // namespace tandem::jinja
