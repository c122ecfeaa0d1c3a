#include "router/reasoning.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace tandem::router {
namespace {

constexpr absl::string_view kOpen = "<think>";
constexpr absl::string_view kClose = "</think>";

size_t FirstNonSpace(absl::string_view s) {
  size_t i = 0;
  while (i < s.size() && absl::ascii_isspace(static_cast<unsigned char>(s[i]))) ++i;
  return i;
}

// The length of the longest tail of `s` that is a proper prefix of `tag`.
size_t TagTail(absl::string_view s, absl::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (absl::StartsWith(tag, s.substr(s.size() - n))) return n;
  }
  return 0;
}

}  // namespace

bool WritesThinking(absl::string_view template_source) {
  return absl::StrContains(template_source, kClose);
}

bool OpensThinking(absl::string_view prompt) {
  const size_t open = prompt.rfind(kOpen);
  if (open == absl::string_view::npos) return false;
  const size_t close = prompt.rfind(kClose);
  return close == absl::string_view::npos || close < open;
}

ReasoningSplitter::ReasoningSplitter(bool inside)
    : state_(inside ? State::kReasoning : State::kStart) {}

ReasoningParts ReasoningSplitter::Feed(absl::string_view text) {
  held_.append(text.data(), text.size());
  ReasoningParts out;
  while (true) {
    switch (state_) {
      case State::kStart: {
        const absl::string_view rest = absl::string_view(held_).substr(FirstNonSpace(held_));
        if (rest.empty()) return out;
        if (absl::StartsWith(rest, kOpen)) {
          held_ = std::string(rest.substr(kOpen.size()));
          state_ = State::kReasoning;
          continue;
        }
        if (absl::StartsWith(kOpen, rest)) return out;  // may still become <think>
        state_ = State::kContent;
        continue;
      }
      case State::kReasoning: {
        if (!reasoning_started_) held_.erase(0, FirstNonSpace(held_));
        const size_t close = absl::string_view(held_).find(kClose);
        if (close != absl::string_view::npos) {
          absl::string_view body = absl::string_view(held_).substr(0, close);
          body = absl::StripTrailingAsciiWhitespace(body);
          out.reasoning.append(body.data(), body.size());
          held_.erase(0, close + kClose.size());
          state_ = State::kAnswer;
          continue;
        }
        // Hold a tail that may begin </think>, and the white space before it.
        size_t keep_from = held_.size() - TagTail(held_, kClose);
        while (keep_from > 0 &&
               absl::ascii_isspace(static_cast<unsigned char>(held_[keep_from - 1])))
          --keep_from;
        out.reasoning.append(held_, 0, keep_from);
        if (keep_from > 0) reasoning_started_ = true;
        held_.erase(0, keep_from);
        return out;
      }
      case State::kAnswer: {
        const size_t start = FirstNonSpace(held_);
        if (start == held_.size()) {
          held_.clear();
          return out;
        }
        held_.erase(0, start);
        state_ = State::kContent;
        continue;
      }
      case State::kContent:
        out.content += held_;
        held_.clear();
        return out;
    }
  }
}

ReasoningParts ReasoningSplitter::Finish() {
  ReasoningParts out;
  if (state_ == State::kStart) {
    out.content = std::move(held_);
  } else if (state_ == State::kReasoning) {
    // An unfinished block (the output was cut): all of it is reasoning.
    absl::string_view body = absl::StripTrailingAsciiWhitespace(held_);
    if (!reasoning_started_) body = absl::StripLeadingAsciiWhitespace(body);
    out.reasoning = std::string(body);
  }
  held_.clear();
  return out;
}

ReasoningParts ReasoningSplitter::Split(absl::string_view text, bool inside) {
  ReasoningSplitter splitter(inside);
  ReasoningParts out = splitter.Feed(text);
  ReasoningParts rest = splitter.Finish();
  out.reasoning += rest.reasoning;
  out.content += rest.content;
  return out;
}

}  // namespace tandem::router
