// The string and number filters of the Jinja subset that have functions of
// their own (escape, indent, tojson, round, int, float); the dispatch is
// ApplyFilter in builtins.cc.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/chat/internal/builtins_internal.h"
#include "common/chat/internal/py_string.h"

namespace tandem::jinja::internal {

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

}  // namespace tandem::jinja::internal
