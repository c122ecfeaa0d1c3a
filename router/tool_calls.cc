#include "router/tool_calls.h"

#include <algorithm>
#include <memory>
#include <random>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem::router {
namespace {

using json = nlohmann::ordered_json;

constexpr absl::string_view kPythonTag = "<|python_tag|>";
constexpr absl::string_view kHermesOpen = "<tool_call>";
constexpr absl::string_view kHermesClose = "</tool_call>";
constexpr absl::string_view kMistralMarker = "[TOOL_CALLS]";

// The id of Mistral's marker, a control token (one id, no text).
absl::StatusOr<int32_t> MistralMarkerId(const Tokenizer* tokenizer) {
  if (tokenizer != nullptr) {
    absl::StatusOr<std::vector<int32_t>> ids =
        tokenizer->Encode(std::string_view(kMistralMarker.data(), kMistralMarker.size()),
                          EncodeOptions{.parse_special = true});
    if (ids.ok() && ids->size() == 1) {
      absl::StatusOr<std::string> text = tokenizer->Decode(-1, ids->front());
      if (text.ok() && text->empty()) return ids->front();
    }
  }
  return absl::InvalidArgumentError(
      "tool_choice \"required\" or a named function needs the model's [TOOL_CALLS] control "
      "token, which this router's tokenizer does not have; use \"auto\"");
}

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

absl::Status CheckToolFunctions(const std::vector<ToolFunction>& functions, ToolChoiceKind choice,
                                const std::string& named) {
  if (functions.size() > static_cast<size_t>(kMaxTools)) {
    return absl::InvalidArgumentError(absl::StrCat("`tools` has ", functions.size(),
                                                   " entries; at most ", kMaxTools, " are served"));
  }
  absl::flat_hash_set<absl::string_view> names;
  for (size_t i = 0; i < functions.size(); ++i) {
    const std::string& name = functions[i].name;
    bool ok = !name.empty() && name.size() <= 64;
    for (const char c : name) ok = ok && (absl::ascii_isalnum(c) || c == '_' || c == '-');
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("`tools[", i, "].function.name` must be 1 to 64 of a-z, A-Z, 0-9, _ and -"));
    }
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("`tools` names the function `", name, "` twice; give each once"));
    }
  }
  if (choice == ToolChoiceKind::kNamed && !names.contains(named)) {
    return absl::InvalidArgumentError(absl::StrCat("`tool_choice` names the function `",
                                                   named.substr(0, 64),
                                                   "`, which `tools` does not offer"));
  }
  return absl::OkStatus();
}

absl::StatusOr<grammar::ConstraintSpec> ToolCallConstraint(
    ToolFormat format, const std::vector<ToolFunction>& functions, ToolChoiceKind choice,
    const std::string& named, const Tokenizer* tokenizer) {
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
  json call = alternatives.size() == 1 ? alternatives[0] : json{{"anyOf", alternatives}};
  if (format == ToolFormat::kMistral) {
    // [TOOL_CALLS] then an array of one call, as the other families write one.
    ASSIGN_OR_RETURN(const int32_t marker, MistralMarkerId(tokenizer));
    spec.forced_tokens = {marker};
    call = json{{"type", "array"}, {"items", call}, {"minItems", 1}, {"maxItems", 1}};
  }
  spec.schema = call.dump();
  if (format == ToolFormat::kHermes) {
    spec.prefix = absl::StrCat(kHermesOpen, "\n");
    spec.suffix = absl::StrCat("\n", kHermesClose);
  }
  // The compiled form is checked by the caller's validation, which names
  // a parameter schema the workers cannot enforce.
  return spec;
}

std::function<std::string()> NewToolCallIds(ToolFormat format) {
  auto rng = std::make_shared<std::mt19937_64>(std::random_device{}());
  return [rng, format] {
    static constexpr char kAlphabet[] =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    const int length = format == ToolFormat::kMistral ? 9 : 24;
    std::string id = format == ToolFormat::kMistral ? "" : "call_";
    for (int k = 0; k < length; ++k) id += kAlphabet[(*rng)() % (sizeof(kAlphabet) - 1)];
    return id;
  };
}

namespace {

// ParseToolCalls, every call kept.
ParsedToolCalls ParseEveryCall(ToolFormat format, const std::string& text,
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

}  // namespace

ParsedToolCalls ParseToolCalls(ToolFormat format, const std::string& text,
                               const std::function<std::string()>& new_id, bool parallel) {
  ParsedToolCalls out = ParseEveryCall(format, text, new_id);
  if (!parallel && out.calls.size() > 1) out.calls.resize(1);
  return out;
}

size_t ToolCallHoldFrom(ToolFormat format, absl::string_view text) {
  const absl::string_view s = absl::StripLeadingAsciiWhitespace(text);
  switch (format) {
    case ToolFormat::kLlama3Json:
      if (s.empty() || s[0] == '{' || absl::StartsWith(s, kPythonTag) ||
          (s.size() < kPythonTag.size() && absl::StartsWith(kPythonTag, s))) {
        return 0;
      }
      break;
    case ToolFormat::kMistral:
      if (s.empty() || s[0] == '[') return 0;
      break;
    case ToolFormat::kHermes: {
      size_t from = text.find(kHermesOpen);
      if (from == absl::string_view::npos) {
        // The longest tail that is a proper prefix of the marker.
        from = text.size();
        for (size_t n = std::min(text.size(), kHermesOpen.size() - 1); n > 0; --n) {
          if (absl::EndsWith(text, kHermesOpen.substr(0, n))) {
            from = text.size() - n;
            break;
          }
        }
      }
      while (from > 0 && absl::ascii_isspace(static_cast<unsigned char>(text[from - 1]))) --from;
      return from;
    }
    case ToolFormat::kNone:
      break;
  }
  return text.size();
}

}  // namespace tandem::router
