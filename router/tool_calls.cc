#include "router/tool_calls.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace tandem::router {
namespace {

using json = nlohmann::ordered_json;

constexpr absl::string_view kPythonTag = "<|python_tag|>";
constexpr absl::string_view kHermesOpen = "<tool_call>";
constexpr absl::string_view kHermesClose = "</tool_call>";

// The call in `j` ({"name", key: object}); nullopt when it is not one.
std::optional<ToolCall> CallOf(const json& j, const char* key,
                               const std::function<std::string()>& new_id) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  const char* args_key = j.contains(key) ? key : "arguments";
  json args = j.value(args_key, json::object());
  if (!args.is_object()) return std::nullopt;
  return ToolCall{.id = new_id(), .name = j["name"].get<std::string>(), .arguments = args.dump()};
}

std::optional<std::string> NonEmpty(absl::string_view s) {
  s = absl::StripAsciiWhitespace(s);
  if (s.empty()) return std::nullopt;
  return std::string(s);
}

}  // namespace

ToolFormat ToolFormatOf(absl::string_view source) {
  if (absl::StrContains(source, "<tool_call>")) return ToolFormat::kHermes;
  if (absl::StrContains(source, "[TOOL_CALLS]")) return ToolFormat::kMistral;
  if (absl::StrContains(source, "\"parameters\"") && absl::StrContains(source, "tools")) {
    return ToolFormat::kLlama3Json;
  }
  return ToolFormat::kNone;
}

const char* ToolFormatName(ToolFormat format) {
  switch (format) {
    case ToolFormat::kLlama3Json:
      return "llama3_json";
    case ToolFormat::kHermes:
      return "hermes";
    case ToolFormat::kMistral:
      return "mistral";
    case ToolFormat::kNone:
      break;
  }
  return "none";
}

absl::StatusOr<grammar::ConstraintSpec> ToolCallConstraint(
    ToolFormat format, const std::vector<ToolFunction>& functions, ToolChoiceKind choice,
    const std::string& named) {
  if (format == ToolFormat::kMistral) {
    return absl::InvalidArgumentError(
        "tool_choice \"required\" or a named function cannot be enforced for this model: its "
        "calls start with a control token; use \"auto\"");
  }
  const char* args_key = format == ToolFormat::kLlama3Json ? "parameters" : "arguments";
  json alternatives = json::array();
  for (const ToolFunction& f : functions) {
    if (choice == ToolChoiceKind::kNamed && f.name != named) continue;
    json params = f.parameters.empty() ? json{{"type", "object"}, {"properties", json::object()}}
                                       : json::parse(f.parameters, nullptr, false);
    if (params.is_discarded()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the parameters of tool `", f.name, "` are not JSON"));
    }
    alternatives.push_back({{"type", "object"},
                            {"properties", {{"name", {{"const", f.name}}}, {args_key, params}}},
                            {"required", {"name", args_key}},
                            {"additionalProperties", false}});
  }
  if (alternatives.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tool_choice names the function `", named, "`, which `tools` does not offer"));
  }
  grammar::ConstraintSpec spec;
  spec.kind = grammar::ConstraintSpec::Kind::kJsonSchema;
  spec.schema =
      alternatives.size() == 1 ? alternatives[0].dump() : json{{"anyOf", alternatives}}.dump();
  if (format == ToolFormat::kHermes) {
    spec.prefix = absl::StrCat(kHermesOpen, "\n");
    spec.suffix = absl::StrCat("\n", kHermesClose);
  }
  // The compiled form is checked by the caller's validation, which names
  // a parameter schema the workers cannot enforce.
  return spec;
}

ParsedToolCalls ParseToolCalls(ToolFormat format, const std::string& text,
                               const std::function<std::string()>& new_id) {
  ParsedToolCalls out;
  absl::string_view rest = absl::StripAsciiWhitespace(text);
  switch (format) {
    case ToolFormat::kLlama3Json: {
      absl::ConsumePrefix(&rest, kPythonTag);
      const json j = json::parse(rest.begin(), rest.end(), nullptr, false);
      if (j.is_object()) {
        if (std::optional<ToolCall> call = CallOf(j, "parameters", new_id)) {
          out.calls.push_back(*std::move(call));
          return out;
        }
      }
      break;
    }
    case ToolFormat::kMistral: {
      const json j = json::parse(rest.begin(), rest.end(), nullptr, false);
      if (j.is_array() && !j.empty()) {
        for (const json& item : j) {
          std::optional<ToolCall> call = CallOf(item, "arguments", new_id);
          if (!call.has_value()) {
            out.calls.clear();
            break;
          }
          out.calls.push_back(*std::move(call));
        }
        if (!out.calls.empty()) return out;
      }
      break;
    }
    case ToolFormat::kHermes: {
      std::string content;
      absl::string_view s = text;
      while (true) {
        const size_t open = s.find(kHermesOpen);
        if (open == absl::string_view::npos) break;
        const size_t close = s.find(kHermesClose, open);
        if (close == absl::string_view::npos) break;
        const absl::string_view body =
            s.substr(open + kHermesOpen.size(), close - open - kHermesOpen.size());
        std::optional<ToolCall> call =
            CallOf(json::parse(body.begin(), body.end(), nullptr, false), "arguments", new_id);
        if (!call.has_value()) break;
        absl::StrAppend(&content, s.substr(0, open));
        out.calls.push_back(*std::move(call));
        s.remove_prefix(close + kHermesClose.size());
      }
      if (!out.calls.empty()) {
        absl::StrAppend(&content, s);
        out.content = NonEmpty(content);
        return out;
      }
      break;
    }
    case ToolFormat::kNone:
      break;
  }
  out.calls.clear();
  out.content = text;
  return out;
}

bool MayBeToolCall(ToolFormat format, absl::string_view text) {
  const absl::string_view s = absl::StripLeadingAsciiWhitespace(text);
  auto starts = [&](absl::string_view marker) {
    return s.size() <= marker.size() ? absl::StartsWith(marker, s) : absl::StartsWith(s, marker);
  };
  switch (format) {
    case ToolFormat::kLlama3Json:
      return s.empty() || s[0] == '{' || starts(kPythonTag);
    case ToolFormat::kMistral:
      return s.empty() || s[0] == '[';
    case ToolFormat::kHermes:
      return starts(kHermesOpen);
    case ToolFormat::kNone:
      break;
  }
  return false;
}

}  // namespace tandem::router
