// A Jinja template engine for the subset of Jinja2 that chat templates use
// (Hugging Face tokenizer_config.json "chat_template"), rendering as Python's
// Jinja2 does with Hugging Face's settings: ImmutableSandboxedEnvironment,
// trim_blocks=True, lstrip_blocks=True, the loopcontrols extension
// (break/continue), and `tojson` overridden as json.dumps(x,
// ensure_ascii=False, indent=indent, separators=separators,
// sort_keys=sort_keys) — so unlike Jinja2's own tojson it neither sorts keys
// nor escapes <, >, & and '.
//
// Supported: {{ }}, {% %}, {# #} with -/+ whitespace control; if/elif/else,
// for (tuple targets, `if` filter, else, loop.index/index0/revindex/
// revindex0/first/last/length/previtem/nextitem/cycle, break, continue),
// set (also `ns.attr = ...` and block set), macro (defaults, caller), call,
// filter and with blocks, raw, generation (Hugging Face's marker, rendered as
// its body); literals, lists, dicts, tuples, attribute/item access, slices,
// calls, filters, tests, arithmetic, comparisons, `in`, `not in`, `~`,
// and/or/not, inline if; the globals range, namespace and dict; Python
// methods of str (strip, split, startswith, replace, ...), dict (items,
// keys, values, get) and list (index, count). The filter and test names are
// listed in builtins.cc. Anything else (include, extends, import, recursive
// loops, *args, string % formatting) is a parse or render error naming the
// construct and its line. Also unsupported: recursive loops, loop.changed,
// cycler/joiner/lipsum, and filters such as format, truncate, groupby, batch.
//
// Known differences from Jinja2: integers are 64-bit (overflow is an error);
// case mapping (upper, lower, title, capitalize) and str.is* predicates are
// ASCII-only; tuples are lists (a tuple prints as [1, 2], not (1, 2)); dict
// keys are strings; Undefined items inside a list built by a filter become
// None; dict.items() returns a list of [key, value] pairs.
//
// Robustness: a template is an input, so parsing bounds block nesting and
// expression height, and rendering bounds output size, steps, macro call
// depth and evaluation nesting (a render needs at most about 1 MiB of
// stack); every failure is a status, never a crash.
//
// A Template is immutable after Parse and safe to render from many threads
// at once.
#ifndef TANDEM_COMMON_CHAT_JINJA_H_
#define TANDEM_COMMON_CHAT_JINJA_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::jinja {

// Template data. ordered_json keeps the insertion order of object keys, as
// Python dicts do (it shows in tojson output and dict iteration).
using Json = nlohmann::ordered_json;

// Arguments of a host function called from a template (Undefined arguments
// arrive as null).
struct FunctionArgs {
  std::vector<Json> positional;
  std::vector<std::pair<std::string, Json>> keyword;
};
// A host function; an error it returns fails the render with its message
// (e.g. raise_exception).
using Function = std::function<absl::StatusOr<Json>(const FunctionArgs& args)>;

struct RenderOptions {
  // Global functions by name. Context variables of the same name win, as in
  // Jinja2.
  absl::flat_hash_map<std::string, Function> functions;
  // The output, and any one string or list the template builds, may not be
  // larger (RESOURCE_EXHAUSTED).
  size_t max_output_bytes = 16u << 20;
  // Nested macro calls.
  int max_call_depth = 32;
  // Expression evaluations plus loop iterations, bounding the time a
  // template may run.
  int64_t max_steps = 20'000'000;
};

class Template {
 public:
  // Parses `source`. A syntax error, an unknown tag, filter or test, or an
  // unsupported construct is INVALID_ARGUMENT naming it and its line.
  static absl::StatusOr<Template> Parse(absl::string_view source);

  // Renders with `context` (a JSON object) as the template's variables.
  // Template errors (an undefined value used where Jinja2 fails, a type
  // error, raise_exception) are INVALID_ARGUMENT with the line; exceeding a
  // limit is RESOURCE_EXHAUSTED.
  absl::StatusOr<std::string> Render(const Json& context,
                                     const RenderOptions& options = RenderOptions()) const;

 private:
  struct Parsed;
  explicit Template(std::shared_ptr<const Parsed> parsed) : parsed_(std::move(parsed)) {}

  std::shared_ptr<const Parsed> parsed_;
};

}  // namespace tandem::jinja

#endif  // TANDEM_COMMON_CHAT_JINJA_H_
