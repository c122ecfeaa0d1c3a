// Server-sent events, as OpenAI-compatible servers stream completions:
// "data: {...}" lines separated by blank lines, ending with "data: [DONE]".
#ifndef TANDEM_TOOLS_BENCH_SSE_H_
#define TANDEM_TOOLS_BENCH_SSE_H_

#include <functional>
#include <string>
#include <string_view>

namespace tandem::bench {

// Feeds bytes as they arrive (split anywhere) and calls `on_data` with the
// payload of every complete "data:" line (one leading space removed).
// Comments (":..."), "event:", "id:" and "retry:" lines are ignored.
//
// Thread-compatible: one parser per stream, fed in order.
class SseParser {
 public:
  explicit SseParser(std::function<void(std::string_view data)> on_data)
      : on_data_(std::move(on_data)) {}

  void Feed(std::string_view bytes);

 private:
  std::function<void(std::string_view)> on_data_;
  std::string pending_;
};

}  // namespace tandem::bench

#endif  // TANDEM_TOOLS_BENCH_SSE_H_
