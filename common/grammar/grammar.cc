#include "common/grammar/grammar.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::grammar {
namespace {

std::array<uint64_t, 4> Words(const ByteSet& set) {
  std::array<uint64_t, 4> words = {};
  for (int b = 0; b < 256; ++b) {
    if (set[b]) words[b / 64] |= uint64_t{1} << (b % 64);
  }
  return words;
}

}  // namespace

ByteSet ByteRange(int lo, int hi) {
  ByteSet set;
  for (int b = lo; b <= hi; ++b) set.set(b);
  return set;
}

int32_t Grammar::NewRule() {
  rules_.emplace_back();
  labels_.emplace_back();
  return static_cast<int32_t>(rules_.size() - 1);
}

void Grammar::AddAlternative(int32_t rule, const Sequence& sequence) {
  rules_[rule].push_back(static_cast<int32_t>(elements_.size()));
  elements_.insert(elements_.end(), sequence.begin(), sequence.end());
  elements_.push_back({Kind::kEnd, 0});
}

Grammar::Element Grammar::Bytes(const ByteSet& set) {
  auto [it, inserted] =
      byte_set_index_.try_emplace(Words(set), static_cast<int32_t>(byte_sets_.size()));
  if (inserted) byte_sets_.push_back(set);
  return {Kind::kBytes, it->second};
}

Grammar::Element Grammar::Byte(uint8_t byte) {
  ByteSet set;
  set.set(byte);
  return Bytes(set);
}

void Grammar::AppendLiteral(std::string_view text, Sequence& out) {
  for (const char c : text) out.push_back(Byte(static_cast<uint8_t>(c)));
}

Grammar::Sequence Grammar::Literal(std::string_view text) {
  Sequence out;
  AppendLiteral(text, out);
  return out;
}

int32_t Grammar::Choice(std::initializer_list<Sequence> alternatives) {
  const int32_t rule = NewRule();
  for (const Sequence& s : alternatives) AddAlternative(rule, s);
  return rule;
}

int32_t Grammar::Optional(const Sequence& s) { return Choice({s, {}}); }

int32_t Grammar::Star(const Sequence& s) {
  const int32_t rule = NewRule();
  Sequence loop = s;
  loop.push_back(Ref(rule));
  AddAlternative(rule, loop);
  AddAlternative(rule, {});
  return rule;
}

void Grammar::set_label(int32_t rule, std::string label) { labels_[rule] = std::move(label); }

absl::Status Grammar::Validate() const {
  if (elements_.size() > static_cast<size_t>(kMaxElements)) {
    return absl::InvalidArgumentError(absl::StrCat("the grammar has ", elements_.size(),
                                                   " elements; at most ", kMaxElements,
                                                   " are served: simplify the schema"));
  }
  const int n = rule_count();
  if (root_ < 0 || root_ >= n) return absl::InvalidArgumentError("the grammar has no root rule");
  auto name = [&](int32_t r) {
    return labels_[r].empty() ? absl::StrCat("rule ", r) : absl::StrCat("`", labels_[r], "`");
  };
  for (int32_t r = 0; r < n; ++r) {
    if (rules_[r].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(name(r), " can match nothing"));
    }
  }
  for (const Element& e : elements_) {
    if (e.kind == Kind::kRule && (e.value < 0 || e.value >= n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("a reference names rule ", e.value, ", which does not exist"));
    }
  }
  // Nullable rules, to a fixed point.
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (int32_t pos : rules_[r]) {
        while (elements_[pos].kind == Kind::kRule && nullable[elements_[pos].value]) ++pos;
        if (elements_[pos].kind == Kind::kEnd) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }
  // Left edges: the rules an alternative can start with before any byte.
  std::vector<std::vector<int32_t>> left(n);
  for (int32_t r = 0; r < n; ++r) {
    for (int32_t pos : rules_[r]) {
      for (; elements_[pos].kind == Kind::kRule; ++pos) {
        left[r].push_back(elements_[pos].value);
        if (!nullable[elements_[pos].value]) break;
      }
    }
  }
  // A cycle among left edges is left recursion (iterative colouring DFS).
  std::vector<uint8_t> colour(n, 0);  // 0 new, 1 on the path, 2 done
  for (int32_t start = 0; start < n; ++start) {
    if (colour[start] != 0) continue;
    std::vector<std::pair<int32_t, size_t>> path = {{start, 0}};
    colour[start] = 1;
    while (!path.empty()) {
      auto& [r, next] = path.back();
      if (next == left[r].size()) {
        colour[r] = 2;
        path.pop_back();
        continue;
      }
      const int32_t to = left[r][next++];
      if (colour[to] == 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(name(to),
                         " refers to itself before any output: a schema that nests itself "
                         "must do so inside an object or array"));
      }
      if (colour[to] == 0) {
        colour[to] = 1;
        path.push_back({to, 0});
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::grammar
