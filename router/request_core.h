// The router's proto-free request core: what a front end (the gRPC service,
// the HTTP server) hands in and gets back. Plain types only; the adapters
// translate tandem.v1 messages and OpenAI JSON to and from them.
//
//   std::shared_ptr<RequestHandle> h = core->Submit(std::move(params), sink);
//   sink->OnEvent(...) per event, in order, then sink->OnDone(status) once;
//   h->Cancel() when the client goes away (any thread, any time).
//
// Submit never blocks and never calls the sink inline. Sink calls come from
// gRPC's threads, never concurrently for one request, and must not block.
#ifndef TANDEM_ROUTER_REQUEST_CORE_H_
#define TANDEM_ROUTER_REQUEST_CORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/finish_reason.h"
#include "common/base/limits.h"
#include "common/grammar/constraint.h"
#include "router/tool_calls.h"

namespace tandem::router {

// The bounds on what a client controls are common/base/limits.h's.

struct ChatTurn {
  std::string role;  // system, user, assistant or tool
  std::string content;
  std::string name = {};  // the author's name, for the template; "" = none
  // An assistant's calls, as the templates take them: a JSON array of
  // {"id", "type": "function", "function": {"name", "arguments": object}};
  // "" = none.
  std::string tool_calls = {};
  // A tool message: the call it answers; "" = none.
  std::string tool_call_id = {};
  // An assistant's reasoning (a thinking model's response gave it apart
  // from the content); "" = none.
  std::string reasoning_content = {};
};

// One generation request, as a client asked for it (not yet validated).
struct GenerateParams {
  std::string request_id;  // "" = the core makes one up
  std::string model;       // "" = the served model; any other name is NOT_FOUND
  // The client's tags (OpenAI's `metadata`), written to the request's log
  // line.
  std::vector<std::pair<std::string, std::string>> metadata = {};
  // The client's end user (OpenAI's `user`), written to the log line; "" =
  // none.
  std::string user = {};

  // Exactly one prompt form. An empty text or token list generates from
  // BOS alone (OpenAI: "as if from the beginning of a new document").
  std::optional<std::string> text;
  std::optional<std::vector<int32_t>> token_ids;
  std::optional<std::vector<ChatTurn>> messages;

  // Sampling (see SamplingParams in generate.proto for the meanings).
  float temperature = 0.0f;
  int top_k = 0;
  std::optional<float> top_p;
  float min_p = 0.0f;
  std::optional<uint64_t> seed;  // unset = a fresh random seed
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::optional<float> repetition_penalty;
  std::vector<std::pair<int32_t, float>> logit_bias;
  int min_tokens = 0;
  bool ignore_eos = false;
  // What the output must be (OpenAI's response_format); kNone = free text.
  grammar::ConstraintSpec constraint = {};
  // Functions the model may call, rendered through the chat template, and
  // what tool_choice asks of them (kNone: no tools).
  std::vector<ToolFunction> tools = {};
  ToolChoiceKind tool_choice = ToolChoiceKind::kNone;
  std::string tool_choice_name = {};  // kNamed: the function
  bool parallel_tool_calls = true;
  // Variables for the chat template (a JSON object's text; "" = none):
  // OpenAI-compatible servers' chat_template_kwargs, e.g. enable_thinking.
  std::string chat_template_kwargs = {};

  // Unset = as many as the context leaves room for.
  std::optional<int> max_tokens;
  std::vector<std::string> stop;
  int n = 1;
  std::optional<int> logprobs;  // unset = none; else 0..kMaxTopLogprobs alternatives
  bool echo = false;
  // Larger is started first when requests wait (kMinPriority..kMaxPriority).
  int priority = 0;
  // Whole-request limit; zero = the router's default. The transport's own
  // deadline (gRPC's) goes in `deadline`; the earlier wins.
  absl::Duration timeout = absl::ZeroDuration();
  absl::Time deadline = absl::InfiniteFuture();
};

struct TopLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  std::string token;  // the token's bytes (may be part of a UTF-8 character)
};

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  std::string token;
  std::vector<TopLogprob> top;  // most likely first
};

