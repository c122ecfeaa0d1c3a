#include "common/chat/internal/operators.h"

#include <cmath>
#include <limits>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/chat/internal/py_string.h"

namespace tandem::jinja {
namespace {

absl::Status TypeError(absl::string_view msg) {
  return absl::InvalidArgumentError(std::string(msg));
}

absl::Status TooBig(const Limits& limits) {
  return absl::ResourceExhaustedError(
      absl::StrCat("value larger than the limit of ", limits.max_bytes, " bytes"));
}

bool IsMutatingMethod(const Value& obj, absl::string_view name) {
  static constexpr absl::string_view kList[] = {"append", "clear",  "extend",  "insert",
                                                "pop",    "remove", "reverse", "sort"};
  static constexpr absl::string_view kDict[] = {"clear", "pop", "popitem", "setdefault", "update"};
  if (obj.is_list()) {
    for (auto m : kList) {
      if (m == name) return true;
    }
  }
  if (obj.is_dict()) {
    for (auto m : kDict) {
      if (m == name) return true;
    }
  }
  return false;
}

bool IsStrMethod(absl::string_view n) {
  static constexpr absl::string_view kNames[] = {
      "strip",   "lstrip",       "rstrip",       "split",      "rsplit",  "startswith", "endswith",
      "upper",   "lower",        "title",        "capitalize", "replace", "find",       "rfind",
      "count",   "join",         "isdigit",      "isalpha",    "isalnum", "isspace",    "isupper",
      "islower", "removeprefix", "removesuffix", "splitlines", "index"};
  for (auto m : kNames) {
    if (m == n) return true;
  }
  return false;
}

absl::StatusOr<Value> CallStrMethod(const std::string& s, const std::string& name, CallArgs& call) {
  const std::string fn = "str." + name;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(fn, call, {"chars"}));
    std::optional<std::string> chars;
    if (a.Has(0) && !a.Get(0)->is_null()) {
      ASSIGN_OR_RETURN(chars, a.String(0, ""));
    }
    return Value(PyStrip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(fn, call, {"sep", "maxsplit"}));
    std::optional<std::string> sep;
    if (a.Has(0) && !a.Get(0)->is_null()) {
      ASSIGN_OR_RETURN(sep, a.String(0, ""));
      if (sep->empty()) return TypeError("empty separator");
    }
    ASSIGN_OR_RETURN(int64_t maxsplit, a.Int(1, -1));
    Json out = Json::array();
    for (std::string& p : PySplit(s, sep, maxsplit, name == "rsplit")) out.push_back(std::move(p));
    return Value(std::move(out));
  }
  if (name == "splitlines") {
    ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(fn, call, {"keepends"}));
    Json out = Json::array();
    size_t b = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\n' || s[i] == '\r') {
        size_t e = i;
        if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
        out.push_back(s.substr(b, (a.Bool(0, false) ? i + 1 : e) - b));
        b = i + 1;
      }
    }
    if (b < s.size()) out.push_back(s.substr(b));
    return Value(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(fn, call, {"prefix"}));
    if (!a.Has(0)) return TypeError(absl::StrCat(fn, "() takes at least 1 argument"));
    std::vector<std::string> options;
    if (a.Get(0)->is_list()) {
      for (const Json& j : a.Get(0)->json()) {
        if (!j.is_string()) return TypeError(absl::StrCat(fn, "() needs str arguments"));
        options.push_back(j.get<std::string>());
      }
    } else {
      ASSIGN_OR_RETURN(std::string p, a.String(0, ""));
      options.push_back(std::move(p));
    }
    for (const std::string& p : options) {
      if (name == "startswith" ? absl::StartsWith(s, p) : absl::EndsWith(s, p)) {
        return Value(Json(true));
      }
    }
    return Value(Json(false));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(fn, call, {}));
    if (name == "upper") return Value(AsciiUpper(s));
    if (name == "lower") return Value(AsciiLower(s));
    if (name == "title") return Value(PyTitle(s));
    return Value(PyCapitalize(s));
  }
  if (name == "replace") {
    ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(fn, call, {"old", "new", "count"}));
    ASSIGN_OR_RETURN(std::string from, a.String(0, ""));
    ASSIGN_OR_RETURN(std::string to, a.String(1, ""));
    ASSIGN_OR_RETURN(int64_t count, a.Int(2, -1));
    if (!a.Has(0) || !a.Has(1)) return TypeError("str.replace() takes at least 2 arguments");
    std::string out;
    if (from.empty()) {
      const std::u32string text = DecodeUtf8(s);
      int64_t n = 0;
      for (char32_t c : text) {
        if (count < 0 || n < count) {
          out += to;
          ++n;
        }
        AppendUtf8(c, &out);
      }
      if (count < 0 || n < count) out += to;
    } else {
      size_t pos = 0;
      int64_t n = 0;
      while (count < 0 || n < count) {
        const size_t hit = s.find(from, pos);
        if (hit == std::string::npos) break;
        out.append(s, pos, hit - pos);
        out += to;
        pos = hit + from.size();
        ++n;
        if (out.size() > (64u << 20)) return absl::ResourceExhaustedError("string too large");
      }
      out.append(s, pos, std::string::npos);
    }
    return Value(std::move(out));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "count") {
    ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(fn, call, {"sub"}));
    ASSIGN_OR_RETURN(std::string sub, a.String(0, ""));
    if (!a.Has(0)) return TypeError(absl::StrCat(fn, "() takes exactly 1 argument"));
    if (name == "count") {
      if (sub.empty()) return Value(Json(Utf8Length(s) + 1));
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value(Json(n));
    }
    const size_t p = name == "rfind" ? s.rfind(sub) : s.find(sub);
    if (p == std::string::npos) {
      if (name == "index") return TypeError("substring not found");
      return Value(Json(-1));
    }
    return Value(Json(Utf8Length(absl::string_view(s).substr(0, p))));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(fn, call, {"affix"}));
    ASSIGN_OR_RETURN(std::string affix, a.String(0, ""));
    if (name == "removeprefix" && absl::StartsWith(s, affix)) return Value(s.substr(affix.size()));
    if (name == "removesuffix" && absl::EndsWith(s, affix)) {
      return Value(s.substr(0, s.size() - affix.size()));
    }
    return Value(s);
  }
  if (name == "join") {
    ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(fn, call, {"iterable"}));
    if (!a.Has(0)) return TypeError("str.join() takes exactly one argument");
    ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(*a.Get(0)));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        return TypeError(absl::StrCat("sequence item ", i, ": expected str instance, ",
                                      TypeName(items[i]), " found"));
      }
      if (i > 0) out += s;
      out += items[i].str();
    }
    return Value(std::move(out));
  }
  // is* predicates (ASCII classes; Python's are Unicode-wide).
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(fn, call, {}));
  if (s.empty()) return Value(Json(false));
  bool all = true, any_cased = false;
  for (char c : s) {
    const bool digit = c >= '0' && c <= '9';
    const bool up = c >= 'A' && c <= 'Z', low = c >= 'a' && c <= 'z';
    if (up || low) any_cased = true;
    if (name == "isdigit") all &= digit;
    if (name == "isalpha") all &= up || low;
    if (name == "isalnum") all &= up || low || digit;
    if (name == "isspace") all &= IsPySpace(static_cast<unsigned char>(c));
    if (name == "isupper") all &= !low;
    if (name == "islower") all &= !up;
  }
  if (name == "isupper" || name == "islower") all = all && any_cased;
  return Value(Json(all));
}

