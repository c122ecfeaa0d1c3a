// Renders a parsed template (internal to common/chat; see jinja.h).
#ifndef TANDEM_COMMON_CHAT_INTERNAL_EVALUATOR_H_
#define TANDEM_COMMON_CHAT_INTERNAL_EVALUATOR_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/chat/internal/ast.h"
#include "common/chat/jinja.h"

namespace tandem::jinja {

absl::StatusOr<std::string> RenderTemplate(const Body& body, const Json& context,
                                           const RenderOptions& options);

}  // namespace tandem::jinja

#endif  // TANDEM_COMMON_CHAT_INTERNAL_EVALUATOR_H_
