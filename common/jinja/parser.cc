#include "common/jinja/parser.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/jinja/builtins.h"
#include "common/jinja/lexer.h"

namespace tandem::jinja {
namespace {

using TT = Token::Type;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  absl::StatusOr<Body> ParseAll() {
    Body body;
    std::string end;
    RETURN_IF_ERROR(ParseBody({}, &body, &end, "", 0));
    return body;
  }

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
                         absl::string_view opener, int opener_line) {
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

  absl::StatusOr<NodePtr> ParseStatement(const std::vector<std::string>& end_tags,
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
    if (tag == "include" || tag == "import" || tag == "from" || tag == "extends" ||
        tag == "block" || tag == "do" || tag == "autoescape" || tag == "trans") {
      return Error(line, absl::StrCat("tag '", tag, "' is not supported"));
    }
    std::string msg = absl::StrCat("unknown tag '", tag, "'");
    if (!end_tags.empty()) {
      absl::StrAppend(&msg, " (the innermost open block is '", opener, "', closed by '",
                      absl::StrJoin(end_tags, "' or '"), "')");
    }
    return Error(line, msg);
  }

  absl::StatusOr<NodePtr> ParseIf() {
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

  absl::StatusOr<NodePtr> ParseFor() {
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
  absl::StatusOr<ExprPtr> ParseAssignTarget(bool with_namespace) {
    const int line = Cur().line;
    auto name_node = [&]() -> absl::StatusOr<ExprPtr> {
      ASSIGN_OR_RETURN(std::string name, ExpectName());
      if (name == "true" || name == "false" || name == "none" || name == "True" ||
          name == "False" || name == "None") {
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

  absl::StatusOr<NodePtr> ParseSet() {
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

  absl::Status ParseSignature(std::vector<Param>* params) {
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

  absl::StatusOr<NodePtr> ParseMacro() {
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

  absl::StatusOr<NodePtr> ParseCallBlock() {
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

  absl::StatusOr<NodePtr> ParseFilterBlock() {
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

  absl::StatusOr<NodePtr> ParseWith() {
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

  // ---- expressions ----

  ExprPtr Make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // Sets e's height from its children; fails past kMaxExprHeight.
  absl::Status Grow(Expr* e) const {
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
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr, bool explicit_parens) {
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

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    if (++depth_ > kMaxParseDepth) {
      return Error(Cur().line, absl::StrCat("expression nested deeper than ", kMaxParseDepth));
    }
    absl::StatusOr<ExprPtr> r = with_condexpr ? ParseCondExpr() : ParseOr();
    --depth_;
    return r;
  }

  absl::StatusOr<ExprPtr> ParseCondExpr() {
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

  absl::StatusOr<ExprPtr> ParseOr() {
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

  absl::StatusOr<ExprPtr> ParseAnd() {
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

  absl::StatusOr<ExprPtr> ParseNot() {
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

  absl::StatusOr<ExprPtr> ParseCompare() {
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

  absl::StatusOr<ExprPtr> ParseBinaryLevel(int level) {
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

  absl::StatusOr<ExprPtr> ParseMath1() { return ParseBinaryLevel(0); }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
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

  absl::StatusOr<ExprPtr> ParsePrimary() {
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

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
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

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node) {
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

  absl::Status ParseCallArgs(Expr* e) {
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

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    auto e = Make(Expr::Kind::kCall, Cur().line);
    e->args.push_back(std::move(callee));
    RETURN_IF_ERROR(ParseCallArgs(e.get()));
    RETURN_IF_ERROR(Grow(e.get()));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
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
  absl::StatusOr<ExprPtr> ParseFilterChain(ExprPtr input, bool single = false) {
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

  absl::StatusOr<ExprPtr> ParseTest(ExprPtr node) {
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
    } else if ((Cur().type == TT::kName || Cur().type == TT::kString ||
                Cur().type == TT::kInteger || Cur().type == TT::kFloat || IsOp("[") || IsOp("{")) &&
               !IsName("else") && !IsName("or") && !IsName("and") && !IsName("if") &&
               !IsName("in") && !IsName("not")) {
      if (IsName("is")) return Error(line, "tests cannot be chained with 'is'");
      ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
      ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
      e->args.push_back(std::move(arg));
    }
    RETURN_IF_ERROR(Grow(e.get()));
    return e;
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<Body> ParseTemplate(absl::string_view source) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  return Parser(std::move(tokens)).ParseAll();
}

}  // namespace tandem::jinja