absl::StatusOr<Value> CallDictMethod(const Value& obj, const std::string& name, CallArgs& call) {
  const std::string fn = "dict." + name;
  const Json& d = obj.json();
  if (name == "get") {
    ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(fn, call, {"key", "default"}));
    if (!a.Has(0)) return TypeError("get expected at least 1 argument, got 0");
    if (a.Get(0)->is_string()) {
      auto it = d.find(a.Get(0)->str());
      if (it != d.end()) return obj.Child(*it);
    }
    return a.Has(1) ? *a.Get(1) : Value(Json(nullptr));
  }
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(fn, call, {}));
  Json out = Json::array();
  for (auto it = d.begin(); it != d.end(); ++it) {
    if (name == "keys") {
      out.push_back(it.key());
    } else if (name == "values") {
      out.push_back(it.value());
    } else {
      out.push_back(Json::array({it.key(), it.value()}));
    }
  }
  return Value(std::move(out));
}

absl::StatusOr<Value> CallListMethod(const Value& obj, const std::string& name, CallArgs& call) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("list." + name, call, {"value"}));
  if (!a.Has(0)) return TypeError(absl::StrCat("list.", name, "() takes exactly one argument"));
  int64_t n = 0, index = -1, i = 0;
  for (const Json& item : obj.json()) {
    if (PythonEquals(obj.Child(item), *a.Get(0))) {
      ++n;
      if (index < 0) index = i;
    }
    ++i;
  }
  if (name == "count") return Value(Json(n));
  if (index < 0) return TypeError("list.index(x): x not in list");
  return Value(Json(index));
}

