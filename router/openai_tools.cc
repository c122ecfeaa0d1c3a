#include "router/openai_tools.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/limits.h"
#include "common/base/status_macros.h"
#include "router/openai_fields.h"

namespace tandem::router::openai_api {

using nlohmann::json;

absl::Status ParseTools(const json& j, absl::string_view body, GenerateParams& params) {
  const json* tools = Field(j, "tools");
  const bool any = tools != nullptr && !(tools->is_array() && tools->empty());
  if (tools != nullptr && !tools->is_array()) return WrongType("tools", "an array", *tools);
  if (any && tools->size() > static_cast<size_t>(kMaxTools)) {
    return absl::InvalidArgumentError(absl::StrCat("`tools` has ", tools->size(),
                                                   " entries; at most ", kMaxTools, " are served"));
  }
  // Again, in declaration order: the parameters' properties are written so.
  const nlohmann::ordered_json ordered =
      any ? nlohmann::ordered_json::parse(body.begin(), body.end(), nullptr, false)
          : nlohmann::ordered_json();
  for (size_t i = 0; any && i < tools->size(); ++i) {
    const json& t = (*tools)[i];
    const std::string where = absl::StrCat("tools[", i, "]");
    if (!t.is_object()) return WrongType(where, "an object", t);
    RETURN_IF_ERROR(OnlyKnownFields(t, {"type", "function"}, where));
    if (t.value("type", "") != "function") {
      return absl::InvalidArgumentError(
          absl::StrCat("`", where, ".type` must be \"function\" (the only kind of tool served)"));
    }
    const json* f = Field(t, "function");
    if (f == nullptr || !f->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("`", where, ".function` is required: {\"name\", \"parameters\"}"));
    }
    RETURN_IF_ERROR(OnlyKnownFields(*f, {"name", "description", "parameters", "strict"},
                                    absl::StrCat(where, ".function")));
    ToolFunction fn;
    const json* name = Field(*f, "name");
    if (name == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("`", where, ".function.name` is required"));
    }
    ASSIGN_OR_RETURN(fn.name, StringField(absl::StrCat(where, ".function.name"), *name));
    if (const json* d = Field(*f, "description")) {
      ASSIGN_OR_RETURN(fn.description,
                       StringField(absl::StrCat(where, ".function.description"), *d));
    }
    if (const json* s = Field(*f, "strict")) {
      RETURN_IF_ERROR(BoolField(absl::StrCat(where, ".function.strict"), *s).status());
    }
    if (const json* p = Field(*f, "parameters")) {
      if (!p->is_object())
        return WrongType(absl::StrCat(where, ".function.parameters"), "an object", *p);
      fn.parameters = ordered.is_discarded() || ordered.is_null()
                          ? p->dump()
                          : ordered["tools"][i]["function"]["parameters"].dump();
    }
    params.tools.push_back(std::move(fn));
  }
  params.tool_choice = any ? ToolChoiceKind::kAuto : ToolChoiceKind::kNone;
  if (const json* c = Field(j, "tool_choice")) {
    if (c->is_string()) {
      const std::string s = c->get<std::string>();
      if (s == "none") {
        params.tool_choice = ToolChoiceKind::kNone;
      } else if (s == "auto" || s == "required") {
        if (!any) {
          return absl::InvalidArgumentError(
              absl::StrCat("`tool_choice` \"", s, "\" needs `tools`; send the functions"));
        }
        params.tool_choice = s == "auto" ? ToolChoiceKind::kAuto : ToolChoiceKind::kRequired;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("`tool_choice` is \"", s,
                         "\"; served: \"none\", \"auto\", \"required\" or "
                         "{\"type\": \"function\", \"function\": {\"name\"}}"));
      }
    } else if (c->is_object()) {
      RETURN_IF_ERROR(OnlyKnownFields(*c, {"type", "function"}, "tool_choice"));
      const json* f = Field(*c, "function");
      if (c->value("type", "") != "function" || f == nullptr || !f->is_object() ||
          Field(*f, "name") == nullptr) {
        return absl::InvalidArgumentError(
            "`tool_choice` as an object is {\"type\": \"function\", \"function\": {\"name\"}}");
      }
      ASSIGN_OR_RETURN(params.tool_choice_name,
                       StringField("tool_choice.function.name", (*f)["name"]));
      params.tool_choice = ToolChoiceKind::kNamed;
    } else {
      return WrongType("tool_choice", "a string or an object", *c);
    }
  }
  if (const json* v = Field(j, "parallel_tool_calls")) {
    ASSIGN_OR_RETURN(params.parallel_tool_calls, BoolField("parallel_tool_calls", *v));
  }
  return CheckToolFunctions(params.tools, params.tool_choice, params.tool_choice_name);
}

absl::Status ParseMessageToolFields(const json& m, const std::string& where, ChatTurn& turn) {
  if (const json* id = Field(m, "tool_call_id")) {
    ASSIGN_OR_RETURN(turn.tool_call_id, StringField(absl::StrCat(where, ".tool_call_id"), *id));
    if (turn.tool_call_id.size() > 256) {
      return absl::InvalidArgumentError(
          absl::StrCat("`", where, ".tool_call_id` is over 256 bytes"));
    }
  }
  const json* calls = Field(m, "tool_calls");
  if (calls == nullptr || (calls->is_array() && calls->empty())) return absl::OkStatus();
  if (!calls->is_array()) return WrongType(absl::StrCat(where, ".tool_calls"), "an array", *calls);
  if (turn.role != "assistant") {
    return absl::InvalidArgumentError(
        absl::StrCat("`", where, ".tool_calls` belong to assistant messages"));
  }
  // Ordered: the arguments keep the client's order through the template.
  using ordered = nlohmann::ordered_json;
  ordered out = ordered::array();
  for (size_t k = 0; k < calls->size(); ++k) {
    const json& c = (*calls)[k];
    const std::string at = absl::StrCat(where, ".tool_calls[", k, "]");
    if (!c.is_object()) return WrongType(at, "an object", c);
    RETURN_IF_ERROR(OnlyKnownFields(c, {"id", "type", "function"}, at));
    const json* f = Field(c, "function");
    if (f == nullptr || !f->is_object() || Field(*f, "name") == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("`", at, ".function` is required: {\"name\", \"arguments\"}"));
    }
    RETURN_IF_ERROR(OnlyKnownFields(*f, {"name", "arguments"}, absl::StrCat(at, ".function")));
    ASSIGN_OR_RETURN(std::string name,
                     StringField(absl::StrCat(at, ".function.name"), (*f)["name"]));
    // OpenAI sends the arguments as a JSON string; the templates take an
    // object (they write it with tojson).
    ordered arguments = ordered::object();
    if (const json* a = Field(*f, "arguments")) {
      ASSIGN_OR_RETURN(std::string text, StringField(absl::StrCat(at, ".function.arguments"), *a));
      arguments = ordered::parse(text, nullptr, false);
      if (arguments.is_discarded()) {
        return absl::InvalidArgumentError(
            absl::StrCat("`", at, ".function.arguments` is not JSON"));
      }
    }
    ordered call = {{"type", "function"},
                    {"function", {{"name", std::move(name)}, {"arguments", std::move(arguments)}}}};
    if (const json* id = Field(c, "id")) {
      ASSIGN_OR_RETURN(std::string s, StringField(absl::StrCat(at, ".id"), *id));
      call["id"] = std::move(s);
    }
    out.push_back(std::move(call));
  }
  turn.tool_calls = out.dump();
  return absl::OkStatus();
}

}  // namespace tandem::router::openai_api
