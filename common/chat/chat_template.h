// Chat templates: OpenAI-style messages to prompt text, the way Hugging Face
// transformers' apply_chat_template(tokenize=False) does it, rendered by the
// Jinja subset of common/chat (jinja.h lists what it supports and where
// it differs from Python's Jinja2).
//
// The render context is transformers': `messages`, `tools` and `documents`
// (None unless the extra context sets them), `add_generation_prompt`, the
// special tokens the model defines (bos_token, eos_token, unk_token,
// pad_token; one the config leaves null or absent stays undefined), then the
// extra context, whose keys win. The globals `raise_exception(msg)` (fails
// the render with msg) and `strftime_now(format)` (the clock's time in
// `time_zone`, formatted as Python's strftime) are defined.
//
// A model without a template renders with the plain default template
// kDefaultChatTemplate: the BOS token when the model has one (the prompt is
// encoded without adding it, as every template writes its own), one
// "<role>: <content>\n" line per message, then "assistant:" when
// add_generation_prompt is set.
//
// A ChatTemplate is immutable and safe to use from many threads.
#ifndef TANDEM_COMMON_CHAT_CHAT_TEMPLATE_H_
#define TANDEM_COMMON_CHAT_CHAT_TEMPLATE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/chat/jinja.h"

namespace tandem {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
  std::string name = {};  // message.name in the template when set
};

inline constexpr absl::string_view kDefaultChatTemplate =
    "{% if bos_token is defined %}{{ bos_token }}{% endif %}"
    "{% for message in messages %}"
    "{{ message['role'] ~ ': ' ~ message['content'] ~ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}";

struct ChatTemplateOptions {
  // The time strftime_now formats; null means Clock::Real(). Must outlive
  // the ChatTemplate.
  const Clock* clock = nullptr;
  // transformers formats the local time (datetime.now()).
  absl::TimeZone time_zone = absl::LocalTimeZone();
  // Bounds on one render (output size, steps, macro depth).
  jinja::RenderOptions limits;
};

class ChatTemplate {
 public:
  using Options = ChatTemplateOptions;

  // The template of the Hugging Face model folder `dir`: chat_template.jinja
  // when present (transformers lets it override the config), else the
  // "chat_template" field of tokenizer_config.json (a string, or a list of
  // {"name", "template"} of which "default" is used), else the default
  // template. Special tokens come from tokenizer_config.json, each a string
  // or {"content": string}. NOT_FOUND when `dir` is not a folder;
  // INVALID_ARGUMENT naming the file and field for malformed JSON, a field
  // of the wrong type, or a template that does not parse.
  static absl::StatusOr<ChatTemplate> FromModelDir(const std::string& dir,
                                                   Options options = Options());

  // The same from the two files' contents (nullopt: the file is absent);
  // the names are the files' paths for errors.
  static absl::StatusOr<ChatTemplate> FromConfig(const std::optional<std::string>& config_json,
                                                 const std::optional<std::string>& jinja_source,
                                                 const std::string& config_name,
                                                 const std::string& jinja_name,
                                                 Options options = Options());

  // A template given as text; `name` says where it came from in errors.
  static absl::StatusOr<ChatTemplate> FromString(absl::string_view source,
                                                 std::optional<std::string> bos_token,
                                                 std::optional<std::string> eos_token,
                                                 Options options = Options(),
                                                 std::string name = "chat template");

  // The prompt for `messages`. INVALID_ARGUMENT when the template rejects
  // the conversation (raise_exception: its message) or fails (message with
  // the template line); RESOURCE_EXHAUSTED past the render limits.
  absl::StatusOr<std::string> Render(
      const std::vector<ChatMessage>& messages, bool add_generation_prompt,
      const jinja::Json& extra_context = jinja::Json::object()) const;
  // The same for messages as JSON (content lists, tool_calls, ...).
  absl::StatusOr<std::string> RenderJson(
      const jinja::Json& messages, bool add_generation_prompt,
      const jinja::Json& extra_context = jinja::Json::object()) const;

  // The variables a render sees (without the two global functions).
  jinja::Json Context(const jinja::Json& messages, bool add_generation_prompt,
                      const jinja::Json& extra_context) const;

  static jinja::Json MessagesToJson(const std::vector<ChatMessage>& messages);

  const std::string& source() const { return source_; }
  bool is_default() const { return is_default_; }
  // The special tokens given to the template (absent when undefined).
  const jinja::Json& special_tokens() const { return special_tokens_; }

 private:
  ChatTemplate(jinja::Template tmpl, std::string source, std::string name, Options options)
      : template_(std::move(tmpl)),
        source_(std::move(source)),
        name_(std::move(name)),
        options_(std::move(options)) {}

  // Constant after construction.
  jinja::Template template_;
  std::string source_;
  std::string name_;
  Options options_;
  jinja::Json special_tokens_ = jinja::Json::object();
  bool is_default_ = false;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_CHAT_CHAT_TEMPLATE_H_
