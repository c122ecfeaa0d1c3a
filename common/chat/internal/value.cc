#include "common/chat/internal/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/chat/internal/py_string.h"

namespace tandem::jinja {

Value* NamespaceData::Find(absl::string_view name) {
  for (auto& [k, v] : attrs) {
    if (k == name) return &v;
  }
  return nullptr;
}

Value Value::Undefined(std::string hint) {
  Value v;
  v.hint_ = std::move(hint);
  return v;
}

Value::Value(Json json) : kind_(Kind::kJson) {
  root_ = std::make_shared<const Json>(std::move(json));
  json_ = root_.get();
}

Value Value::Namespace(std::shared_ptr<NamespaceData> ns) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.ns_ = std::move(ns);
  return v;
}

Value Value::Function(std::string name, std::function<absl::StatusOr<Value>(CallArgs&)> fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.fn_ = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

Value Value::Child(const Json& child) const {
  Value v;
  v.kind_ = Kind::kJson;
  v.root_ = root_;
  v.json_ = &child;
  return v;
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kNamespace:
    case Value::Kind::kCallable:
      return true;
    case Value::Kind::kJson:
      break;
  }
  const Json& j = v.json();
  switch (j.type()) {
    case Json::value_t::null:
    case Json::value_t::discarded:
      return false;
    case Json::value_t::boolean:
      return j.get<bool>();
    case Json::value_t::number_integer:
      return j.get<int64_t>() != 0;
    case Json::value_t::number_unsigned:
      return j.get<uint64_t>() != 0;
    case Json::value_t::number_float:
      return j.get<double>() != 0.0;
    case Json::value_t::string:
      return !j.get_ref<const std::string&>().empty();
    case Json::value_t::array:
    case Json::value_t::object:
    case Json::value_t::binary:
      return !j.empty();
  }
  return false;
}

std::string TypeName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "undefined";
    case Value::Kind::kNamespace:
      return v.ns()->is_loop ? "LoopContext" : "Namespace";
    case Value::Kind::kCallable:
      return "function";
    case Value::Kind::kJson:
      break;
  }
  const Json& j = v.json();
  if (j.is_null()) return "NoneType";
  if (j.is_boolean()) return "bool";
  if (j.is_number_integer()) return "int";
  if (j.is_number_float()) return "float";
  if (j.is_string()) return "str";
  if (j.is_array()) return "list";
  if (j.is_object()) return "dict";
  return "object";
}

std::string FormatPythonFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // [-]d[.ddd]e[+-]XX, shortest round trip
  const size_t epos = sci.find('e');
  const int exp = std::atoi(sci.c_str() + epos + 1);
  std::string sign;
  std::string mant = sci.substr(0, epos);
  if (!mant.empty() && mant[0] == '-') {
    sign = "-";
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits.push_back(c);
  }
  const int decpt = exp + 1;
  if (decpt <= -4 || decpt > 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + ebuf;
  }
  std::string out = sign;
  if (decpt <= 0) {
    out += "0." + std::string(-decpt, '0') + digits;
  } else if (static_cast<size_t>(decpt) >= digits.size()) {
    out += digits + std::string(decpt - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, decpt) + "." + digits.substr(decpt);
  }
  return out;
}

namespace {

absl::Status TooDeep() {
  return absl::InvalidArgumentError(
      absl::StrCat("value nested deeper than ", kMaxNesting, " levels"));
}

absl::Status AppendRepr(const Value& v, bool top_str, int depth, std::string* out);

absl::Status AppendJsonRepr(const Value& owner, const Json& j, bool top_str, int depth,
                            std::string* out) {
  if (depth > kMaxNesting) return TooDeep();
  switch (j.type()) {
    case Json::value_t::null:
      *out += "None";
      return absl::OkStatus();
    case Json::value_t::boolean:
      *out += j.get<bool>() ? "True" : "False";
      return absl::OkStatus();
    case Json::value_t::number_integer:
      *out += std::to_string(j.get<int64_t>());
      return absl::OkStatus();
    case Json::value_t::number_unsigned:
      *out += std::to_string(j.get<uint64_t>());
      return absl::OkStatus();
    case Json::value_t::number_float:
      *out += FormatPythonFloat(j.get<double>());
      return absl::OkStatus();
    case Json::value_t::string:
      if (top_str) {
        *out += j.get_ref<const std::string&>();
      } else {
        *out += PyStrRepr(j.get_ref<const std::string&>());
      }
      return absl::OkStatus();
    case Json::value_t::array: {
      *out += "[";
      bool first = true;
      for (const Json& e : j) {
        if (!first) *out += ", ";
        first = false;
        absl::Status s = AppendJsonRepr(owner, e, false, depth + 1, out);
        if (!s.ok()) return s;
      }
      *out += "]";
      return absl::OkStatus();
    }
    case Json::value_t::object: {
      *out += "{";
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!first) *out += ", ";
        first = false;
        *out += PyStrRepr(it.key());
        *out += ": ";
        absl::Status s = AppendJsonRepr(owner, it.value(), false, depth + 1, out);
        if (!s.ok()) return s;
      }
      *out += "}";
      return absl::OkStatus();
    }
    default:
      *out += "<binary>";
      return absl::OkStatus();
  }
}

