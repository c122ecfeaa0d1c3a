#include "common/chat/internal/builtins.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/chat/internal/py_string.h"

namespace tandem::jinja {
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

absl::Status TypeError(absl::string_view msg) {
  return absl::InvalidArgumentError(std::string(msg));
}

absl::StatusOr<std::string> SoftStr(const Value& v) { return ToPythonStr(v); }

// Jinja2's make_attrgetter: "a.b.0" looked up part by part with getitem.
absl::StatusOr<Value> GetPath(const Value& item, const std::string& path) {
  Value cur = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
    bool digits = !part.empty();
    for (char c : part) digits = digits && c >= '0' && c <= '9';
    Value key = digits && part.size() < 18 ? Value(Json(std::stoll(part))) : Value(part);
    ASSIGN_OR_RETURN(cur, GetItem(cur, key));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// Merge sort: never reads out of bounds, whatever the comparator answers.
absl::Status SortValues(
    std::vector<Value>* v,
    const std::function<absl::StatusOr<bool>(const Value&, const Value&)>& less) {
  if (v->size() < 2) return absl::OkStatus();
  std::vector<Value> left(v->begin(), v->begin() + v->size() / 2);
  std::vector<Value> right(v->begin() + v->size() / 2, v->end());
  RETURN_IF_ERROR(SortValues(&left, less));
  RETURN_IF_ERROR(SortValues(&right, less));
  size_t i = 0, j = 0, k = 0;
  while (i < left.size() && j < right.size()) {
    ASSIGN_OR_RETURN(bool r_first, less(right[j], left[i]));
    (*v)[k++] = r_first ? right[j++] : left[i++];
  }
  while (i < left.size()) (*v)[k++] = left[i++];
  while (j < right.size()) (*v)[k++] = right[j++];
  return absl::OkStatus();
}

// Sort key: lower-cased strings unless case sensitive (Jinja2's ignore_case).
Value SortKey(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(AsciiLower(v.str()));
  return v;
}

Value ListValue(const std::vector<Value>& items) {
  Json out = Json::array();
  for (const Value& v : items) out.push_back(ToJsonLoose(v));
  return Value(std::move(out));
}

absl::StatusOr<Value> CallMethod(const Value& obj, const std::string& name, CallArgs args) {
  ASSIGN_OR_RETURN(Value m, GetAttr(obj, name));
  if (!m.is_callable()) return TypeError(absl::StrCat("no method ", name));
  return m.callable().fn(args);
}

std::string HtmlEscape(absl::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// select / reject / selectattr / rejectattr.
absl::StatusOr<Value> SelectOrReject(const Value& input, const CallArgs& args, bool select,
                                     bool by_attr) {
  size_t next = 0;
  std::string attr;
  if (by_attr) {
    if (args.positional.empty() || !args.positional[0].is_string()) {
      return TypeError("selectattr/rejectattr need an attribute name");
    }
    attr = args.positional[0].str();
    next = 1;
  }
  std::optional<std::string> test;
  CallArgs test_args;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) return TypeError("the test name must be a string");
    test = args.positional[next].str();
    if (!IsKnownTest(*test)) return TypeError(absl::StrCat("no test named '", *test, "'"));
    test_args.positional.assign(args.positional.begin() + next + 1, args.positional.end());
  }
  test_args.keyword = args.keyword;
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
  std::vector<Value> kept;
  for (const Value& item : items) {
    Value subject = item;
    if (by_attr) {
      ASSIGN_OR_RETURN(subject, GetPath(item, attr));
    }
    bool ok;
    if (test.has_value()) {
      ASSIGN_OR_RETURN(ok, ApplyTest(*test, subject, test_args));
    } else {
      ok = Truthy(subject);
    }
    if (ok == select) kept.push_back(item);
  }
  return ListValue(kept);
}

absl::StatusOr<Value> MinMax(const Value& input, const CallArgs& args, bool want_max) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind(want_max ? "max" : "min", args,
                                                {"case_sensitive", "attribute"}));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  const bool cs = a.Bool(0, false);
  ASSIGN_OR_RETURN(std::string attr, a.String(1, ""));
  auto key = [&](const Value& v) -> absl::StatusOr<Value> {
    Value k = v;
    if (!attr.empty()) {
      ASSIGN_OR_RETURN(k, GetPath(v, attr));
    }
    return SortKey(k, cs);
  };
  Value best = items[0];
  ASSIGN_OR_RETURN(Value best_key, key(best));
  for (size_t i = 1; i < items.size(); ++i) {
    ASSIGN_OR_RETURN(Value k, key(items[i]));
    ASSIGN_OR_RETURN(bool better, want_max ? PythonLess(best_key, k) : PythonLess(k, best_key));
    if (better) {
      best = items[i];
      best_key = k;
    }
  }
  return best;
}

