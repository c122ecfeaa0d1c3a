#include "common/grammar/automaton.h"

#include <algorithm>
#include <utility>

namespace tandem::grammar {
namespace {

using Kind = Grammar::Kind;

// Expansion depth beyond which a chain of references is not followed (the
// grammar is not left recursive, so only a very deep nest reaches it).
constexpr int kMaxExpandDepth = 4 * kMaxStackDepth;

std::string Key(const std::vector<std::vector<int32_t>>& set) {
  std::string key;
  for (const auto& stack : set) {
    key.append(reinterpret_cast<const char*>(stack.data()), stack.size() * sizeof(int32_t));
    const int32_t separator = -1;
    key.append(reinterpret_cast<const char*>(&separator), sizeof separator);
  }
  return key;
}

}  // namespace

Automaton::Automaton(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  StackSet start;
  Expand({-(grammar_->root() + 1)}, start, 0);
  std::sort(start.begin(), start.end());
  start.erase(std::unique(start.begin(), start.end()), start.end());
  // The start state is state 0 even when the grammar matches nothing.
  State state;
  state.stacks = std::move(start);
  state.accepting = std::any_of(state.stacks.begin(), state.stacks.end(),
                                [](const Stack& s) { return s.empty(); });
  state.next.fill(kUnknown);
  index_.emplace(Key(state.stacks), 0);
  states_.push_back(std::move(state));
}

// Stack entries are element positions; the root is pushed as -(rule + 1), a
// reference with nothing after it.
void Automaton::Expand(Stack s, StackSet& out, int depth) const {
  if (depth > kMaxExpandDepth) return;
  if (s.empty()) {
    out.push_back(std::move(s));
    return;
  }
  const int32_t top = s.back();
  int32_t rule;
  if (top < 0) {
    rule = -top - 1;
    s.pop_back();
  } else {
    const Grammar::Element& e = grammar_->elements()[top];
    if (e.kind == Kind::kBytes) {
      out.push_back(std::move(s));
      return;
    }
    rule = e.value;
    s.pop_back();
    // What follows the reference, unless the alternative ends there (a tail
    // call: right recursion leaves the stack as it was).
    if (grammar_->elements()[top + 1].kind != Kind::kEnd) s.push_back(top + 1);
  }
  if (s.size() >= static_cast<size_t>(kMaxStackDepth)) return;
  for (const int32_t alt : grammar_->alternatives(rule)) {
    Stack next = s;
    if (grammar_->elements()[alt].kind != Kind::kEnd) next.push_back(alt);
    Expand(std::move(next), out, depth + 1);
  }
}

int32_t Automaton::Intern(StackSet set) {
  if (set.empty()) return kDeadState;
  std::sort(set.begin(), set.end());
  set.erase(std::unique(set.begin(), set.end()), set.end());
  std::string key = Key(set);
  if (auto it = index_.find(key); it != index_.end()) return it->second;
  if (states_.size() >= static_cast<size_t>(kMaxStates)) return kDeadState;
  const int32_t id = static_cast<int32_t>(states_.size());
  State state;
  state.stacks = std::move(set);
  state.accepting = std::any_of(state.stacks.begin(), state.stacks.end(),
                                [](const Stack& s) { return s.empty(); });
  state.next.fill(kUnknown);
  states_.push_back(std::move(state));
  index_.emplace(std::move(key), id);
  return id;
}

int32_t Automaton::Step(int32_t state, uint8_t byte) {
  if (state < 0) return kDeadState;
  if (const int32_t known = states_[state].next[byte]; known != kUnknown) return known;
  StackSet next;
  for (const Stack& stack : states_[state].stacks) {
    if (stack.empty()) continue;
    const Grammar::Element& e = grammar_->elements()[stack.back()];
    if (!grammar_->byte_set(e.value)[byte]) continue;
    Stack s = stack;
    const int32_t pos = s.back();
    s.pop_back();
    if (grammar_->elements()[pos + 1].kind != Kind::kEnd) s.push_back(pos + 1);
    Expand(std::move(s), next, 0);
  }
  const int32_t id = Intern(std::move(next));
  // states_ may have grown: index again.
  states_[state].next[byte] = id;
  return id;
}

}  // namespace tandem::grammar