absl::Status AppendRepr(const Value& v, bool top_str, int depth, std::string* out) {
  if (depth > kMaxNesting) return TooDeep();
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      if (!top_str) *out += "Undefined";
      return absl::OkStatus();
    case Value::Kind::kCallable:
      *out += "<function " + v.callable().name + ">";
      return absl::OkStatus();
    case Value::Kind::kNamespace: {
      if (v.ns()->is_loop) {
        *out += "<LoopContext>";
        return absl::OkStatus();
      }
      *out += "<Namespace {";
      bool first = true;
      for (const auto& [k, a] : v.ns()->attrs) {
        if (!first) *out += ", ";
        first = false;
        *out += PyStrRepr(k) + ": ";
        absl::Status s = AppendRepr(a, false, depth + 1, out);
        if (!s.ok()) return s;
      }
      *out += "}>";
      return absl::OkStatus();
    }
    case Value::Kind::kJson:
      return AppendJsonRepr(v, v.json(), top_str, depth, out);
  }
  return absl::OkStatus();
}

void AppendJsonString(absl::string_view s, bool ensure_ascii, std::string* out) {
  static const char kHex[] = "0123456789abcdef";
  auto hex4 = [&](unsigned c) {
    *out += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) out->push_back(kHex[(c >> shift) & 15]);
  };
  out->push_back('"');
  for (char32_t c : DecodeUtf8(s)) {
    switch (c) {
      case '"':
        *out += "\\\"";
        continue;
      case '\\':
        *out += "\\\\";
        continue;
      case '\n':
        *out += "\\n";
        continue;
      case '\r':
        *out += "\\r";
        continue;
      case '\t':
        *out += "\\t";
        continue;
      case '\b':
        *out += "\\b";
        continue;
      case '\f':
        *out += "\\f";
        continue;
      default:
        break;
    }
    if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
      if (c >= 0x10000) {
        const char32_t u = c - 0x10000;
        hex4(0xD800 | (u >> 10));
        hex4(0xDC00 | (u & 0x3FF));
      } else {
        hex4(c);
      }
    } else {
      AppendUtf8(c, out);
    }
  }
  out->push_back('"');
}