Value Method(const Value& obj, const std::string& name) {
  return Value::Function(absl::StrCat(TypeName(obj), ".", name),
                         [obj, name](CallArgs& call) -> absl::StatusOr<Value> {
                           if (obj.is_string()) return CallStrMethod(obj.str(), name, call);
                           if (obj.is_dict()) return CallDictMethod(obj, name, call);
                           return CallListMethod(obj, name, call);
                         });
}

}  // namespace

absl::StatusOr<BoundArgs> BoundArgs::Bind(absl::string_view fn, const CallArgs& args,
                                          std::vector<std::string> params) {
  BoundArgs b;
  b.fn_ = std::string(fn);
  b.values_.resize(params.size());
  b.given_.assign(params.size(), false);
  if (args.positional.size() > params.size()) {
    return TypeError(absl::StrCat(fn, "() takes at most ", params.size(), " argument(s) (",
                                  args.positional.size(), " given)"));
  }
  for (size_t i = 0; i < args.positional.size(); ++i) {
    b.values_[i] = args.positional[i];
    b.given_[i] = true;
  }
  for (const auto& [key, value] : args.keyword) {
    size_t i = 0;
    while (i < params.size() && params[i] != key) ++i;
    if (i == params.size()) {
      return TypeError(absl::StrCat(fn, "() got an unexpected keyword argument '", key, "'"));
    }
    if (b.given_[i]) {
      return TypeError(absl::StrCat(fn, "() got multiple values for argument '", key, "'"));
    }
    b.values_[i] = value;
    b.given_[i] = true;
  }
  b.params_ = std::move(params);
  return b;
}

absl::StatusOr<std::string> BoundArgs::String(size_t i, std::string fallback) const {
  if (!given_[i]) return fallback;
  if (!values_[i].is_string()) {
    return TypeError(absl::StrCat(fn_, "(): argument '", params_[i], "' must be str, not ",
                                  TypeName(values_[i])));
  }
  return values_[i].str();
}

absl::StatusOr<int64_t> BoundArgs::Int(size_t i, int64_t fallback) const {
  if (!given_[i]) return fallback;
  int64_t v;
  if (!AsInt64(values_[i], &v)) {
    return TypeError(absl::StrCat(fn_, "(): argument '", params_[i], "' must be int, not ",
                                  TypeName(values_[i])));
  }
  return v;
}

bool BoundArgs::Bool(size_t i, bool fallback) const {
  return given_[i] ? Truthy(values_[i]) : fallback;
}

absl::Status UndefinedError(const Value& v) {
  return absl::InvalidArgumentError(v.undefined_hint().empty() ? "value is undefined"
                                                               : v.undefined_hint());
}

absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (obj.is_namespace()) {
    if (Value* v = obj.ns()->Find(name)) return *v;
    return Value::Undefined(
        absl::StrCat("'", TypeName(obj), " object' has no attribute '", name, "'"));
  }
  if (obj.is_json()) {
    if (IsMutatingMethod(obj, name)) {
      return Value::Undefined(absl::StrCat("access to attribute '", name, "' of '", TypeName(obj),
                                           "' object is unsafe"));
    }
    if (obj.is_string() && IsStrMethod(name)) return Method(obj, name);
    if (obj.is_dict() && (name == "items" || name == "keys" || name == "values" || name == "get")) {
      return Method(obj, name);
    }
    if (obj.is_list() && (name == "index" || name == "count")) return Method(obj, name);
    if (obj.is_dict()) {
      auto it = obj.json().find(name);
      if (it != obj.json().end()) return obj.Child(*it);
    }
  }
  return Value::Undefined(
      absl::StrCat("'", TypeName(obj), " object' has no attribute '", name, "'"));
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return UndefinedError(obj);
  int64_t index;
  if (obj.is_list() && AsInt64(key, &index)) {
    const int64_t n = static_cast<int64_t>(obj.json().size());
    if (index < 0) index += n;
    if (index >= 0 && index < n) return obj.Child(obj.json()[index]);
    return Value::Undefined(absl::StrCat("list object has no element ", index));
  }
  if (obj.is_string() && AsInt64(key, &index)) {
    const std::u32string text = DecodeUtf8(obj.str());
    const int64_t n = static_cast<int64_t>(text.size());
    if (index < 0) index += n;
    if (index >= 0 && index < n) return Value(EncodeUtf8(text.substr(index, 1)));
    return Value::Undefined(absl::StrCat("str object has no element ", index));
  }
  if (obj.is_dict() && key.is_string()) {
    auto it = obj.json().find(key.str());
    if (it != obj.json().end()) return obj.Child(*it);
    return Value::Undefined(absl::StrCat("'dict object' has no attribute '", key.str(), "'"));
  }
  if (key.is_string()) return GetAttr(obj, key.str());
  absl::StatusOr<std::string> k = ToPythonRepr(key);
  return Value::Undefined(
      absl::StrCat("'", TypeName(obj), " object' has no element ", k.ok() ? *k : std::string("?")));
}

absl::StatusOr<Value> GetSlice(const Value& obj, const Value& start, const Value& stop,
                               const Value& step, const Limits& limits) {
  if (obj.is_undefined()) return UndefinedError(obj);
  auto bound = [](const Value& v, std::optional<int64_t>* out) -> absl::Status {
    if (v.is_undefined() || v.is_null()) return absl::OkStatus();
    int64_t i;
    if (!AsInt64(v, &i)) {
      return TypeError("slice indices must be integers or None");
    }
    *out = i;
    return absl::OkStatus();
  };
  std::optional<int64_t> b, e, s;
  RETURN_IF_ERROR(bound(start, &b));
  RETURN_IF_ERROR(bound(stop, &e));
  RETURN_IF_ERROR(bound(step, &s));
  if (s.has_value() && *s == 0) return TypeError("slice step cannot be zero");
  if (s.has_value() && *s == std::numeric_limits<int64_t>::min()) s = -INT64_MAX;
  if (obj.is_list()) {
    const Json& l = obj.json();
    Json out = Json::array();
    for (int64_t i : SliceIndices(static_cast<int64_t>(l.size()), b, e, s)) out.push_back(l[i]);
    return Value(std::move(out));
  }
  if (obj.is_string()) {
    const std::u32string text = DecodeUtf8(obj.str());
    std::u32string out;
    for (int64_t i : SliceIndices(static_cast<int64_t>(text.size()), b, e, s)) {
      out.push_back(text[i]);
    }
    return Value(EncodeUtf8(out));
  }
  (void)limits;
  return TypeError(absl::StrCat("'", TypeName(obj), "' object is not subscriptable"));
}

