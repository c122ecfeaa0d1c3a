// The list filters of the Jinja subset that have functions of their own
// (sort, unique, map, select/reject and their attr forms, min/max; the
// dispatch is ApplyFilter in builtins.cc), and the helpers that walk and
// sort lists.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/chat/internal/builtins.h"
#include "common/chat/internal/builtins_internal.h"
#include "common/chat/internal/py_string.h"

namespace tandem::jinja::internal {

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

}  // namespace tandem::jinja::internal
