// Bounds on what a client controls in one generation request, shared by
// the router (which refuses what is over them with INVALID_ARGUMENT) and
// the workers (which check again what reaches them). The one definition of
// each.
#ifndef TANDEM_COMMON_BASE_LIMITS_H_
#define TANDEM_COMMON_BASE_LIMITS_H_

#include <cstddef>

namespace tandem {

inline constexpr int kMaxChoices = 16;        // n
inline constexpr int kMaxTopLogprobs = 20;    // logprobs: alternatives per token
inline constexpr int kMaxStopStrings = 16;    // stop
inline constexpr size_t kMaxStopBytes = 256;  // each stop string
inline constexpr int kMaxLogitBias = 1024;    // logit_bias entries
inline constexpr float kMaxLogitBiasValue = 100.0f;
inline constexpr int kMaxChatMessages = 1024;               // messages
inline constexpr size_t kMaxChatBytes = size_t{2} << 20;    // roles + contents
inline constexpr size_t kMaxPromptBytes = size_t{8} << 20;  // text prompts
inline constexpr int kMaxPromptTokenIds = 1 << 20;          // token-id prompts
inline constexpr size_t kMaxNameBytes = 64;                 // messages[].name
inline constexpr int kMaxMetadataPairs = 16;                // metadata (OpenAI's bounds)
inline constexpr size_t kMaxMetadataKeyBytes = 64;
inline constexpr size_t kMaxMetadataValueBytes = 512;
// OpenAI's `user`: an end-user id, written to the request log.
inline constexpr size_t kMaxUserBytes = 256;
inline constexpr int kMaxTemplateKwargs = 16;                       // chat_template_kwargs keys
inline constexpr size_t kMaxTemplateKwargsBytes = size_t{4} << 10;  // ... as JSON text
inline constexpr int kMinPriority = -1000;  // priority: larger is served first
inline constexpr int kMaxPriority = 1000;

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_LIMITS_H_