absl::StatusOr<std::vector<Value>> Iterate(const Value& v) {
  std::vector<Value> out;
  if (v.is_undefined()) return out;
  if (v.is_namespace() && v.ns()->is_loop) return TypeError("'LoopContext' object is not iterable");
  if (v.is_list()) {
    out.reserve(v.json().size());
    for (const Json& j : v.json()) out.push_back(v.Child(j));
    return out;
  }
  if (v.is_dict()) {
    for (auto it = v.json().begin(); it != v.json().end(); ++it) out.push_back(Value(it.key()));
    return out;
  }
  if (v.is_string()) {
    for (char32_t c : DecodeUtf8(v.str())) {
      std::string s;
      AppendUtf8(c, &s);
      out.push_back(Value(std::move(s)));
    }
    return out;
  }
  return TypeError(absl::StrCat("'", TypeName(v), "' object is not iterable"));
}

absl::StatusOr<int64_t> Length(const Value& v) {
  if (v.is_undefined()) return 0;
  if (v.is_string()) return Utf8Length(v.str());
  if (v.is_list() || v.is_dict()) return static_cast<int64_t>(v.json().size());
  return TypeError(absl::StrCat("object of type '", TypeName(v), "' has no len()"));
}

absl::StatusOr<bool> Contains(const Value& haystack, const Value& needle) {
  if (haystack.is_undefined()) return false;
  if (haystack.is_string()) {
    if (!needle.is_string()) {
      return TypeError(
          absl::StrCat("'in <string>' requires string as left operand, not ", TypeName(needle)));
    }
    return haystack.str().find(needle.str()) != std::string::npos;
  }
  if (haystack.is_list()) {
    for (const Json& j : haystack.json()) {
      if (PythonEquals(haystack.Child(j), needle)) return true;
    }
    return false;
  }
  if (haystack.is_dict()) {
    if (!needle.is_string()) return false;
    return haystack.json().contains(needle.str());
  }
  if (haystack.is_namespace()) return TypeError("argument of type 'Namespace' is not iterable");
  return TypeError(absl::StrCat("argument of type '", TypeName(haystack), "' is not iterable"));
}

absl::StatusOr<std::string> ToStr(const Value& v) { return ToPythonStr(v); }

namespace {

absl::Status Unsupported(absl::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  return TypeError(absl::StrCat("unsupported operand type(s) for ", op, ": '", TypeName(a),
                                "' and '", TypeName(b), "'"));
}

Value IntOrOverflow(__int128 v, bool* overflow) {
  if (v > std::numeric_limits<int64_t>::max() || v < std::numeric_limits<int64_t>::min()) {
    *overflow = true;
    return Value();
  }
  return Value(Json(static_cast<int64_t>(v)));
}

}  // namespace

