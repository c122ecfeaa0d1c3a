#include "router/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace tandem::router {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::string StopMatcher::Push(std::string_view text) {
  if (stopped_) return "";
  held_.append(text);
  if (stops_.empty()) return std::exchange(held_, std::string());
  // The earliest stop string wins.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of a stop string.
  // Text is valid UTF-8 and so are the stop strings, so the cut falls on a
  // character boundary.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
      if (std::string_view(held_).substr(held_.size() - n) == std::string_view(s).substr(0, n)) {
        keep = n;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::Flush() {
  if (stopped_) return "";
  return std::exchange(held_, std::string());
}

}  // namespace tandem::router
