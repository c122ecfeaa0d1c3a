#include "common/chat/jinja.h"

#include "common/base/status_macros.h"
#include "common/chat/internal/evaluator.h"
#include "common/chat/internal/parser.h"

namespace tandem::jinja {

struct Template::Parsed {
  Body body;
};

absl::StatusOr<Template> Template::Parse(absl::string_view source) {
  auto parsed = std::make_shared<Parsed>();
  ASSIGN_OR_RETURN(parsed->body, ParseTemplate(source));
  return Template(std::move(parsed));
}

absl::StatusOr<std::string> Template::Render(const Json& context,
                                             const RenderOptions& options) const {
  return RenderTemplate(parsed_->body, context, options);
}

}  // namespace tandem::jinja