absl::StatusOr<Value> BinaryOp(absl::string_view op, const Value& a, const Value& b,
                               const Limits& limits) {
  if (a.is_undefined() || b.is_undefined()) return Unsupported(op, a, b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (a.str().size() + b.str().size() > limits.max_bytes) return TooBig(limits);
      return Value(a.str() + b.str());
    }
    if (a.is_list() && b.is_list()) {
      if (a.json().size() + b.json().size() > limits.max_items) return TooBig(limits);
      Json out = a.json();
      for (const Json& j : b.json()) out.push_back(j);
      return Value(std::move(out));
    }
  }
  if (op == "*") {
    const Value* seq = a.is_string() || a.is_list()   ? &a
                       : b.is_string() || b.is_list() ? &b
                                                      : nullptr;
    const Value* count = seq == &a ? &b : &a;
    int64_t n;
    if (seq != nullptr && AsInt64(*count, &n)) {
      if (n <= 0) return seq->is_string() ? Value(std::string()) : Value(Json::array());
      if (seq->is_string()) {
        if (static_cast<double>(seq->str().size()) * n > limits.max_bytes) return TooBig(limits);
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq->str();
        return Value(std::move(out));
      }
      if (static_cast<double>(seq->json().size()) * n > limits.max_items) return TooBig(limits);
      Json out = Json::array();
      for (int64_t i = 0; i < n; ++i) {
        for (const Json& j : seq->json()) out.push_back(j);
      }
      return Value(std::move(out));
    }
  }
  if (!a.is_number() || !b.is_number()) return Unsupported(op, a, b);
  int64_t x, y;
  const bool ints = AsInt64(a, &x) && AsInt64(b, &y);
  if (ints && op != "/") {
    bool overflow = false;
    Value r;
    if (op == "+") {
      r = IntOrOverflow(static_cast<__int128>(x) + y, &overflow);
    } else if (op == "-") {
      r = IntOrOverflow(static_cast<__int128>(x) - y, &overflow);
    } else if (op == "*") {
      r = IntOrOverflow(static_cast<__int128>(x) * y, &overflow);
    } else if (op == "//" || op == "%") {
      if (y == 0) return TypeError("integer division or modulo by zero");
      __int128 q = static_cast<__int128>(x) / y;
      __int128 m = static_cast<__int128>(x) % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      r = IntOrOverflow(op == "//" ? q : m, &overflow);
    } else if (op == "**") {
      if (y < 0) return Value(Json(std::pow(static_cast<double>(x), static_cast<double>(y))));
      __int128 acc = 1;
      for (int64_t i = 0; i < y && !overflow; ++i) {
        acc *= x;
        if (acc > std::numeric_limits<int64_t>::max() ||
            acc < std::numeric_limits<int64_t>::min()) {
          overflow = true;
        }
        if (acc == 0 || acc == 1) break;
      }
      if (!overflow && acc == 1 && x == -1) acc = (y % 2 == 0) ? 1 : -1;
      if (!overflow) r = Value(Json(static_cast<int64_t>(acc)));
    } else {
      return TypeError(absl::StrCat("unknown operator ", op));
    }
    if (overflow) return absl::OutOfRangeError("integer result out of the 64-bit range");
    return r;
  }
  const double p = AsDouble(a), q = AsDouble(b);
  if (op == "+") return Value(Json(p + q));
  if (op == "-") return Value(Json(p - q));
  if (op == "*") return Value(Json(p * q));
  if (op == "/") {
    if (q == 0) return TypeError("division by zero");
    return Value(Json(p / q));
  }
  if (op == "//" || op == "%") {
    if (q == 0) return TypeError("float division by zero");
    double m = std::fmod(p, q);
    if (m != 0 && ((m < 0) != (q < 0))) m += q;
    if (op == "%") return Value(Json(m));
    const double div = (p - m) / q;  // as CPython's float_floor_div
    double floor_div = std::floor(div);
    if (div - floor_div > 0.5) floor_div += 1.0;
    return Value(Json(floor_div));
  }
  if (op == "**") {
    if (p == 0 && q < 0) return TypeError("0.0 cannot be raised to a negative power");
    return Value(Json(std::pow(p, q)));
  }
  return TypeError(absl::StrCat("unknown operator ", op));
}

absl::StatusOr<Value> Negate(const Value& v, bool minus) {
  if (v.is_undefined()) return UndefinedError(v);
  if (!v.is_number()) {
    return TypeError(
        absl::StrCat("bad operand type for unary ", minus ? "-" : "+", ": '", TypeName(v), "'"));
  }
  int64_t i;
  if (AsInt64(v, &i)) {
    if (!minus) return Value(Json(i));
    if (i == std::numeric_limits<int64_t>::min()) {
      return absl::OutOfRangeError("integer result out of the 64-bit range");
    }
    return Value(Json(-i));
  }
  return Value(Json(minus ? -AsDouble(v) : AsDouble(v)));
}

}  // namespace tandem::jinja
