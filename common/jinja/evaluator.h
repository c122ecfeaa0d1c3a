// Renders a parsed template (internal to common/jinja; see template.h).
#ifndef TANDEM_COMMON_JINJA_EVALUATOR_H_
#define TANDEM_COMMON_JINJA_EVALUATOR_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/jinja/ast.h"
#include "common/jinja/template.h"

namespace tandem::jinja {

absl::StatusOr<std::string> RenderTemplate(const Body& body, const Json& context,
                                           const RenderOptions& options);

}  // namespace tandem::jinja

#endif  // TANDEM_COMMON_JINJA_EVALUATOR_H_
