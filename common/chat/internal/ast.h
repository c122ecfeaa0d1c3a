// Syntax tree of a parsed template (internal to common/chat).
#ifndef TANDEM_COMMON_CHAT_INTERNAL_AST_H_
#define TANDEM_COMMON_CHAT_INTERNAL_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/chat/internal/value.h"

namespace tandem::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

// One generic expression node; which fields are used depends on `kind`.
struct Expr {
  enum class Kind {
    kLiteral,   // literal
    kName,      // name
    kList,      // args: items
    kTuple,     // args: items (a list at run time)
    kDict,      // args: key0, value0, key1, value1, ...
    kGetAttr,   // args[0].name
    kGetItem,   // args[0][args[1]]
    kSlice,     // args[0][args[1]:args[2]:args[3]], absent parts null
    kCall,      // args[0](args[1..], kwargs)
    kFilter,    // args[0] | name(args[1..], kwargs); args[0] null in a filter block
    kTest,      // args[0] is [not] name(args[1..]); `negated`
    kNeg,       // -args[0]
    kPos,       // +args[0]
    kNot,       // not args[0]
    kBinary,    // args[0] name args[1], name one of + - * / // % **
    kAnd,       // args[0] and args[1]
    kOr,        // args[0] or args[1]
    kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ...
    kConcat,    // args[0] ~ args[1] ~ ...
    kCondExpr,  // args[0] if args[1] else args[2] (args[2] may be null)
  };
  Kind kind;
  int line = 0;
  Json literal;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::string> ops;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;
  int height = 1;  // of this subtree; bounded by the parser (evaluation recurses)
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

// Macro parameters: name and default (null when none).
struct Param {
  std::string name;
  ExprPtr default_value;
};

struct Node {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches (condition, body) ..., else_body
    kFor,          // for target in expr [if cond]: body, else_body
    kSet,          // set target = expr (target: name, tuple of names, ns.attr)
    kSetBlock,     // set target [| filter] ... endset: expr is the filter or null
    kMacro,        // macro name(params): body
    kCallBlock,    // call(params) expr: body (the caller)
    kFilterBlock,  // filter expr: body
    kWith,         // with assignments: body
    kBreak,
    kContinue,
  };
  Kind kind;
  int line = 0;
  std::string text;
  std::string name;
  ExprPtr expr;
  ExprPtr target;
  ExprPtr cond;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<Param> params;
  std::vector<std::pair<ExprPtr, ExprPtr>> assignments;
};

}  // namespace tandem::jinja

#endif  // TANDEM_COMMON_CHAT_INTERNAL_AST_H_
