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

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/grammar/constraint.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem::router {

enum class ToolFormat { kNone, kLlama3Json, kHermes, kMistral };

// At most this many tools a request.
inline constexpr int kMaxTools = 64;

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

// At most kMaxTools functions, each name 1 to 64 of a-z, A-Z, 0-9, _ and -
// and given once, and for kNamed `named` among them: INVALID_ARGUMENT
// naming what to change (tools[i].function.name).
absl::Status CheckToolFunctions(const std::vector<ToolFunction>& functions, ToolChoiceKind choice,
                                const std::string& named);

// The constraint that makes an output one call of `functions` (kNamed:
// only `named`) in `format`. Mistral's [TOOL_CALLS] marker is a control
// token, forced by its id in `tokenizer`. INVALID_ARGUMENT when the marker
// is not one token of the tokenizer (or there is none), or a function's
// parameters are not JSON (a schema the workers cannot enforce is refused
// when the caller compiles the constraint, naming what).
absl::StatusOr<grammar::ConstraintSpec> ToolCallConstraint(
    ToolFormat format, const std::vector<ToolFunction>& functions, ToolChoiceKind choice,
    const std::string& named, const Tokenizer* tokenizer);

// A source of random call ids for `format`: Mistral's templates take
// exactly nine letters and digits; the others get OpenAI's "call_" and 24.
std::function<std::string()> NewToolCallIds(ToolFormat format);

// The calls in a finished output and the text outside them (nullopt when
// there is none). No calls when the output is not in the format's syntax
// (the model answered in text). `new_id` names each call. Without
// `parallel` (parallel_tool_calls: false) only the first call is kept.
struct ParsedToolCalls {
  std::optional<std::string> content;
  std::vector<ToolCall> calls;
};
ParsedToolCalls ParseToolCalls(ToolFormat format, const std::string& text,
                               const std::function<std::string()>& new_id, bool parallel = true);

// Where calls may still begin in an output that begins with `text`: a
// stream sends text[0, offset) and holds the rest back until it knows.
// text.size() when no call can follow. Llama 3 and Mistral calls are the
// whole output, so the offset is 0 or the end; Hermes calls may follow
// text, so the offset is that of the first <tool_call> (or of a tail that
// may begin one), less the white space before it.
size_t ToolCallHoldFrom(ToolFormat format, absl::string_view text);

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_TOOL_CALLS_H_
