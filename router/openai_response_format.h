// OpenAI's response_format, on /v1/chat/completions and /v1/completions:
// {"type": "text"}, {"type": "json_object"}, {"type": "json_schema",
// "json_schema": {"name", "schema", "strict", "description"}}, and
// tandem's own {"type": "regex", "regex": PATTERN} (the whole output
// matches PATTERN).
#ifndef TANDEM_ROUTER_OPENAI_RESPONSE_FORMAT_H_
#define TANDEM_ROUTER_OPENAI_RESPONSE_FORMAT_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "router/request_core.h"

namespace tandem::router::openai_api {

// Sets params.constraint from `value` (the body's response_format). The
// schema's text is taken from `body` again, parsed keeping the order of
// its properties (the order the output writes them in). Whether the
// workers can enforce the schema is checked later, in validation.
absl::Status ParseResponseFormat(const nlohmann::json& value, absl::string_view body,
                                 GenerateParams& params);

}  // namespace tandem::router::openai_api

#endif  // TANDEM_ROUTER_OPENAI_RESPONSE_FORMAT_H_
