// Python's object protocol for template values (internal to common/chat):
// attribute and item lookup as Jinja2's sandboxed environment does them,
// methods of str/dict/list, iteration, len(), `in`, and arithmetic.
// Errors carry Python-like messages without a line; the evaluator adds it.
#ifndef TANDEM_COMMON_CHAT_INTERNAL_OPERATORS_H_
#define TANDEM_COMMON_CHAT_INTERNAL_OPERATORS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/chat/internal/value.h"

namespace tandem::jinja {

// Bounds on what one render may build.
struct Limits {
  size_t max_bytes = 16 << 20;  // any string or list built, and the output
  size_t max_items = 1 << 20;   // items of a list built (range(), * ...)
};

// obj.name: a method of str/dict/list, else a dict key, a namespace
// attribute; Undefined when there is none. Fails on Undefined input.
absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name);
// obj[key]: list/str index (negative from the end), dict key, else as GetAttr
// for a string key; Undefined when absent. Fails on Undefined input.
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);
// obj[start:stop:step] of a list or str.
absl::StatusOr<Value> GetSlice(const Value& obj, const Value& start, const Value& stop,
                               const Value& step, const Limits& limits);

// Items of a for loop: list items, dict keys, str characters; Undefined
// iterates as empty.
absl::StatusOr<std::vector<Value>> Iterate(const Value& v);
// len(v); Undefined has length 0.
absl::StatusOr<int64_t> Length(const Value& v);
// `needle in haystack`.
absl::StatusOr<bool> Contains(const Value& haystack, const Value& needle);

// a op b for op in + - * / // % **.
absl::StatusOr<Value> BinaryOp(absl::string_view op, const Value& a, const Value& b,
                               const Limits& limits);
absl::StatusOr<Value> Negate(const Value& v, bool minus);

// str(v) for template output and for `~`.
absl::StatusOr<std::string> ToStr(const Value& v);

// Call arguments bound to parameter names, as Python binds them.
// Thread-compatible: one call's arguments, used by the render that bound
// them.
class BoundArgs {
 public:
  // Fails on too many positional arguments, an unknown keyword, or one given
  // twice.
  static absl::StatusOr<BoundArgs> Bind(absl::string_view fn, const CallArgs& args,
                                        std::vector<std::string> params);
  // Null when parameter `i` was not given.
  const Value* Get(size_t i) const { return given_[i] ? &values_[i] : nullptr; }
  bool Has(size_t i) const { return given_[i]; }
  // Typed access; `fallback` when not given; an error on a wrong type.
  absl::StatusOr<std::string> String(size_t i, std::string fallback) const;
  absl::StatusOr<int64_t> Int(size_t i, int64_t fallback) const;
  bool Bool(size_t i, bool fallback) const;

 private:
  std::string fn_;
  std::vector<std::string> params_;
  std::vector<Value> values_;
  std::vector<bool> given_;
};

// A message for using an Undefined: its hint, or "value is undefined".
absl::Status UndefinedError(const Value& v);

}  // namespace tandem::jinja

#endif  // TANDEM_COMMON_CHAT_INTERNAL_OPERATORS_H_
