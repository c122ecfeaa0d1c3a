// The Jinja subset's built-ins (builtins.h): the filter names and the
// dispatch of ApplyFilter (the filters with functions of their own are in
// list_filters.cc and scalar_filters.cc), the tests, and the global
// functions range, namespace and dict.
#include "common/chat/internal/builtins.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/chat/internal/builtins_internal.h"
#include "common/chat/internal/py_string.h"

namespace tandem::jinja {
namespace internal {

absl::Status TypeError(absl::string_view msg) {
  return absl::InvalidArgumentError(std::string(msg));
}

absl::StatusOr<std::string> SoftStr(const Value& v) { return ToPythonStr(v); }

}  // namespace internal

// The filters with functions of their own (list_filters.cc, scalar_filters.cc)
// and the helpers the dispatch below shares with them.
using internal::GetPath;
using internal::HtmlEscape;
using internal::Indent;
using internal::ListValue;
using internal::MapFilter;
using internal::MinMax;
using internal::Round;
using internal::SelectOrReject;
using internal::SoftStr;
using internal::SortFilter;
using internal::SortKey;
using internal::SortValues;
using internal::ToFloat;
using internal::ToInt;
using internal::ToJsonFilter;
using internal::TypeError;

namespace {

constexpr absl::string_view kFilters[] = {
    "abs",     "attr",    "capitalize", "count",  "d",      "default",    "dictsort", "e",
    "escape",  "first",   "float",      "indent", "int",    "items",      "join",     "last",
    "length",  "list",    "lower",      "map",    "max",    "min",        "reject",   "rejectattr",
    "replace", "reverse", "round",      "safe",   "select", "selectattr", "sort",     "string",
    "sum",     "title",   "tojson",     "trim",   "unique", "upper",      "wordcount"};

constexpr absl::string_view kTests[] = {
    "defined",  "undefined", "none",    "boolean",     "true",     "false",       "integer",
    "float",    "number",    "string",  "mapping",     "iterable", "sequence",    "callable",
    "sameas",   "eq",        "equalto", "==",          "ne",       "!=",          "lt",
    "lessthan", "<",         "le",      "<=",          "gt",       "greaterthan", ">",
    "ge",       ">=",        "in",      "divisibleby", "even",     "odd",         "lower",
    "upper",    "escaped"};

absl::StatusOr<Value> CallMethod(const Value& obj, const std::string& name, CallArgs args) {
  ASSIGN_OR_RETURN(Value m, GetAttr(obj, name));
  if (!m.is_callable()) return TypeError(absl::StrCat("no method ", name));
  return m.callable().fn(args);
}

}  // namespace

Json ToJsonLoose(const Value& v) { return v.is_json() ? v.json() : Json(nullptr); }

bool IsKnownFilter(absl::string_view name) {
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters);
}