absl::StatusOr<Value> Indent(const Value& input, const CallArgs& args) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("indent", args, {"width", "first", "blank"}));
  std::string pad = "    ";
  if (a.Has(0)) {
    if (a.Get(0)->is_string()) {
      pad = a.Get(0)->str();
    } else {
      ASSIGN_OR_RETURN(int64_t w, a.Int(0, 4));
      pad = std::string(static_cast<size_t>(std::clamp<int64_t>(w, 0, 1024)), ' ');
    }
  }
  ASSIGN_OR_RETURN(std::string s, SoftStr(input));
  s += "\n";
  std::vector<std::string> lines;
  size_t b = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n' || s[i] == '\r') {
      lines.push_back(s.substr(b, i - b));
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      b = i + 1;
    }
  }
  std::string out;
  if (a.Bool(2, false)) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) {
        out += '\n';
        out += pad;
      }
      out += lines[i];
    }
  } else {
    out = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      out += '\n';
      if (!lines[i].empty()) out += pad;
      out += lines[i];
    }
  }
  if (a.Bool(1, false)) out = pad + out;
  return Value(std::move(out));
}

absl::StatusOr<Value> ToJsonFilter(const Value& input, const CallArgs& args) {
  ASSIGN_OR_RETURN(
      BoundArgs a,
      BoundArgs::Bind("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"}));
  JsonDumpOptions o;
  o.ensure_ascii = a.Bool(0, false);
  if (a.Has(1) && !a.Get(1)->is_null()) {
    ASSIGN_OR_RETURN(int64_t indent, a.Int(1, -1));
    o.indent = static_cast<int>(std::clamp<int64_t>(indent, 0, 64));
  }
  if (a.Has(2) && !a.Get(2)->is_null()) {
    const Value& sep = *a.Get(2);
    if (!sep.is_list() || sep.json().size() != 2 || !sep.json()[0].is_string() ||
        !sep.json()[1].is_string()) {
      return TypeError("tojson(): separators must be an (item, key) pair of strings");
    }
    o.has_separators = true;
    o.item_separator = sep.json()[0].get<std::string>();
    o.key_separator = sep.json()[1].get<std::string>();
  }
  o.sort_keys = a.Bool(3, false);
  ASSIGN_OR_RETURN(std::string out, PythonJsonDumps(input, o));
  return Value(std::move(out));
}

absl::StatusOr<Value> Round(const Value& input, const CallArgs& args) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("round", args, {"precision", "method"}));
  ASSIGN_OR_RETURN(int64_t precision, a.Int(0, 0));
  ASSIGN_OR_RETURN(std::string method, a.String(1, "common"));
  if (!input.is_number()) return TypeError(absl::StrCat("round() of ", TypeName(input)));
  int64_t i;
  if (method == "common" && AsInt64(input, &i) && precision >= 0) return Value(Json(i));
  const double scale =
      std::pow(10.0, static_cast<double>(std::clamp<int64_t>(precision, -300, 300)));
  const double x = AsDouble(input) * scale;
  double r;
  if (method == "common") {
    r = std::nearbyint(x);  // round half to even, as Python's round()
  } else if (method == "ceil") {
    r = std::ceil(x);
  } else if (method == "floor") {
    r = std::floor(x);
  } else {
    return TypeError("method must be common, ceil or floor");
  }
  return Value(Json(r / scale));
}

