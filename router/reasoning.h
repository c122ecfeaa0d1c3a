// A thinking model's output split into its reasoning and its answer: the
// text inside <think> ... </think> (Qwen3, QwQ, DeepSeek-R1 and their
// distillations) goes to the OpenAI API's `reasoning_content`, the rest to
// `content`, as DeepSeek's API and vLLM's reasoning parsers answer.
//
// The block either opens the output (the model writes <think>, as Qwen3
// does) or was opened by the prompt (DeepSeek-R1's generation prompt ends
// in "<think>\n"): then the output is reasoning up to </think>. White space
// at the edges of each part is dropped (the templates write "\n" around
// both tags). Fed in pieces, the splitter gives the same parts as fed the
// whole text at once: it holds back only what may still be the start of a
// tag or white space at an edge.
#ifndef TANDEM_ROUTER_REASONING_H_
#define TANDEM_ROUTER_REASONING_H_

#include <string>

#include "absl/strings/string_view.h"

namespace tandem::router {

// Whether a chat template writes thinking blocks (it names </think>).
bool WritesThinking(absl::string_view template_source);

// Whether a rendered prompt leaves a thinking block open: its last <think>
// has no </think> after it.
bool OpensThinking(absl::string_view prompt);

struct ReasoningParts {
  std::string reasoning;
  std::string content;
};

// Thread-compatible: one splitter per response (or per choice of a stream),
// fed by whoever writes that response.
class ReasoningSplitter {
 public:
  // `inside`: the prompt opened the block (OpensThinking).
  explicit ReasoningSplitter(bool inside);

  // The parts that `text`, appended to what came before, settles.
  ReasoningParts Feed(absl::string_view text);
  // At the end of the output: what was held back.
  ReasoningParts Finish();

  // The whole output at once.
  static ReasoningParts Split(absl::string_view text, bool inside);

 private:
  enum class State {
    kStart,      // before anything but white space: <think> may come
    kReasoning,  // inside the block
    kAnswer,     // after </think>, before the answer's first character
    kContent,    // the answer (or an output without a block)
  };
  State state_;
  bool reasoning_started_ = false;  // reasoning text went out (edges are trimmed)
  std::string held_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_REASONING_H_
