// What the filters of builtins.cc share across its sources (internal to
// common/chat): the filters with functions of their own, in
// list_filters.cc (sort, unique, map, select/reject, min/max) and
// scalar_filters.cc (indent, tojson, escape, round, int, float), and the
// helpers they use.
#ifndef TANDEM_COMMON_CHAT_INTERNAL_BUILTINS_INTERNAL_H_
#define TANDEM_COMMON_CHAT_INTERNAL_BUILTINS_INTERNAL_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/chat/internal/operators.h"
#include "common/chat/internal/value.h"

namespace tandem::jinja::internal {

// ---- builtins.cc ----

// INVALID_ARGUMENT with `msg`.
absl::Status TypeError(absl::string_view msg);
// Python's str(v).
absl::StatusOr<std::string> SoftStr(const Value& v);

// ---- list_filters.cc ----

// Jinja2's make_attrgetter: "a.b.0" looked up part by part with getitem.
absl::StatusOr<Value> GetPath(const Value& item, const std::string& path);
// Merge sort: never reads out of bounds, whatever the comparator answers.
absl::Status SortValues(
    std::vector<Value>* v,
    const std::function<absl::StatusOr<bool>(const Value&, const Value&)>& less);
// Sort key: lower-cased strings unless case sensitive (Jinja2's ignore_case).
Value SortKey(const Value& v, bool case_sensitive);
// A list of `items` (Undefined ones become None).
Value ListValue(const std::vector<Value>& items);

// select / reject / selectattr / rejectattr.
absl::StatusOr<Value> SelectOrReject(const Value& input, const CallArgs& args, bool select,
                                     bool by_attr);
// max / min.
absl::StatusOr<Value> MinMax(const Value& input, const CallArgs& args, bool want_max);
// sort / unique.
absl::StatusOr<Value> SortFilter(const Value& input, const CallArgs& args, bool unique);
absl::StatusOr<Value> MapFilter(const Value& input, const CallArgs& args, const Limits& limits);

// ---- scalar_filters.cc ----

std::string HtmlEscape(absl::string_view s);
absl::StatusOr<Value> Indent(const Value& input, const CallArgs& args);
absl::StatusOr<Value> ToJsonFilter(const Value& input, const CallArgs& args);
absl::StatusOr<Value> Round(const Value& input, const CallArgs& args);
// int / float.
absl::StatusOr<Value> ToInt(const Value& input, const CallArgs& args);
absl::StatusOr<Value> ToFloat(const Value& input, const CallArgs& args);

}  // namespace tandem::jinja::internal

#endif  // TANDEM_COMMON_CHAT_INTERNAL_BUILTINS_INTERNAL_H_