absl::StatusOr<Value> ToInt(const Value& input, const CallArgs& args) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("int", args, {"default", "base"}));
  const Value fallback = a.Has(0) ? *a.Get(0) : Value(Json(0));
  ASSIGN_OR_RETURN(int64_t base, a.Int(1, 10));
  int64_t i;
  if (AsInt64(input, &i)) return Value(Json(i));
  if (input.is_float()) {
    const double d = input.json().get<double>();
    if (!std::isfinite(d) || std::fabs(d) > 9.2e18) return fallback;
    return Value(Json(static_cast<int64_t>(d)));
  }
  if (input.is_string()) {
    const std::string s = PyStrip(input.str(), std::nullopt, true, true);
    if (base < 2 || base > 36) return fallback;
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, static_cast<int>(base));
    if (!s.empty() && end == s.c_str() + s.size() && errno == 0) return Value(Json(int64_t{v}));
    char* fend = nullptr;
    const double d = std::strtod(s.c_str(), &fend);
    if (!s.empty() && fend == s.c_str() + s.size() && std::isfinite(d) && std::fabs(d) < 9.2e18) {
      return Value(Json(static_cast<int64_t>(d)));
    }
  }
  return fallback;
}

absl::StatusOr<Value> ToFloat(const Value& input, const CallArgs& args) {
  ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("float", args, {"default"}));
  const Value fallback = a.Has(0) ? *a.Get(0) : Value(Json(0.0));
  if (input.is_number()) return Value(Json(AsDouble(input)));
  if (input.is_string()) {
    const std::string s = PyStrip(input.str(), std::nullopt, true, true);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) return Value(Json(d));
  }
  return fallback;
}

absl::StatusOr<Value> SortFilter(const Value& input, const CallArgs& args, bool unique) {
  ASSIGN_OR_RETURN(BoundArgs a,
                   unique
                       ? BoundArgs::Bind("unique", args, {"case_sensitive", "attribute"})
                       : BoundArgs::Bind("sort", args, {"reverse", "case_sensitive", "attribute"}));
  const size_t base = unique ? 0 : 1;
  const bool reverse = unique ? false : a.Bool(0, false);
  const bool cs = a.Bool(base, false);
  ASSIGN_OR_RETURN(std::string attr, a.String(base + 1, ""));
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
  auto key = [&](const Value& v) -> absl::StatusOr<Value> {
    Value k = v;
    if (!attr.empty()) {
      ASSIGN_OR_RETURN(k, GetPath(v, attr));
    }
    return SortKey(k, cs);
  };
  if (unique) {
    std::vector<Value> kept, keys;
    for (const Value& v : items) {
      ASSIGN_OR_RETURN(Value k, key(v));
      bool seen = false;
      for (const Value& s : keys) seen = seen || PythonEquals(s, k);
      if (!seen) {
        kept.push_back(v);
        keys.push_back(k);
      }
    }
    return ListValue(kept);
  }
  RETURN_IF_ERROR(SortValues(&items, [&](const Value& x, const Value& y) -> absl::StatusOr<bool> {
    ASSIGN_OR_RETURN(Value kx, key(x));
    ASSIGN_OR_RETURN(Value ky, key(y));
    return reverse ? PythonLess(ky, kx) : PythonLess(kx, ky);
  }));
  return ListValue(items);
}

absl::StatusOr<Value> MapFilter(const Value& input, const CallArgs& args, const Limits& limits) {
  ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
  std::vector<Value> out;
  if (args.positional.empty()) {
    std::string attr;
    std::optional<Value> fallback;
    for (const auto& [k, v] : args.keyword) {
      if (k == "attribute" && v.is_string()) {
        attr = v.str();
      } else if (k == "default") {
        fallback = v;
      } else {
        return TypeError(absl::StrCat("map() got an unexpected keyword argument '", k, "'"));
      }
    }
    if (attr.empty()) return TypeError("map() needs a filter name or attribute=");
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value v, GetPath(item, attr));
      out.push_back(v.is_undefined() && fallback.has_value() ? *fallback : v);
    }
    return ListValue(out);
  }
  if (!args.positional[0].is_string()) return TypeError("map(): the filter name must be a string");
  const std::string filter = args.positional[0].str();
  if (!IsKnownFilter(filter)) return TypeError(absl::StrCat("no filter named '", filter, "'"));
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : items) {
    ASSIGN_OR_RETURN(Value v, ApplyFilter(filter, item, rest, limits));
    out.push_back(v);
  }
  return ListValue(out);
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
