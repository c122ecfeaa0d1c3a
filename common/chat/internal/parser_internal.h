// The parser of parser.h as a class (internal to common/chat): statements
// are parsed in parser.cc, expressions in expression_parser.cc.
#ifndef TANDEM_COMMON_CHAT_INTERNAL_PARSER_INTERNAL_H_
#define TANDEM_COMMON_CHAT_INTERNAL_PARSER_INTERNAL_H_

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/chat/internal/ast.h"
#include "common/chat/internal/lexer.h"
#include "common/chat/internal/parser.h"

namespace tandem::jinja::internal {

using TT = Token::Type;

// Recursive descent over the tokens of one template. Not thread-safe; one
// instance parses one template.
class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  absl::StatusOr<Body> ParseAll();

 private:
  const Token& Cur() const { return toks_[pos_]; }
  const Token& Peek(size_t n = 1) const { return toks_[std::min(pos_ + n, toks_.size() - 1)]; }
  void Next() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  bool IsOp(absl::string_view op) const { return Cur().type == TT::kOperator && Cur().text == op; }
  bool IsName(absl::string_view n) const { return Cur().type == TT::kName && Cur().text == n; }

  absl::Status Error(int line, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("template syntax error, line ", line, ": ", what));
  }
  absl::Status Unexpected(absl::string_view expected) const {
    return Error(Cur().line, absl::StrCat("expected ", expected, ", got ", DescribeToken(Cur())));
  }
  absl::Status ExpectOp(absl::string_view op) {
    if (!IsOp(op)) return Unexpected(absl::StrCat("'", op, "'"));
    Next();
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() {
    if (Cur().type != TT::kBlockEnd) return Unexpected("end of statement block");
    Next();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Cur().type != TT::kName) return Unexpected("a name");
    std::string n = Cur().text;
    Next();
    return n;
  }

  // Parses nodes until a block tag whose name is in `end_tags` (its name is
  // stored in *end and the parser stops just after the tag name), or the end
  // of the template when `end_tags` is empty.
  absl::Status ParseBody(const std::vector<std::string>& end_tags, Body* body, std::string* end,
                         absl::string_view opener, int opener_line);
  absl::StatusOr<NodePtr> ParseStatement(const std::vector<std::string>& end_tags,
                                         absl::string_view opener);
  absl::StatusOr<NodePtr> ParseIf();
  absl::StatusOr<NodePtr> ParseFor();

  // name | name, name, ... | (with_namespace) name.attr
  absl::StatusOr<ExprPtr> ParseAssignTarget(bool with_namespace);
  absl::StatusOr<NodePtr> ParseSet();
  absl::Status ParseSignature(std::vector<Param>* params);
  absl::StatusOr<NodePtr> ParseMacro();
  absl::StatusOr<NodePtr> ParseCallBlock();
  absl::StatusOr<NodePtr> ParseFilterBlock();
  absl::StatusOr<NodePtr> ParseWith();

  // ---- expressions (expression_parser.cc) ----

  ExprPtr Make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // Sets e's height from its children; fails past kMaxExprHeight.
  absl::Status Grow(Expr* e) const;

  // expr [, expr ...]: a tuple when there is a comma.
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr, bool explicit_parens);
  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr);
  absl::StatusOr<ExprPtr> ParseCondExpr();
  absl::StatusOr<ExprPtr> ParseOr();
  absl::StatusOr<ExprPtr> ParseAnd();
  absl::StatusOr<ExprPtr> ParseNot();
  absl::StatusOr<ExprPtr> ParseCompare();
  absl::StatusOr<ExprPtr> ParseBinaryLevel(int level);
  absl::StatusOr<ExprPtr> ParseMath1() { return ParseBinaryLevel(0); }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter);
  absl::StatusOr<ExprPtr> ParsePrimary();
  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node);
  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node);
  absl::Status ParseCallArgs(Expr* e);
  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee);
  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node);

  // One filter when `single` (the caller loops), else "| f | g ..." or, in a
  // filter block, "f | g ...".
  absl::StatusOr<ExprPtr> ParseFilterChain(ExprPtr input, bool single = false);
  absl::StatusOr<ExprPtr> ParseTest(ExprPtr node);

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace tandem::jinja::internal

#endif  // TANDEM_COMMON_CHAT_INTERNAL_PARSER_INTERNAL_H_