bool IsKnownTest(absl::string_view name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& input, const CallArgs& args,
                                  const Limits& limits) {
  const std::string fn(name);
  if (name == "default" || name == "d") {
    ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(fn, args, {"default_value", "boolean"}));
    const bool use_default = input.is_undefined() || (a.Bool(1, false) && !Truthy(input));
    if (!use_default) return input;
    return a.Has(0) ? *a.Get(0) : Value(std::string());
  }
  if (name == "safe") return input;
  if (name == "length" || name == "count") {
    ASSIGN_OR_RETURN(int64_t n, Length(input));
    return Value(Json(n));
  }
  if (name == "string") {
    ASSIGN_OR_RETURN(std::string s, SoftStr(input));
    return Value(std::move(s));
  }
  if (name == "trim" || name == "upper" || name == "lower" || name == "title" ||
      name == "capitalize" || name == "replace") {
    ASSIGN_OR_RETURN(std::string s, SoftStr(input));
    if (name == "trim") {
      ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(fn, args, {"chars"}));
      std::optional<std::string> chars;
      if (a.Has(0) && !a.Get(0)->is_null()) {
        ASSIGN_OR_RETURN(chars, a.String(0, ""));
      }
      return Value(PyStrip(s, chars, true, true));
    }
    if (name == "replace") {
      ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(fn, args, {"old", "new", "count"}));
      CallArgs m;
      for (size_t i = 0; i < 3; ++i) {
        if (a.Has(i) && !(i == 2 && a.Get(i)->is_null())) m.positional.push_back(*a.Get(i));
      }
      if (!m.positional.empty() && !m.positional[0].is_string()) {
        ASSIGN_OR_RETURN(std::string old_s, SoftStr(m.positional[0]));
        m.positional[0] = Value(old_s);
      }
      if (m.positional.size() > 1 && !m.positional[1].is_string()) {
        ASSIGN_OR_RETURN(std::string new_s, SoftStr(m.positional[1]));
        m.positional[1] = Value(new_s);
      }
      ASSIGN_OR_RETURN(Value r, CallMethod(Value(s), "replace", m));
      if (r.str().size() > limits.max_bytes)
        return absl::ResourceExhaustedError("string too large");
      return r;
    }
    return CallMethod(Value(s), fn, args);
  }
  if (name == "e" || name == "escape") {
    ASSIGN_OR_RETURN(std::string s, SoftStr(input));
    return Value(HtmlEscape(s));
  }
  if (name == "tojson") return ToJsonFilter(input, args);
  if (name == "join") {
    ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(fn, args, {"d", "attribute"}));
    ASSIGN_OR_RETURN(std::string sep, a.String(0, ""));
    ASSIGN_OR_RETURN(std::string attr, a.String(1, ""));
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      Value item = items[i];
      if (!attr.empty()) {
        ASSIGN_OR_RETURN(item, GetPath(item, attr));
      }
      ASSIGN_OR_RETURN(std::string s, SoftStr(item));
      if (i > 0) out += sep;
      out += s;
      if (out.size() > limits.max_bytes) return absl::ResourceExhaustedError("string too large");
    }
    return Value(std::move(out));
  }
  if (name == "first" || name == "last") {
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
    if (items.empty())
      return Value::Undefined(absl::StrCat("No ", fn, " item, sequence was empty."));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
    return ListValue(items);
  }
  if (name == "reverse") {
    if (input.is_string()) return GetSlice(input, Value(), Value(), Value(Json(-1)), limits);
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
    std::reverse(items.begin(), items.end());
    return ListValue(items);
  }
  if (name == "items") {
    if (input.is_undefined()) return Value(Json::array());
    if (!input.is_dict()) return TypeError("Can only get item pairs from a mapping.");
    return CallMethod(input, "items", CallArgs());
  }
  if (name == "dictsort") {
    ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(fn, args, {"case_sensitive", "by", "reverse"}));
    if (!input.is_dict()) return TypeError("You can only sort by either \"key\" or \"value\"");
    ASSIGN_OR_RETURN(std::string by, a.String(1, "key"));
    if (by != "key" && by != "value") {
      return TypeError("You can only sort by either \"key\" or \"value\"");
    }
    ASSIGN_OR_RETURN(Value pairs, CallMethod(input, "items", CallArgs()));
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(pairs));
    const bool cs = a.Bool(0, false), rev = a.Bool(2, false);
    const size_t pos = by == "key" ? 0 : 1;
    RETURN_IF_ERROR(SortValues(&items, [&](const Value& x, const Value& y) -> absl::StatusOr<bool> {
      Value kx = SortKey(x.Child(x.json()[pos]), cs), ky = SortKey(y.Child(y.json()[pos]), cs);
      return rev ? PythonLess(ky, kx) : PythonLess(kx, ky);
    }));
    return ListValue(items);
  }
  if (name == "sort") return SortFilter(input, args, false);
  if (name == "unique") return SortFilter(input, args, true);
  if (name == "map") return MapFilter(input, args, limits);
  if (name == "select" || name == "reject")
    return SelectOrReject(input, args, name == "select", false);
  if (name == "selectattr" || name == "rejectattr") {
    return SelectOrReject(input, args, name == "selectattr", true);
  }
  if (name == "max" || name == "min") return MinMax(input, args, name == "max");
  if (name == "sum") {
    ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(fn, args, {"attribute", "start"}));
    ASSIGN_OR_RETURN(std::string attr, a.String(0, ""));
    Value total = a.Has(1) ? *a.Get(1) : Value(Json(0));
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
    for (const Value& item : items) {
      Value v = item;
      if (!attr.empty()) {
        ASSIGN_OR_RETURN(v, GetPath(item, attr));
      }
      ASSIGN_OR_RETURN(total, BinaryOp("+", total, v, limits));
    }
    return total;
  }
  if (name == "abs") {
    if (!input.is_number())
      return TypeError(absl::StrCat("bad operand type for abs(): '", TypeName(input), "'"));
    int64_t i;
    if (AsInt64(input, &i)) {
      if (i == INT64_MIN) return absl::OutOfRangeError("integer result out of the 64-bit range");
      return Value(Json(i < 0 ? -i : i));
    }
    return Value(Json(std::fabs(AsDouble(input))));
  }
  if (name == "int") return ToInt(input, args);
  if (name == "float") return ToFloat(input, args);
  if (name == "round") return Round(input, args);
  if (name == "indent") return Indent(input, args);
  if (name == "attr") {
    ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(fn, args, {"name"}));
    ASSIGN_OR_RETURN(std::string attr, a.String(0, ""));
    if (input.is_dict() &&
        !(attr == "items" || attr == "keys" || attr == "values" || attr == "get")) {
      return Value::Undefined(absl::StrCat("'dict object' has no attribute '", attr, "'"));
    }
    return GetAttr(input, attr);
  }
  if (name == "wordcount") {
    ASSIGN_OR_RETURN(std::string s, SoftStr(input));
    int64_t n = 0;
    bool in_word = false;
    for (char32_t c : DecodeUtf8(s)) {
      const bool w = c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                     (c >= 'A' && c <= 'Z') || (c >= 0x80 && !IsPySpace(c));
      if (w && !in_word) ++n;
      in_word = w;
    }
    return Value(Json(n));
  }
  return TypeError(absl::StrCat("no filter named '", fn, "'"));
}

absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& v, const CallArgs& args) {
  auto arg = [&](const char* what) -> absl::StatusOr<Value> {
    if (args.positional.size() != 1 || !args.keyword.empty()) {
      return TypeError(absl::StrCat("test '", what, "' takes exactly one argument"));
    }
    return args.positional[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_null();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.json().get<bool>();
  if (name == "false") return v.is_bool() && !v.json().get<bool>();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") {
    return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict() ||
           (v.is_namespace() && v.ns()->is_loop);
  }
  if (name == "sequence") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return false;
  if (name == "lower" || name == "upper") {
    ASSIGN_OR_RETURN(std::string s, SoftStr(v));
    ASSIGN_OR_RETURN(Value r,
                     CallMethod(Value(s), name == "lower" ? "islower" : "isupper", CallArgs()));
    return Truthy(r);
  }
  if (name == "even" || name == "odd" || name == "divisibleby") {
    int64_t i;
    if (!AsInt64(v, &i)) {
      if (v.is_float() && name != "divisibleby") {
        const double d = v.json().get<double>();
        return std::fmod(std::fabs(d), 2.0) == (name == "even" ? 0.0 : 1.0);
      }
      if (!v.is_float()) {
        return TypeError(
            absl::StrCat("test '", std::string(name), "' needs a number, not ", TypeName(v)));
      }
    }
    if (name == "even") return i % 2 == 0;
    if (name == "odd") return i % 2 != 0;
    ASSIGN_OR_RETURN(Value d, arg("divisibleby"));
    ASSIGN_OR_RETURN(Value m, BinaryOp("%", v, d, Limits()));
    return !Truthy(m);
  }
  if (name == "sameas") {
    ASSIGN_OR_RETURN(Value o, arg("sameas"));
    if (v.is_null() || o.is_null()) return v.is_null() && o.is_null();
    if (v.is_bool() || o.is_bool()) return v.is_bool() && o.is_bool() && PythonEquals(v, o);
    if (v.is_json() && o.is_json()) return &v.json() == &o.json();
    return PythonEquals(v, o) && !v.is_undefined();
  }
  if (name == "in") {
    ASSIGN_OR_RETURN(Value o, arg("in"));
    return Contains(o, v);
  }
  ASSIGN_OR_RETURN(Value o, arg("comparison"));
  if (name == "eq" || name == "equalto" || name == "==") return PythonEquals(v, o);
  if (name == "ne" || name == "!=") return !PythonEquals(v, o);
  if (name == "lt" || name == "lessthan" || name == "<") return PythonLess(v, o);
  if (name == "gt" || name == "greaterthan" || name == ">") return PythonLess(o, v);
  if (name == "le" || name == "<=") {
    ASSIGN_OR_RETURN(bool gt, PythonLess(o, v));
    return !gt;
  }
  if (name == "ge" || name == ">=") {
    ASSIGN_OR_RETURN(bool lt, PythonLess(v, o));
    return !lt;
  }
  return TypeError(absl::StrCat("no test named '", std::string(name), "'"));
}

Value GlobalRange(const Limits& limits) {
  return Value::Function("range", [limits](CallArgs& call) -> absl::StatusOr<Value> {
    if (!call.keyword.empty()) return TypeError("range() takes no keyword arguments");
    std::vector<int64_t> n;
    for (const Value& v : call.positional) {
      int64_t i;
      if (!AsInt64(v, &i)) {
        return TypeError(
            absl::StrCat("'", TypeName(v), "' object cannot be interpreted as an integer"));
      }
      n.push_back(i);
    }
    int64_t start = 0, stop = 0, step = 1;
    if (n.size() == 1) {
      stop = n[0];
    } else if (n.size() == 2 || n.size() == 3) {
      start = n[0];
      stop = n[1];
      if (n.size() == 3) step = n[2];
    } else {
      return TypeError(absl::StrCat("range expected 1 to 3 arguments, got ", n.size()));
    }
    if (step == 0) return TypeError("range() arg 3 must not be zero");
    const __int128 span =
        step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
    const __int128 abs_step = step > 0 ? step : -static_cast<__int128>(step);
    const __int128 count = span <= 0 ? 0 : (span + abs_step - 1) / abs_step;
    if (count > static_cast<__int128>(limits.max_items)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("range() larger than the limit of ", limits.max_items, " items"));
    }
    Json out = Json::array();
    for (__int128 i = 0; i < count; ++i) out.push_back(static_cast<int64_t>(start + i * step));
    return Value(std::move(out));
  });
}

