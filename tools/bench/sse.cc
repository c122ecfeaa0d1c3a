#include "tools/bench/sse.h"

namespace tandem::bench {

void SseParser::Feed(std::string_view bytes) {
  pending_.append(bytes);
  size_t begin = 0;
  for (size_t nl; (nl = pending_.find('\n', begin)) != std::string::npos; begin = nl + 1) {
    std::string_view line(pending_.data() + begin, nl - begin);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.substr(0, 5) != "data:") continue;
    line.remove_prefix(5);
    if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    on_data_(line);
  }
  pending_.erase(0, begin);
}

}  // namespace tandem::bench
