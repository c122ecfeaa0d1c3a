// Tool calls as the served model's chat template writes them: which of the
// three families its template speaks, the constraint that makes an output
// a call (tool_choice "required" or a named function), and the calls parsed
// back out of an output.
//
// - Llama 3.1/3.2 (kLlama3Json): one JSON object {"name", "parameters"}
//   (optionally after <|python_tag|>).
// - Qwen 2.5 and Hermes (kHermes): <tool_call>\n{"name", "arguments"}\n
//   </tool_call>, one block per call.
// - Mistral (kMistral): [TOOL_CALLS] (a control token, so no text) then a
//   JSON array of {"name", "arguments"}.
#ifndef TANDEM_ROUTER_TOOL_CALLS_H_
#define TANDEM_ROUTER_TOOL_CALLS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/grammar/constraint.h"

namespace tandem::router {

enum class ToolFormat { kNone, kLlama3Json, kHermes, kMistral };

// The family of a chat template's source; kNone when it renders no tools.
ToolFormat ToolFormatOf(absl::string_view template_source);
const char* ToolFormatName(ToolFormat format);

// A function the client offers (OpenAI's tools[].function).
struct ToolFunction {
  std::string name;
  std::string description = {};
  std::string parameters = {};  // JSON Schema text; "" = no parameters
};

enum class ToolChoiceKind { kNone, kAuto, kRequired, kNamed };

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object's text
};

// The constraint that makes an output one call of `functions` (kNamed:
// only `named`) in `format`. INVALID_ARGUMENT when the format cannot be
// forced (Mistral's marker is a control token) or a function's parameters
// are a schema the workers cannot enforce (the message names it).
absl::StatusOr<grammar::ConstraintSpec> ToolCallConstraint(
    ToolFormat format, const std::vector<ToolFunction>& functions, ToolChoiceKind choice,
    const std::string& named);

// The calls in a finished output and the text outside them (nullopt when
// there is none). No calls when the output is not in the format's syntax
// (the model answered in text). `new_id` names each call.
struct ParsedToolCalls {
  std::optional<std::string> content;
  std::vector<ToolCall> calls;
};
ParsedToolCalls ParseToolCalls(ToolFormat format, const std::string& text,
                               const std::function<std::string()>& new_id);

// Whether an output that begins with `text` may still turn out to be a
// call: a stream holds such text back until it knows.
bool MayBeToolCall(ToolFormat format, absl::string_view text);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_TOOL_CALLS_H_
