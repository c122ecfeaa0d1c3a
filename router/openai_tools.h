// OpenAI's tools on /v1/chat/completions: `tools`, `tool_choice`,
// `parallel_tool_calls`, and the tool fields of messages (an assistant's
// `tool_calls`, a tool message's `tool_call_id`).
#ifndef TANDEM_ROUTER_OPENAI_TOOLS_H_
#define TANDEM_ROUTER_OPENAI_TOOLS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "router/request_core.h"
#include "router/tool_calls.h"

namespace tandem::router::openai_api {

// Sets params' tools, tool_choice and parallel_tool_calls from the body
// (`j`, and `body` again for the parameters' property order). Without
// tools, tool_choice may only be "none".
absl::Status ParseTools(const nlohmann::json& j, absl::string_view body, GenerateParams& params);

// Reads message `m`'s tool_calls (an assistant's) and tool_call_id (a tool
// message's) into `turn`; `where` names the message in errors.
absl::Status ParseMessageToolFields(const nlohmann::json& m, const std::string& where,
                                    ChatTurn& turn);

}  // namespace tandem::router::openai_api

#endif  // TANDEM_ROUTER_OPENAI_TOOLS_H_
