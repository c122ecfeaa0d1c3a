#include "common/chat/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

using jinja::Json;

absl::StatusOr<std::string> ReadText(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot open"));
  std::stringstream text;
  text << f.rdbuf();
  if (f.bad()) return absl::DataLossError(absl::StrCat(path.string(), ": read failed"));
  return text.str();
}

// A special token of tokenizer_config.json: a string, {"content": string},
// or null/absent (nullopt).
absl::StatusOr<std::optional<std::string>> SpecialToken(const Json& config, const char* field,
                                                        const std::string& path) {
  auto it = config.find(field);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": field '", field, "' must be a string or {\"content\": string}"));
}

// The "chat_template" field: a string, or [{"name", "template"}, ...] of
// which "default" is taken (as transformers does without a template name).
absl::StatusOr<std::optional<std::string>> ConfigTemplate(const Json& config,
                                                          const std::string& path) {
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": field 'chat_template' ", why));
  };
  if (!it->is_array()) return bad("must be a string or a list of {\"name\", \"template\"}");
  for (const Json& entry : *it) {
    if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
        !entry["name"].is_string() || !entry["template"].is_string()) {
      return bad("has an entry that is not {\"name\": string, \"template\": string}");
    }
    if (entry["name"] == "default") return entry["template"].get<std::string>();
  }
  return bad("lists named templates but none named \"default\"");
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromString(absl::string_view source,
                                                      std::optional<std::string> bos_token,
                                                      std::optional<std::string> eos_token,
                                                      Options options, std::string name) {
  absl::StatusOr<jinja::Template> parsed = jinja::Template::Parse(source);
  if (!parsed.ok()) {
    return absl::Status(parsed.status().code(),
                        absl::StrCat(name, ": ", parsed.status().message()));
  }
  ChatTemplate t(std::move(*parsed), std::string(source), std::move(name), std::move(options));
  if (bos_token.has_value()) t.special_tokens_["bos_token"] = *bos_token;
  if (eos_token.has_value()) t.special_tokens_["eos_token"] = *eos_token;
  return t;
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromModelDir(const std::string& dir, Options options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": not a model folder"));
  }
  const fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  const fs::path jinja_path = fs::path(dir) / "chat_template.jinja";
  std::optional<std::string> config_json;
  if (fs::exists(config_path, ec)) {
    ASSIGN_OR_RETURN(config_json, ReadText(config_path));
  }
  std::optional<std::string> jinja_source;
  if (fs::exists(jinja_path, ec)) {
    ASSIGN_OR_RETURN(jinja_source, ReadText(jinja_path));
  }
  return FromConfig(config_json, jinja_source, config_path.string(), jinja_path.string(),
                    std::move(options));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromConfig(
    const std::optional<std::string>& config_json, const std::optional<std::string>& jinja_source,
    const std::string& config_name, const std::string& jinja_name, Options options) {
  Json config = Json::object();
  if (config_json.has_value()) {
    config = Json::parse(*config_json, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_name, ": not a JSON object"));
    }
  }
  Json tokens = Json::object();
  for (const char* field : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    ASSIGN_OR_RETURN(std::optional<std::string> token, SpecialToken(config, field, config_name));
    if (token.has_value()) tokens[field] = *token;
  }
  std::string source;
  std::string name;
  bool is_default = false;
  if (jinja_source.has_value()) {
    source = *jinja_source;
    name = jinja_name;
  } else {
    ASSIGN_OR_RETURN(std::optional<std::string> from_config, ConfigTemplate(config, config_name));
    if (from_config.has_value()) {
      source = std::move(*from_config);
      name = absl::StrCat(config_name, " field 'chat_template'");
    } else {
      source = std::string(kDefaultChatTemplate);
      name = "default chat template";
      is_default = true;
    }
  }
  ASSIGN_OR_RETURN(ChatTemplate t,
                   FromString(source, std::nullopt, std::nullopt, std::move(options), name));
  t.special_tokens_ = std::move(tokens);
  t.is_default_ = is_default;
  return t;
}

Json ChatTemplate::MessagesToJson(const std::vector<ChatMessage>& messages) {
  Json out = Json::array();
  for (const ChatMessage& m : messages) {
    Json message = {{"role", m.role}, {"content", m.content}};
    if (!m.name.empty()) message["name"] = m.name;
    out.push_back(std::move(message));
  }
  return out;
}

Json ChatTemplate::Context(const Json& messages, bool add_generation_prompt,
                           const Json& extra_context) const {
  Json context = Json::object();
  context["messages"] = messages;
  context["tools"] = nullptr;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it) {
    context[it.key()] = it.value();
  }
  if (extra_context.is_object()) {
    for (auto it = extra_context.begin(); it != extra_context.end(); ++it) {
      context[it.key()] = it.value();
    }
  }
  return context;
}

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 bool add_generation_prompt,
                                                 const Json& extra_context) const {
  return RenderJson(MessagesToJson(messages), add_generation_prompt, extra_context);
}

absl::StatusOr<std::string> ChatTemplate::RenderJson(const Json& messages,
                                                     bool add_generation_prompt,
                                                     const Json& extra_context) const {
  if (!messages.is_array()) return absl::InvalidArgumentError("messages must be a list");
  if (!extra_context.is_object()) {
    return absl::InvalidArgumentError("the extra template context must be a JSON object");
  }
  jinja::RenderOptions render = options_.limits;
  render.functions["raise_exception"] =
      [](const jinja::FunctionArgs& args) -> absl::StatusOr<Json> {
    std::string message = "raise_exception() called";
    if (!args.positional.empty()) {
      message = args.positional[0].is_string() ? args.positional[0].get<std::string>()
                                               : args.positional[0].dump();
    }
    return absl::InvalidArgumentError(message);
  };
  const Clock* clock = options_.clock != nullptr ? options_.clock : &Clock::Real();
  const absl::TimeZone tz = options_.time_zone;
  render.functions["strftime_now"] = [clock,
                                      tz](const jinja::FunctionArgs& args) -> absl::StatusOr<Json> {
    if (args.positional.size() != 1 || !args.positional[0].is_string() || !args.keyword.empty()) {
      return absl::InvalidArgumentError("strftime_now() takes one format string");
    }
    return Json(absl::FormatTime(args.positional[0].get<std::string>(), clock->Now(), tz));
  };
  absl::StatusOr<std::string> out =
      template_.Render(Context(messages, add_generation_prompt, extra_context), render);
  if (!out.ok()) {
    return absl::Status(out.status().code(), absl::StrCat(name_, ": ", out.status().message()));
  }
  return out;
}

}  // namespace tandem