// Where the request's time went (generate.proto's Timeline), microseconds.
struct Timeline {
  int64_t router_queue_us = 0;
  int64_t prefill_queue_us = 0;
  int64_t prefill_us = 0;
  int64_t kv_transfer_us = 0;
  int64_t decode_queue_us = 0;
  int64_t first_token_us = 0;
  int64_t end_us = 0;
  int64_t reserve_us = 0;       // summed over the decode workers asked
  int64_t prefill_call_us = 0;  // the last Prefill call, as the router saw it
};

// One event of a request's stream.
struct GenerateEvent {
  enum class Kind {
    kEcho,      // first, and only when asked: the prompt (echo_*)
    kTokens,    // tokens of choice `index` (token_ids, text, logprobs)
    kFinished,  // choice `index` is over (finish_reason, usage, timeline, ...)
  };
  Kind kind = Kind::kTokens;
  int index = 0;

  // kEcho and kTokens.
  std::vector<int32_t> token_ids;
  std::string text;  // whole UTF-8 characters
  // kTokens: one per token id, when asked. kEcho: one per prompt token
  // after the first, when asked.
  std::vector<TokenLogprob> logprobs;

  // kFinished.
  FinishReason finish_reason = FinishReason::kUnspecified;
  int prompt_tokens = 0;
  // Prompt tokens whose KV came from a worker's prefix cache instead of
  // being computed.
  int cached_tokens = 0;
  int completion_tokens = 0;  // of this choice
  Timeline timeline;
  std::string prefill_worker;
  std::string decode_worker;
  bool disaggregated = false;
};

// Receives one request's events. See the file comment for the threading.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  // False when the client is gone: the core then cancels the request.
  virtual bool OnEvent(GenerateEvent event) = 0;
  // The end: OK after every choice's kFinished, else the error. Called
  // exactly once, last.
  virtual void OnDone(absl::Status status) = 0;
};

class RequestHandle {
 public:
  virtual ~RequestHandle() = default;
  // The client went away: cancels every worker call of the request, which
  // frees its KV blocks there; OnDone follows with CANCELLED (unless the
  // request had ended). Non-blocking, idempotent.
  virtual void Cancel() = 0;
};

struct ServedModelInfo {
  std::string id;            // the served model name
  int64_t created_unix = 0;  // when the router started
  int max_context = 0;       // 0 = unknown (no routable decode worker yet)
  int vocab_size = 0;
  // How the chat template writes tool calls (kNone: it takes no tools).
  ToolFormat tool_format = ToolFormat::kNone;
  // The chat template writes thinking blocks (reasoning.h).
  bool thinking = false;
};

// What the front ends call. Implemented by the router's core (router.h)
// and by fakes in tests. Thread-safe.
class RequestCore {
 public:
  virtual ~RequestCore() = default;

  virtual std::shared_ptr<RequestHandle> Submit(GenerateParams params,
                                                std::shared_ptr<ResponseSink> sink) = 0;

  virtual ServedModelInfo ModelInfo() const = 0;

  // The prompt's token ids as Submit would compute them: a text (BOS first
  // when add_special_tokens) or a chat (through the chat template, with the
  // generation prompt when add_generation_prompt). INVALID_ARGUMENT as
  // Submit's validation.
  virtual absl::StatusOr<std::vector<int32_t>> Tokenize(const std::string& text,
                                                        bool add_special_tokens) const = 0;
  virtual absl::StatusOr<std::vector<int32_t>> TokenizeChat(const std::vector<ChatTurn>& messages,
                                                            bool add_generation_prompt) const = 0;
  // Whether the chat prompt, rendered with these chat_template_kwargs,
  // leaves a thinking block open (DeepSeek-R1's generation prompt does):
  // then the output starts inside it.
  virtual bool ChatPromptOpensThinking(const std::string& chat_template_kwargs) const {
    (void)chat_template_kwargs;
    return false;
  }
  // INVALID_ARGUMENT for an id outside the vocabulary.
  virtual absl::StatusOr<std::string> Detokenize(const std::vector<int32_t>& ids) const = 0;

  // Serving: not draining, and some decode worker is routable. /health and
  // gRPC health answer from this.
  virtual bool Serving() const = 0;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_REQUEST_CORE_H_
