// Values of the Jinja subset (common/chat): plain data is an
// nlohmann::ordered_json (Python dicts keep insertion order, and so does the
// output of tojson and of dict iteration), plus the kinds Jinja2 has beyond
// JSON: Undefined, a namespace() object, and callables (macros, built-in
// functions, bound methods such as "abc".strip).
//
// Values are immutable and cheap to copy: JSON data is shared, and a
// subscript points into its parent without copying it. A namespace is shared
// by reference, as in Python.
//
// Thread safety: a Value may be read from several threads at once (its
// shared data is never written after it is built) but a namespace's
// attributes are written by the one render that owns it. Errors of the
// operations on values are statuses with Python-like messages
// (INVALID_ARGUMENT), never exceptions.
#ifndef TANDEM_COMMON_CHAT_INTERNAL_VALUE_H_
#define TANDEM_COMMON_CHAT_INTERNAL_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace tandem::jinja {

using Json = nlohmann::ordered_json;

class Value;

// Arguments of a call: positional, then keyword in source order.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// A callable value. `fn` returns the result or an error (message without the
// line: the caller adds it).
struct Callable {
  std::string name;
  std::function<absl::StatusOr<Value>(CallArgs&)> fn;
};

// The attributes of a namespace() object (or of a loop object), in order.
struct NamespaceData {
  std::vector<std::pair<std::string, Value>> attrs;
  bool is_loop = false;
  Value* Find(absl::string_view name);
};

class Value {
 public:
  enum class Kind { kUndefined, kJson, kNamespace, kCallable };

  // Undefined; `hint` is the message Jinja2 gives when it is used
  // ("'x' is undefined").
  Value() : kind_(Kind::kUndefined) {}
  static Value Undefined(std::string hint);
  Value(Json json);  // NOLINT: plain data converts implicitly.
  static Value Namespace(std::shared_ptr<NamespaceData> ns);
  static Value Function(std::string name, std::function<absl::StatusOr<Value>(CallArgs&)> fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_json() const { return kind_ == Kind::kJson; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  // Only when is_json().
  const Json& json() const { return *json_; }
  // A value for element `child` of json(), sharing this value's storage.
  Value Child(const Json& child) const;

  const std::string& undefined_hint() const { return hint_; }
  const std::shared_ptr<NamespaceData>& ns() const { return ns_; }
  const Callable& callable() const { return *fn_; }

  bool is_null() const { return is_json() && json_->is_null(); }
  bool is_bool() const { return is_json() && json_->is_boolean(); }
  // Python int (bool excluded) / float / number (bool included, as in Python).
  bool is_int() const { return is_json() && json_->is_number_integer(); }
  bool is_float() const { return is_json() && json_->is_number_float(); }
  bool is_number() const { return is_json() && (json_->is_number() || json_->is_boolean()); }
  bool is_string() const { return is_json() && json_->is_string(); }
  bool is_list() const { return is_json() && json_->is_array(); }
  bool is_dict() const { return is_json() && json_->is_object(); }

  const std::string& str() const { return json_->get_ref<const std::string&>(); }

 private:
  Kind kind_;
  std::shared_ptr<const Json> root_;
  const Json* json_ = nullptr;
  std::shared_ptr<NamespaceData> ns_;
  std::shared_ptr<const Callable> fn_;
  std::string hint_;
};

// Python's truth value (Undefined is false, a namespace or callable true).
bool Truthy(const Value& v);

// The Python type name used in messages: "str", "int", "dict", "undefined"...
std::string TypeName(const Value& v);

// str(v) as Jinja2 prints it: None, True, 1.0, {'a': [1, 'x']}; Undefined
// prints as "". Fails only past kMaxNesting levels.
absl::StatusOr<std::string> ToPythonStr(const Value& v);
// repr(v).
absl::StatusOr<std::string> ToPythonRepr(const Value& v);

// Python's repr of a float: 1.0, 0.1, 1e+16, inf, nan.
std::string FormatPythonFloat(double d);

// json.dumps(v, ensure_ascii=False, indent=indent, separators=...,
// sort_keys=sort_keys): the `tojson` of Hugging Face's chat templates.
// indent < 0 means None. Non-JSON values (Undefined, namespace) fail.
struct JsonDumpOptions {
  int indent = -1;
  std::string item_separator;  // empty: Python's default for the indent
  std::string key_separator;   // empty: ": "
  bool has_separators = false;
  bool sort_keys = false;
  bool ensure_ascii = false;
};
absl::StatusOr<std::string> PythonJsonDumps(const Value& v, const JsonDumpOptions& options);

// Python == (1 == 1.0 == True, deep for lists and dicts). Undefined equals
// only Undefined.
bool PythonEquals(const Value& a, const Value& b);

// Python <: numbers, strings (code point order), lists (lexicographic).
// Other pairs fail with a TypeError-like message.
absl::StatusOr<bool> PythonLess(const Value& a, const Value& b);

// Numbers as Python sees them (bool counts as int).
bool AsInt64(const Value& v, int64_t* out);
double AsDouble(const Value& v);

// Deepest nesting of lists/dicts the printers and comparisons walk.
inline constexpr int kMaxNesting = 256;

}  // namespace tandem::jinja

#endif  // TANDEM_COMMON_CHAT_INTERNAL_VALUE_H_
