#include "router/openai_response_format.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "router/openai_fields.h"

namespace tandem::router::openai_api {

using nlohmann::json;

namespace {

// OpenAI: a-z, A-Z, 0-9, underscores and dashes, at most 64 characters.
absl::Status CheckSchemaName(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 64;
  for (const char c : name) ok = ok && (absl::ascii_isalnum(c) || c == '_' || c == '-');
  if (!ok) {
    return absl::InvalidArgumentError(
        "`response_format.json_schema.name` must be 1 to 64 of a-z, A-Z, 0-9, _ and -");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseResponseFormat(const json& value, absl::string_view body,
                                 GenerateParams& params) {
  if (!value.is_object()) return WrongType("response_format", "an object", value);
  const json* type = Field(value, "type");
  if (type == nullptr) {
    return absl::InvalidArgumentError(
        "`response_format.type` is required: \"text\", \"json_object\" or \"json_schema\"");
  }
  ASSIGN_OR_RETURN(const std::string kind, StringField("response_format.type", *type));
  if (kind == "text" || kind == "json_object") {
    RETURN_IF_ERROR(OnlyKnownFields(value, {"type"}, "response_format"));
    if (kind == "json_object") params.constraint.kind = grammar::ConstraintSpec::Kind::kJsonObject;
    return absl::OkStatus();
  }
  if (kind == "regex") {  // tandem's own: the whole output matches `regex`
    RETURN_IF_ERROR(OnlyKnownFields(value, {"type", "regex"}, "response_format"));
    const json* regex = Field(value, "regex");
    if (regex == nullptr) {
      return absl::InvalidArgumentError(
          "`response_format.regex` is required with type \"regex\": the pattern the whole "
          "output must match");
    }
    ASSIGN_OR_RETURN(params.constraint.schema, StringField("response_format.regex", *regex));
    params.constraint.kind = grammar::ConstraintSpec::Kind::kRegex;
    return absl::OkStatus();
  }
  if (kind != "json_schema") {
    return absl::InvalidArgumentError(
        absl::StrCat("`response_format.type` is \"", kind,
                     "\"; served: \"text\", \"json_object\", \"json_schema\", \"regex\""));
  }
  RETURN_IF_ERROR(OnlyKnownFields(value, {"type", "json_schema"}, "response_format"));
  const json* spec = Field(value, "json_schema");
  if (spec == nullptr) {
    return absl::InvalidArgumentError(
        "`response_format.json_schema` is required with type \"json_schema\": "
        "{\"name\", \"schema\", \"strict\"}");
  }
  if (!spec->is_object()) return WrongType("response_format.json_schema", "an object", *spec);
  RETURN_IF_ERROR(OnlyKnownFields(*spec, {"name", "schema", "strict", "description"},
                                  "response_format.json_schema"));
  const json* name = Field(*spec, "name");
  if (name == nullptr) {
    return absl::InvalidArgumentError("`response_format.json_schema.name` is required");
  }
  ASSIGN_OR_RETURN(const std::string n, StringField("response_format.json_schema.name", *name));
  RETURN_IF_ERROR(CheckSchemaName(n));
  if (const json* v = Field(*spec, "description")) {
    RETURN_IF_ERROR(StringField("response_format.json_schema.description", *v).status());
  }
  // Strict or not, the output follows the schema: tandem has no weaker mode.
  if (const json* v = Field(*spec, "strict")) {
    RETURN_IF_ERROR(BoolField("response_format.json_schema.strict", *v).status());
  }
  const json* schema = Field(*spec, "schema");
  if (schema == nullptr) {
    return absl::InvalidArgumentError(
        "`response_format.json_schema.schema` is required: the JSON Schema of the output");
  }
  if (!schema->is_object() && !schema->is_boolean()) {
    return WrongType("response_format.json_schema.schema", "an object", *schema);
  }
  // Again, in declaration order: `value` came from a parse that sorts keys.
  const nlohmann::ordered_json ordered =
      nlohmann::ordered_json::parse(body.begin(), body.end(), nullptr, false);
  params.constraint.kind = grammar::ConstraintSpec::Kind::kJsonSchema;
  params.constraint.schema = ordered.is_discarded()
                                 ? schema->dump()
                                 : ordered["response_format"]["json_schema"]["schema"].dump();
  return absl::OkStatus();
}

}  // namespace tandem::router::openai_api