Value GlobalNamespace(std::vector<std::shared_ptr<NamespaceData>>* created) {
  return Value::Function("namespace", [created](CallArgs& call) -> absl::StatusOr<Value> {
    auto ns = std::make_shared<NamespaceData>();
    created->push_back(ns);
    for (const Value& v : call.positional) {
      if (!v.is_dict()) return TypeError("namespace() takes only mappings as positional arguments");
      for (auto it = v.json().begin(); it != v.json().end(); ++it) {
        if (Value* old = ns->Find(it.key())) {
          *old = v.Child(it.value());
        } else {
          ns->attrs.emplace_back(it.key(), v.Child(it.value()));
        }
      }
    }
    for (const auto& [k, v] : call.keyword) {
      if (Value* old = ns->Find(k)) {
        *old = v;
      } else {
        ns->attrs.emplace_back(k, v);
      }
    }
    return Value::Namespace(std::move(ns));
  });
}

Value GlobalDict() {
  return Value::Function("dict", [](CallArgs& call) -> absl::StatusOr<Value> {
    Json out = Json::object();
    for (const Value& v : call.positional) {
      if (!v.is_dict()) return TypeError("dict() takes only a mapping as positional argument");
      for (auto it = v.json().begin(); it != v.json().end(); ++it) out[it.key()] = it.value();
    }
    for (const auto& [k, v] : call.keyword) out[k] = ToJsonLoose(v);
    return Value(std::move(out));
  });
}

}  // namespace tandem::jinja
