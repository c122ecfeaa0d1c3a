#include "router/request_validation.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace tandem::router {

absl::StatusOr<std::vector<int32_t>> ChatPromptIds(const v1::ChatMessages& messages,
                                                   const Tokenizer& tokenizer,
                                                   const ChatTemplate& chat_template) {
  if (messages.messages().empty()) {
    return absl::InvalidArgumentError("messages is empty; send at least one message");
  }
  if (messages.messages_size() > kMaxChatMessages) {
    return absl::InvalidArgumentError(absl::StrCat("the chat has ", messages.messages_size(),
                                                   " messages; at most ", kMaxChatMessages,
                                                   " are served"));
  }
  std::vector<ChatMessage> chat;
  chat.reserve(messages.messages_size());
  size_t bytes = 0;
  for (int i = 0; i < messages.messages_size(); ++i) {
    const v1::ChatMessage& m = messages.messages(i);
    if (m.role() != "system" && m.role() != "user" && m.role() != "assistant" &&
        m.role() != "tool") {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, " has role '", m.role(),
                       "'; the role must be system, user, assistant or tool"));
    }
    bytes += m.role().size() + m.content().size();
    if (bytes > kMaxChatBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the chat's roles and contents exceed ", kMaxChatBytes, " bytes; shorten the messages"));
    }
    chat.push_back({m.role(), m.content()});
  }
  absl::StatusOr<std::string> text = chat_template.Render(chat, /*add_generation_prompt=*/true);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the chat template refused the messages: ", text.status().message()));
  }
  // Only the plain default template may lack a BOS: every other template
  // writes the special tokens its model wants.
  const bool add_bos =
      (chat_template.is_default() || chat_template.source() == kDefaultChatTemplate) &&
      !chat_template.special_tokens().contains("bos_token");
  absl::StatusOr<std::vector<int32_t>> ids =
      tokenizer.Encode(*text, EncodeOptions{.add_bos = add_bos, .parse_special = true});
  if (!ids.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot tokenize the rendered chat: ", ids.status().message()));
  }
  if (ids->empty()) {
    return absl::InvalidArgumentError(
        "the chat template rendered an empty prompt; send messages with content");
  }
  return ids;
}

absl::StatusOr<ValidRequest> ValidateRequest(const v1::GenerateRequest& request,
                                             const Tokenizer* tokenizer,
                                             const ChatTemplate* chat_template) {
  ValidRequest out;
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kText: {
      if (request.text().empty()) {
        return absl::InvalidArgumentError("prompt text is empty; send a non-empty prompt");
      }
      if (tokenizer == nullptr) {
        return absl::InvalidArgumentError(
            "this router has no tokenizer; send the prompt as token_ids");
      }
      absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(request.text(), true);
      if (!ids.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("cannot tokenize the prompt text: ", ids.status().message()));
      }
      out.prompt = *std::move(ids);
      break;
    }
    case v1::GenerateRequest::kTokenIds:
      if (request.token_ids().ids().empty()) {
        return absl::InvalidArgumentError("prompt token_ids is empty; send at least one token");
      }
      out.prompt.assign(request.token_ids().ids().begin(), request.token_ids().ids().end());
      break;
    case v1::GenerateRequest::kMessages: {
      if (tokenizer == nullptr || chat_template == nullptr) {
        return absl::InvalidArgumentError(
            "this router has no tokenizer or chat template for chat messages; send the prompt "
            "as token_ids");
      }
      absl::StatusOr<std::vector<int32_t>> ids =
          ChatPromptIds(request.messages(), *tokenizer, *chat_template);
      if (!ids.ok()) return ids.status();
      out.prompt = *std::move(ids);
      break;
    }
    default:
      return absl::InvalidArgumentError("no prompt; set text, token_ids or messages");
  }
  if (request.max_tokens() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens is ", request.max_tokens(), "; it must be at least 1"));
  }
  const v1::SamplingParams& s = request.sampling();
  if (!std::isfinite(s.temperature()) || s.temperature() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature is ", s.temperature(), "; it must be >= 0 (0 = greedy)"));
  }
  if (s.top_k() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k is ", s.top_k(), "; it must be >= 0 (0 = no limit)"));
  }
  if (s.has_top_p() && !(s.top_p() > 0 && s.top_p() <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_p is ", s.top_p(), "; it must be in (0, 1] (1 or unset = no cut)"));
  }
  for (const std::string& stop : request.stop()) {
    if (stop.empty()) {
      return absl::InvalidArgumentError("a stop string is empty; remove it");
    }
    out.stop.push_back(stop);
  }
  if (!out.stop.empty() && tokenizer == nullptr) {
    return absl::InvalidArgumentError(
        "this router has no tokenizer, so it cannot match stop strings; remove `stop`");
  }
  if (request.timeout_ms() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("timeout_ms is ", request.timeout_ms(),
                                                   "; it must be >= 0 (0 = the router's default)"));
  }
  out.sampling = s;
  out.max_tokens = request.max_tokens();
  // Every end-of-sequence id stops: Llama 3 instruct models end a turn with
  // <|eot_id|> but may also emit <|end_of_text|> or <|eom_id|>.
  if (tokenizer != nullptr) {
    for (const int32_t eos : tokenizer->eos_ids()) out.stop_token_ids.push_back(eos);
  }
  return out;
}

absl::Status CheckModelLimits(const std::vector<int32_t>& prompt, int vocab_size, int max_context) {
  if (vocab_size > 0) {
    for (size_t i = 0; i < prompt.size(); ++i) {
      if (prompt[i] < 0 || prompt[i] >= vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " is ", prompt[i],
                                                       ", outside the vocabulary [0, ", vocab_size,
                                                       "); send token ids of this model"));
      }
    }
  }
  if (max_context > 0 && static_cast<int64_t>(prompt.size()) >= max_context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt has ", prompt.size(), " tokens but the model's context is ", max_context,
        " tokens; shorten the prompt to at most ", max_context - 1, " tokens"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::router
