// Built-in filters, tests and global functions of the Jinja subset
// (internal to common/chat). Errors carry Python-like messages without a
// line; the evaluator adds it.
#ifndef TANDEM_COMMON_CHAT_INTERNAL_BUILTINS_H_
#define TANDEM_COMMON_CHAT_INTERNAL_BUILTINS_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/chat/internal/operators.h"
#include "common/chat/internal/value.h"

namespace tandem::jinja {

// Whether the parser accepts a filter / test name.
bool IsKnownFilter(absl::string_view name);
bool IsKnownTest(absl::string_view name);

// input | name(args). `tojson` follows Hugging Face's override:
// json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False).
absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& input, const CallArgs& args,
                                  const Limits& limits);

// input is name(args).
absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& input, const CallArgs& args);

// The global functions every template sees: range, namespace, dict. Every
// namespace created is added to `created` (which must outlive the function),
// so that the renderer can break reference cycles (ns.self = ns) at the end.
Value GlobalRange(const Limits& limits);
Value GlobalNamespace(std::vector<std::shared_ptr<NamespaceData>>* created);
Value GlobalDict();

// Undefined items become None in the lists built by filters.
Json ToJsonLoose(const Value& v);

}  // namespace tandem::jinja

#endif  // TANDEM_COMMON_CHAT_INTERNAL_BUILTINS_H_