absl::Status AppendJsonDump(const Json& j, const JsonDumpOptions& o, const std::string& item_sep,
                            const std::string& key_sep, int depth, std::string* out) {
  if (depth > kMaxNesting) return TooDeep();
  auto newline = [&](int level) {
    out->push_back('\n');
    out->append(static_cast<size_t>(o.indent) * level, ' ');
  };
  switch (j.type()) {
    case Json::value_t::null:
      *out += "null";
      break;
    case Json::value_t::boolean:
      *out += j.get<bool>() ? "true" : "false";
      break;
    case Json::value_t::number_integer:
      *out += std::to_string(j.get<int64_t>());
      break;
    case Json::value_t::number_unsigned:
      *out += std::to_string(j.get<uint64_t>());
      break;
    case Json::value_t::number_float: {
      const double d = j.get<double>();
      if (std::isnan(d)) {
        *out += "NaN";
      } else if (std::isinf(d)) {
        *out += d < 0 ? "-Infinity" : "Infinity";
      } else {
        *out += FormatPythonFloat(d);
      }
      break;
    }
    case Json::value_t::string:
      AppendJsonString(j.get_ref<const std::string&>(), o.ensure_ascii, out);
      break;
    case Json::value_t::array: {
      if (j.empty()) {
        *out += "[]";
        break;
      }
      *out += "[";
      bool first = true;
      for (const Json& e : j) {
        if (!first) *out += item_sep;
        first = false;
        if (o.indent >= 0) newline(depth + 1);
        absl::Status s = AppendJsonDump(e, o, item_sep, key_sep, depth + 1, out);
        if (!s.ok()) return s;
      }
      if (o.indent >= 0) newline(depth);
      *out += "]";
      break;
    }
    case Json::value_t::object: {
      if (j.empty()) {
        *out += "{}";
        break;
      }
      std::vector<Json::const_iterator> items;
      for (auto it = j.begin(); it != j.end(); ++it) items.push_back(it);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto& a, const auto& b) { return a.key() < b.key(); });
      }
      *out += "{";
      bool first = true;
      for (const auto& it : items) {
        if (!first) *out += item_sep;
        first = false;
        if (o.indent >= 0) newline(depth + 1);
        AppendJsonString(it.key(), o.ensure_ascii, out);
        *out += key_sep;
        absl::Status s = AppendJsonDump(it.value(), o, item_sep, key_sep, depth + 1, out);
        if (!s.ok()) return s;
      }
      if (o.indent >= 0) newline(depth);
      *out += "}";
      break;
    }
    default:
      return absl::InvalidArgumentError("binary data is not JSON serializable");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ToPythonStr(const Value& v) {
  if (v.is_string()) return v.str();
  std::string out;
  absl::Status s = AppendRepr(v, true, 0, &out);
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<std::string> ToPythonRepr(const Value& v) {
  std::string out;
  absl::Status s = AppendRepr(v, false, 0, &out);
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<std::string> PythonJsonDumps(const Value& v, const JsonDumpOptions& options) {
  if (!v.is_json()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Object of type ", TypeName(v), " is not JSON serializable"));
  }
  std::string item_sep = options.indent >= 0 ? "," : ", ";
  std::string key_sep = ": ";
  if (options.has_separators) {
    item_sep = options.item_separator;
    key_sep = options.key_separator;
  }
  std::string out;
  absl::Status s = AppendJsonDump(v.json(), options, item_sep, key_sep, 0, &out);
  if (!s.ok()) return s;
  return out;
}

bool AsInt64(const Value& v, int64_t* out) {
  if (!v.is_json()) return false;
  const Json& j = v.json();
  if (j.is_boolean()) {
    *out = j.get<bool>() ? 1 : 0;
    return true;
  }
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (j.is_number_integer()) {
    *out = j.get<int64_t>();
    return true;
  }
  return false;
}

double AsDouble(const Value& v) {
  const Json& j = v.json();
  if (j.is_boolean()) return j.get<bool>() ? 1.0 : 0.0;
  if (j.is_number_unsigned()) return static_cast<double>(j.get<uint64_t>());
  if (j.is_number_integer()) return static_cast<double>(j.get<int64_t>());
  return j.get<double>();
}

namespace {

bool JsonEquals(const Json& a, const Json& b, int depth) {
  if (depth > kMaxNesting) return false;
  const bool an = a.is_number() || a.is_boolean();
  const bool bn = b.is_number() || b.is_boolean();
  if (an && bn) {
    if (a.is_number_float() || b.is_number_float()) {
      const double x = a.is_boolean() ? (a.get<bool>() ? 1.0 : 0.0) : a.get<double>();
      const double y = b.is_boolean() ? (b.get<bool>() ? 1.0 : 0.0) : b.get<double>();
      return x == y;
    }
    auto as_i = [](const Json& j) -> __int128 {
      if (j.is_boolean()) return j.get<bool>() ? 1 : 0;
      if (j.is_number_unsigned()) return static_cast<__int128>(j.get<uint64_t>());
      return j.get<int64_t>();
    };
    return as_i(a) == as_i(b);
  }
  if (a.is_string() && b.is_string()) {
    return a.get_ref<const std::string&>() == b.get_ref<const std::string&>();
  }
  if (a.is_null() || b.is_null()) return a.is_null() && b.is_null();
  if (a.is_array() && b.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!JsonEquals(a[i], b[i], depth + 1)) return false;
    }
    return true;
  }
  if (a.is_object() && b.is_object()) {
    if (a.size() != b.size()) return false;
    for (auto it = a.begin(); it != a.end(); ++it) {
      auto other = b.find(it.key());
      if (other == b.end() || !JsonEquals(it.value(), *other, depth + 1)) return false;
    }
    return true;
  }
  return false;
}

}  // namespace

bool PythonEquals(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
      return true;
    case Value::Kind::kNamespace:
      return a.ns() == b.ns();
    case Value::Kind::kCallable:
      return &a.callable() == &b.callable();
    case Value::Kind::kJson:
      return JsonEquals(a.json(), b.json(), 0);
  }
  return false;
}

absl::StatusOr<bool> PythonLess(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    int64_t x, y;
    if (AsInt64(a, &x) && AsInt64(b, &y)) return x < y;
    return AsDouble(a) < AsDouble(b);
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_list() && b.is_list()) {
    const Json& x = a.json();
    const Json& y = b.json();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      Value xi = a.Child(x[i]), yi = b.Child(y[i]);
      if (PythonEquals(xi, yi)) continue;
      return PythonLess(xi, yi);
    }
    return x.size() < y.size();
  }
  return absl::InvalidArgumentError(absl::StrCat("'<' not supported between instances of '",
                                                 TypeName(a), "' and '", TypeName(b), "'"));
}

}  // namespace tandem::jinja
